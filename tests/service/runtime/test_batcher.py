"""The dynamic batcher, with a fake model: gathering, limits, back-pressure, timeouts, failures and draining, for
coroutines and for blocking callers (threads, as the gRPC handlers)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np
import pytest

from service.core.errors import InferenceTimeout, Overloaded, ShuttingDown
from service.core.metrics import Metrics
from service.runtime.batcher import BatchingPolicy, CallCancelled, DynamicBatcher, Rows, Tensors
from service.runtime.slots import RunSlots

T = TypeVar("T")


class FakeModel:
    """Doubles its input; records batch sizes; `gate` holds a run until released."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: list[int] = []
        self.threads: list[str] = []  # the thread of each run
        self.gate = threading.Event()
        self.gate.set()
        self.fail_on = fail_on

    def __call__(self, inputs: Tensors) -> Tensors:
        self.gate.wait(5)
        x = inputs["x"]
        self.batches.append(len(x))
        self.threads.append(threading.current_thread().name)
        if self.fail_on is not None and self.fail_on in x:
            raise RuntimeError("poisoned batch")
        return {"y": 2 * x}


def run(
    scenario: Callable[[DynamicBatcher, FakeModel], Awaitable[T]], model: FakeModel | None = None, **policy: Any
) -> T:
    async def main() -> T:
        fake = model or FakeModel()
        settings = {"max_batch_size": 4, "max_queue_delay_s": 0.0, "max_queue_size": 100, "timeout_s": 5.0, **policy}
        batcher = DynamicBatcher("m", "g", fake, BatchingPolicy(**settings), RunSlots(1), Metrics())
        batcher.start()
        try:
            return await scenario(batcher, fake)
        finally:
            await batcher.close()

    return asyncio.run(main())


def rows(*values: float) -> Tensors:
    return {"x": np.array(values, np.float32)}


async def submit_while_blocked(batcher: DynamicBatcher, fake: FakeModel, requests: list[Tensors]) -> list[Tensors]:
    """One request occupies the model while `requests` queue up; then the model is released."""
    fake.gate.clear()
    first = asyncio.ensure_future(batcher.submit(rows(-1)))
    await asyncio.sleep(0.05)
    rest = [asyncio.ensure_future(batcher.submit(r)) for r in requests]
    await asyncio.sleep(0.05)
    fake.gate.set()
    await first
    return list(await asyncio.gather(*rest))


def test_requests_queued_during_a_run_form_one_batch() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        outs = await submit_while_blocked(batcher, fake, [rows(i) for i in range(3)])
        assert fake.batches == [1, 3]
        assert [o["y"].tolist() for o in outs] == [[0.0], [2.0], [4.0]]  # each caller gets its own rows

    run(scenario)


def test_callers_of_one_batch_share_it_and_what_is_derived_from_it() -> None:
    calls: list[int] = []

    def total(inputs: Tensors, outputs: Tensors) -> np.ndarray:
        calls.append(len(inputs["x"]))
        return np.cumsum(outputs["y"])  # a value that depends on the whole batch

    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        outs = await submit_while_blocked(batcher, fake, [rows(1, 2), rows(3)])
        assert fake.batches == [1, 3]
        assert all(isinstance(o, Rows) for o in outs)
        first, second = outs
        assert first.batch is second.batch  # one run, one shared result
        assert first.batch.inputs["x"].tolist() == [1.0, 2.0, 3.0]
        assert (first.rows, second.rows) == (slice(0, 2), slice(2, 3))
        assert first["y"].tolist() == [2.0, 4.0] and second["y"].tolist() == [6.0]
        derived = [o.batch.derived("total", total)[o.rows].tolist() for o in outs]
        assert derived == [[2.0, 6.0], [12.0]]
        assert calls == [3]  # computed once for both callers

    run(scenario)


def test_batches_respect_max_batch_size_and_multi_row_requests() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        requests = [rows(1, 2), rows(3), rows(4, 5), rows(6), rows(7, 8, 9)]
        outs = await submit_while_blocked(batcher, fake, requests)
        assert fake.batches == [1, 3, 3, 3]  # 2+1 | 2+1 | 3: a request is never split
        assert [o["y"].tolist() for o in outs] == [[2, 4], [6], [8, 10], [12], [14, 16, 18]]

    run(scenario)


def test_an_oversized_request_runs_alone() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        out = await batcher.submit(rows(*range(10)))
        assert fake.batches == [10] and out["y"].tolist() == [2.0 * i for i in range(10)]

    run(scenario)


