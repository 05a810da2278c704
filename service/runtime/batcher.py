"""Dynamic batching: concurrent requests for one graph are gathered into one ONNX Runtime run.

A worker thread takes every request queued while the previous runs were busy (up to `max_batch_size` rows),
optionally waits up to `max_queue_delay` for more, runs the batch and hands each caller its rows. Under load the
batches grow by themselves; an idle service runs a lone request at once.

A graph with a single-thread ("narrow") session beside its wide one has a worker per run slot (`RunSlots`): a
lone batch runs on the wide session with every thread, while under load the workers run batches side by side,
one thread each. One worker gathers at a time, so the batches still take everything queued. A request wakes the
worker that went idle last (or none, when one is on its way back from a run), so a lone caller's runs keep one
calling thread, and idle workers are woken only for queued requests.

Requests come from any thread: coroutines on any event loop (`submit`, the HTTP routes; a batch's results go
back to each loop in one `call_soon_threadsafe`), or threads that block (`submit_blocking`, the gRPC handlers).
A blocking caller that finds the graph idle, nothing queued and no queue delay to wait for, runs its request
itself rather than handing it to the worker and waiting to be woken. An event loop runs a request itself only
when it is the service's only request (`submit(..., alone=True)`, one image, the graph and every run slot idle):
under load the loop never waits for a run, it only queues requests and takes results.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar, cast

import numpy as np

from service.core.errors import InferenceTimeout, Overloaded, ShuttingDown
from service.core.metrics import Metrics
from service.runtime.slots import RunSlots

logger = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]
T = TypeVar("T")
RunFn = Callable[[Tensors], Tensors]
Outcome = Tensors | BaseException  # a caller's rows of the outputs, or why its batch failed
CancelHook = Callable[[Callable[[], None]], object]  # registers what to call if the caller's call ends early
# The most rows a lone request may have to run on its event loop (`submit`'s `alone`): one image, a couple of
# milliseconds of blocked loop on a CPU, while nothing else is in flight to be kept waiting.
LOOP_RUN_ROWS = 1


class BatchResult:
    """One run's whole inputs and outputs, shared by the callers whose rows it holds.

    `derived` computes a value from the whole batch once (the first caller to ask pays, the others reuse it), so
    per-image post-processing in numpy costs one vectorised call per batch instead of one per request.
    """

    def __init__(self, inputs: Tensors, outputs: Tensors) -> None:
        self.inputs, self.outputs = inputs, outputs
        self._derived: dict[str, object] = {}
        self._lock = threading.Lock()

    def derived(self, key: str, compute: Callable[[Tensors, Tensors], T]) -> T:
        """`compute(inputs, outputs)` of the whole batch, computed by the first caller to ask for `key`; every
        caller gets that same object, so it must not be changed in place (make arrays read-only)."""
        with self._lock:
            if key not in self._derived:
                self._derived[key] = compute(self.inputs, self.outputs)
            return cast(T, self._derived[key])


class Rows(dict[str, np.ndarray]):
    """A caller's rows of every output of a batch (a plain `Tensors` to everyone else), with the batch they came
    from: `batch` and `rows`, the caller's slice of its leading axis."""

    def __init__(self, batch: BatchResult, rows: slice) -> None:
        super().__init__((name, values[rows]) for name, values in batch.outputs.items())
        self.batch, self.rows = batch, rows


class CallCancelled(Exception):
    """A blocking caller's call ended (e.g. a gRPC client cancelled it) before its outputs were ready."""


