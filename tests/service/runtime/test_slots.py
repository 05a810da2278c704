"""RunSlots: a lone run takes every slot (wide), runs under load one slot each (narrow), wide-only runs are not
starved; and the batcher built on it runs batches side by side on the narrow session."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import numpy as np
import pytest
from prometheus_client import generate_latest

from service.core.metrics import Metrics
from service.runtime.batcher import BatchingPolicy, DynamicBatcher, Tensors
from service.runtime.slots import RunSlots


class Holder(threading.Thread):
    """Holds slots in a thread until released; records whether its run was wide."""

    def __init__(self, slots: RunSlots, can_narrow: bool = True) -> None:
        super().__init__(daemon=True)
        self.slots, self.can_narrow = slots, can_narrow
        self.entered, self.release = threading.Event(), threading.Event()
        self.wide: bool | None = None

    def run(self) -> None:
        with self.slots.run(self.can_narrow) as wide:
            self.wide = wide
            self.entered.set()
            self.release.wait(5)

    def finish(self) -> None:
        self.release.set()
        self.join(5)


def wait_for(condition: object, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.002)


def test_slots_must_be_positive() -> None:
    with pytest.raises(ValueError, match="slots must be at least 1, got 0"):
        RunSlots(0)


def test_a_lone_run_is_wide_and_holds_every_slot() -> None:
    slots = RunSlots(2)
    with slots.run(can_narrow=True) as wide:
        assert wide and slots.free == 0
    assert slots.free == 2


def test_a_run_arriving_during_a_wide_run_waits_then_runs_narrow_beside_another() -> None:
    slots = RunSlots(2)
    first = Holder(slots)
    first.start()
    assert first.entered.wait(5) and first.wide
    second, third = Holder(slots), Holder(slots)
    second.start()
    third.start()
    time.sleep(0.05)
    assert not second.entered.is_set() and not third.entered.is_set()  # the wide run holds every slot
    first.finish()
    assert second.entered.wait(5) and third.entered.wait(5)  # then both at once, one slot each
    assert second.wide is False and third.wide is False
    assert slots.free == 0
    second.finish()
    third.finish()
    assert slots.free == 2


def test_with_one_slot_every_run_is_wide_and_they_take_turns() -> None:
    slots = RunSlots(1)
    first, second = Holder(slots), Holder(slots)
    first.start()
    assert first.entered.wait(5)
    second.start()
    time.sleep(0.05)
    assert not second.entered.is_set()
    first.finish()
    assert second.entered.wait(5) and second.wide is True
    second.finish()


def test_a_run_that_needs_every_slot_is_not_starved_by_narrow_runs() -> None:
    slots = RunSlots(2)
    narrow = [Holder(slots), Holder(slots)]
    blocker = Holder(slots)  # wide at first, so the two narrow ones queue behind it together
    blocker.start()
    assert blocker.entered.wait(5)
    for h in narrow:
        h.start()
    time.sleep(0.05)
    blocker.finish()
    for h in narrow:
        assert h.entered.wait(5) and h.wide is False
    wide_only = Holder(slots, can_narrow=False)
    wide_only.start()
    time.sleep(0.05)
    narrow[0].finish()  # a slot frees, but a newcomer must not take it while the wide-only run waits
    late = Holder(slots)
    late.start()
    time.sleep(0.05)
    assert not late.entered.is_set() and not wide_only.entered.is_set()
    narrow[1].finish()
    assert wide_only.entered.wait(5) and wide_only.wide is True
    wide_only.finish()
    assert late.entered.wait(5)
    late.finish()


class TwoSessions:
    """A wide and a narrow fake session: record which ran each batch and how many ran at once."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.active = 0
        self.most = 0
        self.calls: list[tuple[str, int]] = []
        self._guard = threading.Lock()

    def session(self, name: str) -> object:
        def run(inputs: Tensors) -> Tensors:
            with self._guard:
                self.active += 1
                self.most = max(self.most, self.active)
                self.calls.append((name, len(inputs["x"])))
            self.gate.wait(5)
            time.sleep(0.02)
            with self._guard:
                self.active -= 1
            return {"y": 2 * inputs["x"]}

        return run


def test_under_load_batches_run_side_by_side_on_the_narrow_session() -> None:
    fakes = TwoSessions()

    async def main() -> list[Tensors]:
        slots = RunSlots(2)
        metrics = Metrics()
        batcher = DynamicBatcher(
            "m", "g", fakes.session("wide"), BatchingPolicy(4, 0.0, 100, 5.0), slots, metrics, fakes.session("narrow")
        )
        batcher.start()
        try:
            lone = await batcher.submit({"x": np.array([1.0], np.float32)})
            assert lone["y"].tolist() == [2.0]
            fakes.gate.clear()  # the first run holds while more requests queue
            first = asyncio.ensure_future(batcher.submit({"x": np.array([0.0], np.float32)}))
            await asyncio.sleep(0.05)
            rest = [asyncio.ensure_future(batcher.submit({"x": np.array([float(i)], np.float32)})) for i in range(12)]
            await asyncio.sleep(0.05)
            fakes.gate.set()
            await first
            out = list(await asyncio.gather(*rest))
            text = generate_latest(metrics.registry).decode()
            assert 'capsnet_runs_total{graph="g",lane="narrow",model="m",version="1"}' in text
            return out
        finally:
            await batcher.close()

    outputs = asyncio.run(main())
    assert [o["y"].tolist() for o in outputs] == [[2.0 * i] for i in range(12)]
    assert fakes.calls[0] == ("wide", 1)  # alone: every thread
    assert fakes.most == 2  # under load: two runs at once
    assert any(name == "narrow" for name, _ in fakes.calls)
    assert all(rows <= 4 for _, rows in fakes.calls)