def test_queue_delay_waits_for_company() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        first = asyncio.ensure_future(batcher.submit(rows(1)))
        await asyncio.sleep(0.02)
        second = asyncio.ensure_future(batcher.submit(rows(2)))
        await asyncio.gather(first, second)
        assert fake.batches == [2]

    run(scenario, max_queue_delay_s=0.3)


def test_a_full_batch_does_not_wait_for_the_delay() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        start = time.perf_counter()
        await asyncio.gather(*(batcher.submit(rows(i)) for i in range(4)))
        assert fake.batches == [4] and time.perf_counter() - start < 2.0

    run(scenario, max_queue_delay_s=5.0)


def test_full_queue_answers_overloaded_with_retry_after() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        fake.gate.clear()
        running = asyncio.ensure_future(batcher.submit(rows(0)))
        await asyncio.sleep(0.05)
        queued = [asyncio.ensure_future(batcher.submit(rows(i))) for i in (1, 2)]
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded) as info:
            await batcher.submit(rows(3))
        assert info.value.status == 503 and info.value.headers == {"Retry-After": "1"}
        assert str(info.value) == "model 'm' has 2 requests queued (limit 2, CAPSNET_MAX_QUEUE_SIZE); retry later"
        fake.gate.set()
        await asyncio.gather(running, *queued)

    run(scenario, max_queue_size=2)


def test_timeout_frees_the_caller_and_skips_its_work() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        fake.gate.clear()
        running = asyncio.ensure_future(batcher.submit(rows(0)))
        await asyncio.sleep(0.05)
        with pytest.raises(InferenceTimeout, match=r"inference on model 'm' did not finish within 0.2 s"):
            await batcher.submit(rows(1))
        fake.gate.set()
        with pytest.raises(InferenceTimeout):
            await running  # it too waited past the deadline
        assert (await batcher.submit(rows(5)))["y"].tolist() == [10.0]
        assert fake.batches == [1, 1]  # the timed-out queued request never ran

    run(scenario, timeout_s=0.2)


def test_a_failed_run_fails_its_callers_and_the_batcher_goes_on() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        with pytest.raises(RuntimeError, match="poisoned batch"):
            await batcher.submit(rows(13))
        assert (await batcher.submit(rows(1)))["y"].tolist() == [2.0]

    run(scenario, model=FakeModel(fail_on=13))


def test_a_batch_that_cannot_be_assembled_fails_only_its_callers() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        odd = {"x": np.zeros((1, 3), np.float32)}  # cannot be concatenated with the 1-D rows
        with pytest.raises(ValueError, match="dimensions"):
            await submit_while_blocked(batcher, fake, [rows(1), odd])
        assert (await asyncio.wait_for(batcher.submit(rows(2)), 2))["y"].tolist() == [4.0]  # the worker lives on
        assert batcher.depth == 0

    run(scenario)


def test_close_finishes_queued_work_then_refuses() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        fake.gate.clear()
        pending = [asyncio.ensure_future(batcher.submit(rows(i))) for i in range(6)]
        await asyncio.sleep(0.05)
        closing = asyncio.ensure_future(batcher.close())
        await asyncio.sleep(0.01)
        with pytest.raises(ShuttingDown, match="the service is shutting down"):
            await batcher.submit(rows(9))
        fake.gate.set()
        await closing
        assert [p.result()["y"].tolist() for p in pending] == [[2.0 * i] for i in range(6)]
        assert sum(fake.batches) == 6

    run(scenario)


async def in_thread(call: Callable[[], T]) -> T:
    """`call` on a thread of its own (as a gRPC handler), awaited."""
    return await asyncio.get_running_loop().run_in_executor(None, call)


def test_a_blocking_caller_on_an_idle_graph_runs_its_request_itself() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> tuple[Tensors, str]:
        def call() -> tuple[Tensors, str]:
            return batcher.submit_blocking(rows(3)), threading.current_thread().name

        return await in_thread(call)

    fake = FakeModel()
    out, caller = run(scenario, model=fake)
    assert out["y"].tolist() == [6.0]
    assert fake.threads == [caller]  # no hand-off to the worker thread


def test_blocking_callers_and_coroutines_share_batches() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> tuple[list[Tensors], list[Tensors]]:
        fake.gate.clear()
        first = asyncio.ensure_future(batcher.submit(rows(-1)))
        await asyncio.sleep(0.05)
        blocked = [asyncio.ensure_future(in_thread(lambda i=i: batcher.submit_blocking(rows(i)))) for i in (1, 2)]
        awaited = [asyncio.ensure_future(batcher.submit(rows(3)))]
        while batcher.depth < 3:
            await asyncio.sleep(0.01)
        fake.gate.set()
        await first
        return list(await asyncio.gather(*blocked)), list(await asyncio.gather(*awaited))

    fake = FakeModel()
    blocked, awaited = run(scenario, model=fake)
    assert fake.batches == [1, 3]
    assert fake.threads == ["batcher-m-g", "batcher-m-g"]  # the graph was busy: the worker ran them
    assert [o["y"].tolist() for o in blocked] == [[2.0], [4.0]] and awaited[0]["y"].tolist() == [6.0]


