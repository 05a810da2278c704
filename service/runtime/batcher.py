"""Dynamic batching: concurrent requests for one graph are gathered into one ONNX Runtime run.

A single worker task per graph takes every request queued while the previous run was busy (up to
`max_batch_size` rows), optionally waits up to `max_queue_delay` for more, runs the batch in a thread
so the event loop keeps serving, and splits the outputs back to the callers. Under load the batches
grow by themselves; an idle service runs a lone request at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np

from service.core.errors import InferenceTimeout, Overloaded, ShuttingDown
from service.core.metrics import Metrics

logger = logging.getLogger(__name__)

Tensors = dict[str, np.ndarray]
RunFn = Callable[[Tensors], Tensors]


@dataclass
class _Request:
    inputs: Tensors
    rows: int
    future: asyncio.Future[Tensors]
    enqueued: float = field(default_factory=time.perf_counter)


@dataclass(frozen=True)
class BatchingPolicy:
    max_batch_size: int
    max_queue_delay_s: float
    max_queue_size: int
    timeout_s: float


class DynamicBatcher:
    """Gathers `submit` calls for one graph (`run`: inputs -> outputs, batch-major) into batched runs."""

    def __init__(
        self, model: str, graph: str, run: RunFn, policy: BatchingPolicy, executor: Executor, metrics: Metrics
    ) -> None:
        self.model, self.graph, self._run_fn, self.policy = model, graph, run, policy
        self._executor, self._metrics = executor, metrics
        self._queue: deque[_Request] = deque()
        self._wakeup = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        labels = {"model": model, "graph": graph}
        self._m_depth = metrics.queue_depth.labels(**labels)
        self._m_queue = metrics.queue_time.labels(**labels)
        self._m_compute = metrics.compute_time.labels(**labels)
        self._m_batch = metrics.batch_size.labels(**labels)
        self._m_rows = metrics.inferences.labels(**labels)

    def start(self) -> None:
        """Start the worker; call from the event loop that will submit."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._work(), name=f"batcher-{self.model}-{self.graph}")

    @property
    def depth(self) -> int:
        return len(self._queue)

    async def submit(self, inputs: Tensors) -> Tensors:
        """Queue one request (every input has the same leading batch dimension) and wait for its outputs."""
        if self._closing:
            raise ShuttingDown("the service is shutting down")
        if len(self._queue) >= self.policy.max_queue_size:
            raise Overloaded(
                f"model {self.model!r} has {len(self._queue)} requests queued "
                f"(limit {self.policy.max_queue_size}, CAPSNET_MAX_QUEUE_SIZE); retry later"
            )
        rows = next(iter(inputs.values())).shape[0]
        request = _Request(inputs, rows, asyncio.get_running_loop().create_future())
        self._queue.append(request)
        self._m_depth.set(len(self._queue))
        self._wakeup.set()
        try:
            return await asyncio.wait_for(request.future, self.policy.timeout_s)
        except asyncio.TimeoutError as e:  # not the builtin TimeoutError before Python 3.11
            raise InferenceTimeout(
                f"inference on model {self.model!r} did not finish within {self.policy.timeout_s:g} s"
            ) from e

    async def close(self) -> None:
        """Stop taking requests, finish every queued one, then stop the worker."""
        self._closing = True
        self._wakeup.set()
        if self._task is not None:
            await self._task

    async def _work(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = self._take()
            if batch:
                await self._fill(batch)
                await self._run(batch)

    def _take(self, batch: list[_Request] | None = None) -> list[_Request]:
        """Move queued requests into `batch` while they fit; an oversized lone request runs alone."""
        batch = [] if batch is None else batch
        rows = sum(r.rows for r in batch)
        while self._queue:
            head = self._queue[0]
            if head.future.done():  # timed out while queued
                self._queue.popleft()
                continue
            if batch and rows + head.rows > self.policy.max_batch_size:
                break
            batch.append(self._queue.popleft())
            rows += head.rows
        self._m_depth.set(len(self._queue))
        return batch

    async def _fill(self, batch: list[_Request]) -> None:
        """Wait until the oldest request has waited `max_queue_delay` or the batch is full."""
        deadline = batch[0].enqueued + self.policy.max_queue_delay_s
        while not self._closing and sum(r.rows for r in batch) < self.policy.max_batch_size:
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except asyncio.TimeoutError:
                return
            self._take(batch)

    async def _run(self, batch: list[_Request]) -> None:
        started = time.perf_counter()
        live = [r for r in batch if not r.future.done()]
        if not live:
            return
        for r in live:
            self._m_queue.observe(started - r.enqueued)
        rows = sum(r.rows for r in live)
        try:  # anything that fails here fails this batch's callers only, never the worker
            names = live[0].inputs.keys()
            inputs = {
                k: np.concatenate([r.inputs[k] for r in live]) if len(live) > 1 else live[0].inputs[k] for k in names
            }
            outputs, seconds = await asyncio.get_running_loop().run_in_executor(self._executor, self._timed_run, inputs)
        except Exception as e:
            logger.exception("batch of %d rows on %s/%s failed", rows, self.model, self.graph)
            for r in live:
                if not r.future.done():
                    r.future.set_exception(e)
            return
        self._m_compute.observe(seconds)
        self._m_batch.observe(rows)
        self._m_rows.inc(rows)
        offset = 0
        for r in live:
            if not r.future.done():
                r.future.set_result({k: v[offset : offset + r.rows] for k, v in outputs.items()})
            offset += r.rows

    def _timed_run(self, inputs: Tensors) -> tuple[Tensors, float]:
        start = time.perf_counter()
        outputs = self._run_fn(inputs)
        return outputs, time.perf_counter() - start