class LoopWaiter:
    """A caller awaiting on an event loop: its future, resolved on that loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.future: asyncio.Future[Tensors] = self.loop.create_future()

    def abandoned(self) -> bool:
        """Timed out or cancelled (read from the worker thread: at worst a finished caller's rows are computed)."""
        return self.future.done()


class ThreadWaiter:
    """A caller blocked in `submit_blocking` until its outcome is set (or it gives up)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.outcome: Outcome | None = None
        self.gave_up = False

    def abandoned(self) -> bool:
        return self.gave_up

    def resolve(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self.event.set()

    def abandon(self) -> None:
        """The caller is gone (its call was cancelled): skip its rows if still queued, and free its thread."""
        self.gave_up = True
        self.event.set()


Waiter = LoopWaiter | ThreadWaiter


@dataclass(eq=False)
class _Request:
    inputs: Tensors
    rows: int
    waiter: Waiter
    enqueued: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True)
class BatchingPolicy:
    max_batch_size: int
    max_queue_delay_s: float
    max_queue_size: int
    timeout_s: float


def _resolve_futures(results: list[tuple[asyncio.Future[Tensors], Outcome]]) -> None:
    """On the callers' event loop: hand each caller still waiting its outcome."""
    for future, outcome in results:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


class DynamicBatcher:
    """Gathers the requests for one graph (`run`: inputs -> outputs, batch-major) into batched runs.

    Every run holds slots of `slots`, one budget for every graph of the service: a wide run (`run`, every
    intra-op thread) holds them all; with `narrow` (the same graph on a single-thread session) runs under load
    hold one each and run side by side, a worker thread per slot.
    """

    def __init__(
        self,
        model: str,
        graph: str,
        run: RunFn,
        policy: BatchingPolicy,
        slots: RunSlots,
        metrics: Metrics,
        narrow: RunFn | None = None,
        version: str = "1",
    ) -> None:
        self.model, self.graph, self._run_fn, self.policy = model, graph, run, policy
        self.version = version
        self._narrow_fn = narrow if slots.slots > 1 else None
        self._slots = slots
        self._workers = slots.slots if self._narrow_fn is not None else 1
        self._lock = threading.Lock()  # guards the queue, `_gathering`, `_running`, `_closing` and `_idle`
        self._changed = threading.Condition(self._lock)  # a gathering worker waits on it for more requests
        # The idle workers' wake-ups, the most recently idle last: a request wakes that one, so a lone caller's
        # runs keep one calling thread. Runs from alternating threads were slower: the scheduler placed the new
        # caller on the core of ONNX Runtime's pool thread, and each run's first parallel sections shared a core.
        self._idle: list[threading.Condition] = []
        self._returning = 0  # workers between the end of a run and their next look at the queue
        self._queue: deque[_Request] = deque()
        self._gathering = False  # a worker is taking and filling a batch
        self._running = 0  # batches being run (by the workers or inline callers)
        self._closing = False
        self._threads: list[threading.Thread] = []
        labels = {"model": model, "version": version, "graph": graph}
        self._m_depth = metrics.queue_depth.labels(**labels)
        self._m_queue = metrics.queue_time.labels(**labels)
        self._m_compute = metrics.compute_time.labels(**labels)
        self._m_batch = metrics.batch_size.labels(**labels)
        self._m_rows = metrics.inferences.labels(**labels)
        self._m_runs = {
            wide: metrics.runs.labels(**labels, lane="wide" if wide else "narrow") for wide in (True, False)
        }

    def start(self) -> None:
        """Start the worker threads."""
        if self._threads:
            return
        for i in range(self._workers):
            name = f"batcher-{self.model}-{self.graph}" + (f"-{i}" if i else "")
            self._threads.append(threading.Thread(target=self._work, name=name, daemon=True))
            self._threads[-1].start()

    @property
    def depth(self) -> int:
        return len(self._queue)

    async def submit(self, inputs: Tensors, alone: bool = False) -> Tensors:
        """Queue one request (every input has the same leading batch dimension) and await its outputs.

        `alone`: the caller knows of no other request in the service (service.api.fastpath: uvicorn has read no
        other HTTP request). A request of at most LOOP_RUN_ROWS rows then runs here, on the event loop, when no gRPC
        call is in progress, nothing is queued or running for this graph and every run slot is free: at concurrency
        1 the hand-off to a worker thread and back cost about 0.1 ms of each request's p50
        (docs/serving-performance.md, session 13). The loop is blocked for that one run, to which the timeout does
        not apply (nobody else is waiting); anything that arrives meanwhile is read right after it and, the service
        no longer idle, queued as usual.
        """
        waiter = LoopWaiter()
        request = _Request(inputs, _rows(inputs), waiter)
        if self._enqueue(request, inline=alone and request.rows <= LOOP_RUN_ROWS and self._slots.quiet(), loop=True):
            return self._run_inline(request)
        expiry = waiter.loop.call_later(self.policy.timeout_s, self._expire, waiter.future)
        try:
            return await waiter.future
        finally:
            expiry.cancel()

    def submit_blocking(self, inputs: Tensors, on_cancel: CancelHook | None = None) -> Tensors:
        """Queue one request and block until its outputs; run it in this thread when the graph is idle.

        `on_cancel` registers a callback for when the caller's call ends early (gRPC's `context.add_callback`):
        the request is then skipped if still queued, and this thread returns at once.
        """
        waiter = ThreadWaiter()
        request = _Request(inputs, _rows(inputs), waiter)
        if self._enqueue(request, inline=True, loop=False):
            return self._run_inline(request)
        if on_cancel is not None:
            on_cancel(waiter.abandon)
        if not waiter.event.wait(self.policy.timeout_s):
            waiter.gave_up = True
            raise self._timeout()
        if isinstance(waiter.outcome, BaseException):
            raise waiter.outcome
        if waiter.outcome is None:  # abandoned when the call ended: nobody reads what this raises
            raise CallCancelled(f"the call to model {self.model!r} ended before its outputs were ready")
        return waiter.outcome

    async def close(self) -> None:
        """Stop taking requests, finish every queued one, then stop the workers."""
        with self._changed:
            self._closing = True
            self._wake_all()
        for thread in self._threads:
            await asyncio.get_running_loop().run_in_executor(None, thread.join)

    def _enqueue(self, request: _Request, inline: bool, loop: bool) -> bool:
        """Queue `request`; True instead when `inline` and the graph is idle: the caller runs it itself. An event
        `loop` runs it only when no batch of the graph is running either (a thread may run beside a worker's)."""
        with self._changed:
            if self._closing:
                raise ShuttingDown("the service is shutting down")
            idle = inline and self._idle_slot() and not (loop and self._running)
            if idle and not self._queue and not self.policy.max_queue_delay_s:
                self._running += 1
                return True
            if len(self._queue) >= self.policy.max_queue_size:
                raise Overloaded(
                    f"model {self.model!r} has {len(self._queue)} requests queued "
                    f"(limit {self.policy.max_queue_size}, CAPSNET_MAX_QUEUE_SIZE); retry later"
                )
            self._queue.append(request)
            self._m_depth.set(len(self._queue))
            if self._gathering:  # the gatherer may be waiting for company
                self._wake_all()
            elif self._idle and not self._returning:  # a returning worker takes the request itself
                self._idle.pop().notify()
        return False

    def _timeout(self) -> InferenceTimeout:
        return InferenceTimeout(f"inference on model {self.model!r} did not finish within {self.policy.timeout_s:g} s")

    def _expire(self, future: asyncio.Future[Tensors]) -> None:
        if not future.done():
            future.set_exception(self._timeout())

    def _more_work(self, callers: int) -> bool:
        """Requests are queued, a batch is being gathered, or the service is handling requests beyond the `callers`
        of the run that asks (read unlocked by `RunSlots`: a hint)."""
        return bool(self._queue) or self._gathering or self._slots.activity.count > callers

    def _idle_slot(self) -> bool:
        """No batch is being gathered and a worker's share of the slots is unused (holding `_changed`)."""
        return not self._gathering and self._running < self._workers

    def _run_inline(self, request: _Request) -> Tensors:
        try:
            ((_, outcome),) = self._execute([request])
        finally:
            with self._changed:
                self._running -= 1
                self._wake_for_queued()  # requests queued meanwhile are the workers'
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _work(self) -> None:
        wake, returning = threading.Condition(self._lock), False
        try:
            while (batch := self._next_batch(wake, returning)) is not None:
                returning = False  # `_next_batch` has counted this worker back
                results: list[tuple[_Request, Outcome]] = []
                try:
                    live = [r for r in batch if not r.waiter.abandoned()]
                    results = self._execute(live) if live else []
                finally:
                    with self._changed:  # this worker comes back for what is queued: nobody else need be woken
                        self._running -= 1
                        self._returning += 1
                        returning = True
                self._deliver(results)
            returning = False
        finally:
            if returning:  # a worker that stops on its way back must not keep the others from being woken
                with self._changed:
                    self._returning -= 1
                    self._wake_for_queued()

    def _wake_for_queued(self) -> None:
        """Wake the waiting workers when requests are queued (holding `_changed`), now that a slot or the gathering
        is free. With nothing queued there is nothing for them to do: a woken worker would only take a core from
        ONNX Runtime's threads in the middle of a run's parallel sections (docs/serving-performance.md, session
        12). A new request's `_enqueue` wakes a worker itself."""
        if self._queue:
            self._wake_all()

    def _wake_all(self) -> None:
        """Wake every idle worker and the gathering one (holding `_changed`)."""
        while self._idle:
            self._idle.pop().notify()
        self._changed.notify_all()

    def _next_batch(self, wake: threading.Condition, returning: bool) -> list[_Request] | None:
        """Wait (on `wake`, the worker's own) for queued requests and a free slot, take a batch and fill it; None
        once closed and empty. `returning`: the worker counted in `_returning` after its last run."""
        with self._changed:
            self._returning -= returning
            while not (self._queue and self._idle_slot()):
                if self._closing and not self._queue:
                    return None
                self._idle.append(wake)
                try:
                    wake.wait()
                finally:
                    if wake in self._idle:  # a notify pops it; only an interrupted wait leaves it here
                        self._idle.remove(wake)
            self._gathering = True
            try:
                batch = self._take([])
                self._fill(batch)
            finally:
                self._gathering = False
            self._running += 1
            self._wake_for_queued()  # another worker may take what the batch left behind
            return batch

    def _take(self, batch: list[_Request]) -> list[_Request]:
        """Move queued requests into `batch` while they fit; an oversized lone request runs alone."""
        rows = sum(r.rows for r in batch)
        while self._queue:
            head = self._queue[0]
            if head.waiter.abandoned():  # timed out while queued
                self._queue.popleft()
                continue
            if batch and rows + head.rows > self.policy.max_batch_size:
                break
            batch.append(self._queue.popleft())
            rows += head.rows
        self._m_depth.set(len(self._queue))
        return batch

    def _fill(self, batch: list[_Request]) -> None:
        """Wait (holding `_changed`) until the oldest request has waited `max_queue_delay` or the batch is full."""
        if not batch:
            return
        deadline = batch[0].enqueued + self.policy.max_queue_delay_s
        while not self._closing and sum(r.rows for r in batch) < self.policy.max_batch_size:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._changed.wait(remaining)
            self._take(batch)

    def _execute(self, live: list[_Request]) -> list[tuple[_Request, Outcome]]:
        """Run the requests as one batch; each request with its rows of the outputs, or with the batch's error."""
        started = time.perf_counter()
        for r in live:
            self._m_queue.observe(started - r.enqueued)
        rows = sum(r.rows for r in live)
        try:  # anything that fails here fails this batch's callers only, never the worker
            names = live[0].inputs.keys()
            inputs = {
                k: np.concatenate([r.inputs[k] for r in live]) if len(live) > 1 else live[0].inputs[k] for k in names
            }
            with self._slots.run(self._narrow_fn is not None, lambda: self._more_work(len(live))) as wide:
                start = time.perf_counter()
                outputs = self._run_fn(inputs) if wide or self._narrow_fn is None else self._narrow_fn(inputs)
                seconds = time.perf_counter() - start
        except Exception as e:
            logger.exception("batch of %d rows on %s/%s failed", rows, self.model, self.graph)
            return [(r, e) for r in live]
        self._m_runs[wide].inc()
        self._m_compute.observe(seconds)
        self._m_batch.observe(rows)
        self._m_rows.inc(rows)
        shared = BatchResult(inputs, outputs)
        results: list[tuple[_Request, Outcome]] = []
        offset = 0
        for r in live:
            results.append((r, Rows(shared, slice(offset, offset + r.rows))))
            offset += r.rows
        return results

    @staticmethod
    def _deliver(results: list[tuple[_Request, Outcome]]) -> None:
        """Wake the blocked callers; hand the awaiting ones their outcomes in one callback per event loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Tensors], Outcome]]] = {}
        for request, outcome in results:
            waiter = request.waiter
            if isinstance(waiter, ThreadWaiter):
                waiter.resolve(outcome)
            else:
                by_loop.setdefault(waiter.loop, []).append((waiter.future, outcome))
        for loop, outcomes in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve_futures, outcomes)
            except RuntimeError:  # that loop has closed: its callers are gone
                logger.debug("dropping %d results for a closed event loop", len(outcomes))


def _rows(inputs: Tensors) -> int:
    return int(next(iter(inputs.values())).shape[0])