def test_with_a_queue_delay_blocking_callers_wait_for_company() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        first = asyncio.ensure_future(in_thread(lambda: batcher.submit_blocking(rows(1))))
        await asyncio.sleep(0.02)
        await asyncio.gather(first, batcher.submit(rows(2)))
        assert fake.batches == [2]

    run(scenario, max_queue_delay_s=0.3)


def test_blocking_callers_get_the_same_errors() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        fake.gate.clear()
        running = asyncio.ensure_future(batcher.submit(rows(0)))
        await asyncio.sleep(0.05)
        queued = asyncio.ensure_future(batcher.submit(rows(1)))
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded, match=r"model 'm' has 1 requests queued \(limit 1, CAPSNET_MAX_QUEUE_SIZE\)"):
            await in_thread(lambda: batcher.submit_blocking(rows(2)))
        fake.gate.set()
        await asyncio.gather(running, queued)
        with pytest.raises(RuntimeError, match="poisoned batch"):
            await in_thread(lambda: batcher.submit_blocking(rows(13)))

    run(scenario, model=FakeModel(fail_on=13), max_queue_size=1)


def test_a_blocking_caller_times_out_and_its_work_is_skipped() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        fake.gate.clear()
        running = asyncio.ensure_future(batcher.submit(rows(0)))
        await asyncio.sleep(0.05)
        with pytest.raises(InferenceTimeout, match=r"inference on model 'm' did not finish within 0.2 s"):
            await in_thread(lambda: batcher.submit_blocking(rows(1)))
        fake.gate.set()
        with pytest.raises(InferenceTimeout):
            await running
        assert (await batcher.submit(rows(5)))["y"].tolist() == [10.0]
        assert fake.batches == [1, 1]

    run(scenario, timeout_s=0.2)


def test_a_cancelled_blocking_call_frees_its_thread_and_is_skipped() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        fake.gate.clear()
        running = asyncio.ensure_future(batcher.submit(rows(0)))
        await asyncio.sleep(0.05)
        cancel: list[Callable[[], None]] = []
        blocked = asyncio.ensure_future(in_thread(lambda: batcher.submit_blocking(rows(1), cancel.append)))
        while not cancel:
            await asyncio.sleep(0.01)
        cancel[0]()  # what gRPC does when the client cancels the call
        with pytest.raises(CallCancelled, match="the call to model 'm' ended before its outputs were ready"):
            await blocked
        fake.gate.set()
        await running
        assert (await batcher.submit(rows(5)))["y"].tolist() == [10.0]
        assert fake.batches == [1, 1]  # the cancelled request never ran

    run(scenario)


def test_graphs_sharing_one_slot_never_run_at_once() -> None:
    active, most = 0, 0
    guard = threading.Lock()

    def model(inputs: Tensors) -> Tensors:
        nonlocal active, most
        with guard:
            active += 1
            most = max(most, active)
        time.sleep(0.01)
        with guard:
            active -= 1
        return {"y": inputs["x"]}

    async def main() -> None:
        slots, policy = RunSlots(1), BatchingPolicy(1, 0.0, 100, 5.0)
        batchers = [DynamicBatcher("m", g, model, policy, slots, Metrics(), narrow=model) for g in ("a", "b")]
        for b in batchers:
            b.start()
        await asyncio.gather(*(b.submit(rows(i)) for i in range(8) for b in batchers))
        await asyncio.gather(*(in_thread(lambda b=b: b.submit_blocking(rows(1))) for b in batchers))
        for b in batchers:
            await b.close()

    asyncio.run(main())
    assert most == 1


def test_a_lone_callers_runs_keep_one_worker_thread() -> None:
    """With a worker per run slot, requests one at a time are all run by the worker that ran the last one (a new
    calling thread each run cost ONNX Runtime's parallel sections a shared core); under load both workers run."""
    fake = FakeModel()

    async def main() -> None:
        policy = BatchingPolicy(1, 0.0, 100, 5.0)
        batcher = DynamicBatcher("m", "g", fake, policy, RunSlots(2), Metrics(), narrow=fake)
        batcher.start()
        try:
            for i in range(12):
                await batcher.submit(rows(i))
            assert len(set(fake.threads)) == 1, fake.threads
            fake.gate.clear()
            pending = [asyncio.ensure_future(batcher.submit(rows(i))) for i in range(6)]
            await asyncio.sleep(0.05)
            fake.gate.set()
            await asyncio.gather(*pending)
            assert len(set(fake.threads[12:])) == 2, fake.threads[12:]
        finally:
            await batcher.close()

    asyncio.run(main())