def test_without_a_narrow_session_runs_take_turns_on_the_wide_one() -> None:
    fakes = TwoSessions()

    async def main() -> None:
        batcher = DynamicBatcher(
            "m", "g", fakes.session("wide"), BatchingPolicy(2, 0.0, 100, 5.0), RunSlots(2), Metrics()
        )
        batcher.start()
        await asyncio.gather(*(batcher.submit({"x": np.array([float(i)], np.float32)}) for i in range(10)))
        await batcher.close()

    asyncio.run(main())
    assert fakes.most == 1 and {name for name, _ in fakes.calls} == {"wide"}


def test_close_drains_every_worker() -> None:
    fakes = TwoSessions()

    async def main() -> list[Tensors]:
        batcher = DynamicBatcher(
            "m",
            "g",
            fakes.session("wide"),
            BatchingPolicy(1, 0.0, 100, 5.0),
            RunSlots(2),
            Metrics(),
            fakes.session("n"),
        )
        batcher.start()
        pending = [asyncio.ensure_future(batcher.submit({"x": np.array([float(i)], np.float32)})) for i in range(8)]
        await asyncio.sleep(0)
        await batcher.close()
        return list(await asyncio.gather(*pending))

    assert [o["y"].tolist() for o in asyncio.run(main())] == [[2.0 * i] for i in range(8)]


def test_with_two_workers_a_full_batch_still_ends_the_queue_delay_early() -> None:
    fakes = TwoSessions()

    async def main() -> float:
        policy = BatchingPolicy(4, 2.0, 100, 5.0)  # a long delay: only a full batch ends it sooner
        batcher = DynamicBatcher("m", "g", fakes.session("w"), policy, RunSlots(2), Metrics(), fakes.session("n"))
        batcher.start()
        start = time.perf_counter()
        try:
            pending = []
            for i in range(4):
                pending.append(asyncio.ensure_future(batcher.submit({"x": np.array([float(i)], np.float32)})))
                await asyncio.sleep(0.01)
            await asyncio.gather(*pending)
            return time.perf_counter() - start
        finally:
            await batcher.close()

    assert asyncio.run(main()) < 1.0
    assert [rows for _, rows in fakes.calls] == [4]


def test_a_run_whose_graph_has_more_work_coming_runs_narrow_even_alone() -> None:
    slots = RunSlots(2)
    with slots.run(can_narrow=True, more_work=lambda: True) as wide:
        assert not wide and slots.free == 1


def test_activity_counts_requests_in_progress_even_when_they_fail() -> None:
    slots = RunSlots(2)
    with slots.activity.request(), slots.activity.request():
        assert slots.activity.count == 2
    with pytest.raises(RuntimeError), slots.activity.request():
        assert slots.activity.count == 1
        raise RuntimeError("the request failed")
    assert slots.activity.count == 0


@pytest.mark.parametrize(("others", "lane"), [(0, "wide"), (1, "narrow")])
def test_a_lone_batch_runs_narrow_while_other_requests_are_in_progress(others: int, lane: str) -> None:
    """Under load a worker often finds the queue empty while the next requests are still being read: the
    service's requests in progress (`Activity`) keep its run narrow, so the other cores stay for them."""
    fakes = TwoSessions()

    async def main() -> None:
        slots = RunSlots(2)
        batcher = DynamicBatcher(
            "m", "g", fakes.session("wide"), BatchingPolicy(4, 0.0, 100, 5.0), slots, Metrics(), fakes.session("narrow")
        )
        batcher.start()
        try:
            with contextlib.ExitStack() as stack:
                for _ in range(1 + others):  # this request, and the others the front end is handling
                    stack.enter_context(slots.activity.request())
                await batcher.submit({"x": np.array([1.0], np.float32)})
        finally:
            await batcher.close()

    asyncio.run(main())
    assert fakes.calls == [(lane, 1)]


def test_quiet_only_with_every_slot_free_nothing_waiting_and_at_most_the_askers_request() -> None:
    slots = RunSlots(2)
    assert slots.quiet()
    with slots.activity.request():
        assert slots.quiet()  # the asker's own request
        with slots.activity.request():
            assert not slots.quiet()
    with slots.run(can_narrow=True, more_work=lambda: True):  # one narrow run: one slot held
        assert not slots.quiet()
    assert slots.quiet()