def test_a_worker_that_dies_on_its_way_back_does_not_strand_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker counts itself on its way back from a run (so no other is woken for the next request); should it die
    there (a bug in delivering), the other worker is woken for what is queued instead."""
    fake = FakeModel()
    deliver, died = DynamicBatcher._deliver, threading.Event()

    def deliver_once_then_die(results: Any) -> None:
        deliver(results)
        if not died.is_set():
            died.set()
            raise RuntimeError("a bug while delivering")

    monkeypatch.setattr(DynamicBatcher, "_deliver", staticmethod(deliver_once_then_die))
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the dying worker's traceback

    async def main() -> None:
        batcher = DynamicBatcher("m", "g", fake, BatchingPolicy(1, 0.0, 100, 2.0), RunSlots(2), Metrics(), narrow=fake)
        batcher.start()
        try:
            await batcher.submit(rows(1))
            assert died.wait(2)
            await asyncio.sleep(0.05)
            results = [await batcher.submit(rows(i)) for i in range(3)]
            assert [float(r["y"][0]) for r in results] == [0.0, 2.0, 4.0]
        finally:
            await batcher.close()

    asyncio.run(main())


def test_a_lone_request_runs_on_its_event_loop_only_when_nothing_else_is_in_flight() -> None:
    """`alone`: one image, with the graph and every slot idle and no other request in progress, runs on the event
    loop itself (no hand-off to a worker); otherwise (not alone, two images, another request in progress, or a run
    holding a slot) it goes to a worker as always."""
    fake = FakeModel()

    async def main() -> None:
        slots = RunSlots(2)
        batcher = DynamicBatcher("m", "g", fake, BatchingPolicy(4, 0.0, 100, 5.0), slots, Metrics(), narrow=fake)
        batcher.start()
        loop = threading.current_thread().name
        try:
            with slots.activity.request():  # the request itself, as ServiceMiddleware counts it
                assert (await batcher.submit(rows(1), alone=True))["y"].tolist() == [2.0]
                assert fake.threads == [loop]
                await batcher.submit(rows(1))  # not alone
                await batcher.submit(rows(1, 2), alone=True)  # more than one image
                with slots.activity.request():  # another request in progress (an HTTP route or a gRPC call)
                    await batcher.submit(rows(1), alone=True)
                assert loop not in fake.threads[1:], fake.threads
                with slots.run(True, lambda: True):  # another graph's run holds a slot
                    await batcher.submit(rows(1), alone=True)
                assert loop not in fake.threads[1:], fake.threads
                assert len(fake.threads) == 5
        finally:
            await batcher.close()

    asyncio.run(main())


def test_a_lone_request_queues_behind_a_running_batch_rather_than_beside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread may run beside a worker's batch, but the event loop does not: it would be blocked for the whole
    run while the batch's callers wait for it to take their results. Here the slots look quiet (as in the moment
    before a worker takes its slots), and the batch being run still keeps the request off the loop."""
    fake = FakeModel()

    async def main() -> None:
        slots = RunSlots(2)
        batcher = DynamicBatcher("m", "g", fake, BatchingPolicy(4, 0.0, 100, 5.0), slots, Metrics(), narrow=fake)
        batcher.start()
        try:
            fake.gate.clear()
            first = asyncio.ensure_future(batcher.submit(rows(1)))
            await asyncio.sleep(0.05)
            monkeypatch.setattr(slots, "quiet", lambda: True)
            second = asyncio.ensure_future(batcher.submit(rows(2), alone=True))
            await asyncio.sleep(0.05)
            assert not second.done()  # queued, not run on the loop (it would hang on the gate)
            fake.gate.set()
            assert (await second)["y"].tolist() == [4.0] and (await first)["y"].tolist() == [2.0]
            assert threading.current_thread().name not in fake.threads
        finally:
            await batcher.close()

    asyncio.run(main())


def test_a_lone_request_on_a_closing_batcher_is_refused() -> None:
    async def scenario(batcher: DynamicBatcher, fake: FakeModel) -> None:
        await batcher.close()
        with pytest.raises(ShuttingDown):
            await batcher.submit(rows(1), alone=True)

    run(scenario)
