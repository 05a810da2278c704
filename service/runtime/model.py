"""One served model: its card, its ONNX Runtime sessions and batchers, and its state."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import dataclasses
import enum
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from service.core.errors import ModelCapabilityError, ModelNotReady, NonFiniteOutput
from service.core.metrics import Metrics
from service.runtime.batcher import BatchingPolicy, CancelHook, DynamicBatcher, Rows, RunFn, Tensors
from service.runtime.model_dir import GRAPH_FILE, ModelCard, active_provider, create_session
from service.runtime.repository import ModelDirectory
from service.runtime.slots import RunSlots

logger = logging.getLogger(__name__)


class ModelState(str, enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    UNLOADING = "unloading"  # retired: finishing the requests it already took
    UNLOADED = "unloaded"  # released: its sessions are gone


@dataclass(frozen=True)
class RuntimeOptions:
    provider: str
    intra_op_threads: int
    warmup_runs: int
    policy: BatchingPolicy
    parallel_runs: int = 1  # > 1 on the CPU: each graph gets a single-thread session too (`RunSlots`)


def finite_rows(inputs: Tensors, outputs: Tensors) -> np.ndarray:
    """(N,) bool: whether every output of each row of a batch is finite (read-only: shared by the batch's callers)."""
    finite = np.logical_and.reduce([np.isfinite(v.reshape(len(v), -1)).all(axis=1) for v in outputs.values()])
    finite.flags.writeable = False
    return finite


def all_finite(outputs: Tensors) -> bool:
    """Every value of a caller's outputs is finite: read from its batch's `finite_rows`, computed once per batch."""
    if isinstance(outputs, Rows):
        return bool(outputs.batch.derived("finite", finite_rows)[outputs.rows].all())
    return all(np.isfinite(v).all() for v in outputs.values())


def _libc_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


MALLOC_TRIM = _libc_malloc_trim()


def release_memory() -> None:
    """Collect the dropped sessions and hand glibc's free heap pages back to the system: without it, the RSS of a
    process that loads and unloads models keeps the high-water mark of every load (docs/model-management.md)."""
    gc.collect()
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)


def _runner(session: ort.InferenceSession, output_names: list[str]) -> RunFn:
    def run(inputs: Tensors) -> Tensors:
        return dict(zip(output_names, session.run(output_names, inputs), strict=True))

    return run


class ServedModel:
    """One version of a model. Loaded in a worker thread by `load`, then driven from the event loop by `start`,
    `infer` and `decode`; `retire` and `drain` take it out of service once the requests that hold it have ended."""

    def __init__(self, directory: ModelDirectory, metrics: Metrics) -> None:
        self.name = directory.name
        self.version = directory.version
        self.card_sha256 = directory.card_sha256
        self.path: Path = directory.path
        self.card: ModelCard | None = directory.card
        self.raw_card = directory.raw_card
        self.error: str | None = directory.error
        self.state = ModelState.FAILED if directory.error else ModelState.LOADING
        self.provider: str | None = None
        self.load_seconds: float | None = None
        self._metrics = metrics
        self._runners: dict[str, RunFn] = {}
        self._narrow: dict[str, RunFn] = {}  # the same graphs on single-thread sessions, for parallel runs
        self._batchers: dict[str, DynamicBatcher] = {}
        self._leases = 0  # requests that have looked this version up and not yet answered
        self._lease_lock = threading.Lock()
        self.retired = False  # no new request is routed to it

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    @property
    def serving(self) -> bool:
        """Ready and not retired: new requests may be routed to it."""
        return self.state is ModelState.READY and not self.retired

    @contextmanager
    def lease(self) -> Iterator[ServedModel]:
        """Hold the version for one request: `drain` waits for every holder before it releases the sessions."""
        with self._lease_lock:
            self._leases += 1
        try:
            yield self
        finally:
            with self._lease_lock:
                self._leases -= 1

    @property
    def leases(self) -> int:
        return self._leases

    @property
    def has_decoder(self) -> bool:
        return self.card is not None and self.card.decoder is not None

    def load(self, options: RuntimeOptions, slots: RunSlots) -> None:
        """Create the sessions, check them against the card and warm them up (blocking; run in a thread).

        Every run of the batchers holds slots of `slots` (one budget for the whole service). With
        `options.parallel_runs` > 1 on the CPU each graph also gets a single-thread session for runs under load.
        """
        if self.card is None:
            return
        card = self.card
        start = time.perf_counter()
        try:
            graphs = ["capsnet", "decoder"] if card.decoder is not None else ["capsnet"]
            sessions = {name: self._open(name, options.provider, options.intra_op_threads) for name in graphs}
            self._runners = {name: _runner(session, outputs) for name, (session, outputs) in sessions.items()}
            self.provider = active_provider(sessions["capsnet"][0])
            policy = self._policy(options.policy)
            if options.parallel_runs > 1 and self.provider == "CPUExecutionProvider":
                self._narrow = {name: _runner(*self._open(name, "cpu", 1)) for name in graphs}
            self._batchers = {
                graph_name: DynamicBatcher(
                    self.name, graph_name, run, policy, slots, self._metrics, self._narrow.get(graph_name), self.version
                )
                for graph_name, run in self._runners.items()
            }
            self._warm_up(options.warmup_runs, policy.max_batch_size)
        except Exception as e:
            self.fail(f"cannot load: {e}")
            self._drop_sessions()
            logger.debug("model %s version %s failed to load", self.name, self.version, exc_info=True)
            return
        self.load_seconds = time.perf_counter() - start
        logger.info(
            "model %s version %s loaded on %s (%d intra-op threads%s) in %.2f s; decoder: %s",
            self.name,
            self.version,
            self.provider,
            options.intra_op_threads,
            ", single-thread sessions for parallel runs" if self._narrow else "",
            self.load_seconds,
            "yes" if card.decoder else "no",
        )

    def _policy(self, policy: BatchingPolicy) -> BatchingPolicy:
        """The service's batching policy, its batch size lowered to the card's `serving.max_batch_size`."""
        card_max = self.card.serving.max_batch_size if self.card and self.card.serving else None
        if card_max is None or card_max >= policy.max_batch_size:
            return policy
        return dataclasses.replace(policy, max_batch_size=card_max)

    @property
    def max_batch_size(self) -> int | None:
        """Most images per run of this model (the card may lower the service's), once loaded."""
        batcher = self._batchers.get("capsnet")
        return batcher.policy.max_batch_size if batcher else None

    def _open(self, graph_name: str, provider: str, threads: int) -> tuple[ort.InferenceSession, list[str]]:
        """A session of the card's `capsnet` or `decoder` graph, checked against the card; with its output names."""
        card = self.card
        assert card is not None
        if graph_name == "decoder":
            assert card.decoder is not None
            file, inputs, outputs = card.decoder.file, [i.name for i in card.decoder.inputs], [card.decoder.output.name]
        else:
            file, inputs, outputs = GRAPH_FILE, [card.input.name], [o.name for o in card.outputs]
        session = create_session(self.path / file, provider, threads)
        self._check_graph(session, inputs, outputs, file)
        return session, outputs

    def fail(self, error: str) -> None:
        self.state, self.error = ModelState.FAILED, error

    @staticmethod
    def _check_graph(session: ort.InferenceSession, inputs: list[str], outputs: list[str], filename: str) -> None:
        have_in = {i.name for i in session.get_inputs()}
        have_out = {o.name for o in session.get_outputs()}
        if set(inputs) != have_in:
            raise ValueError(f"{filename} inputs {sorted(have_in)} do not match the card's {sorted(inputs)}")
        if missing := set(outputs) - have_out:
            raise ValueError(f"{filename} lacks the card's outputs {sorted(missing)} (has {sorted(have_out)})")

    def _warm_up(self, runs: int, max_batch: int) -> None:
        """Run each graph at batch 1 and at the largest batch so the first requests pay no allocation cost."""
        card = self.card
        assert card is not None
        for runners in (self._runners, self._narrow):
            for batch in sorted({1, max_batch}) if runners else ():
                for _ in range(runs):
                    images = np.zeros((batch, *card.image_shape), np.float32)
                    outputs = runners["capsnet"]({card.input.name: images})
                    if "decoder" in runners:
                        poses = outputs[card.output_for("poses").name]
                        mask = np.zeros((batch, len(card.classes)), np.float32)
                        mask[:, 0] = 1.0
                        runners["decoder"]({"poses": poses, "mask": mask})

    def start(self) -> None:
        """Start the batch workers and mark the model ready."""
        if self.state is not ModelState.LOADING:
            return
        for batcher in self._batchers.values():
            batcher.start()
        self.state = ModelState.READY

    async def close(self) -> None:
        for batcher in self._batchers.values():
            await batcher.close()

    def retire(self) -> None:
        """Route no new request here; the requests holding a lease still run (see `drain`)."""
        self.retired = True

    async def drain(self, timeout_s: float) -> None:
        """Once every lease has ended (or after `timeout_s`), finish the queued requests, stop the batchers and drop
        the sessions, so that their memory is released."""
        self.retire()
        if self.state is ModelState.READY:
            self.state = ModelState.UNLOADING
        deadline = time.monotonic() + timeout_s
        while self._leases and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        if self._leases:
            logger.warning(
                "model %s version %s: %d requests still hold it after %.0f s",
                *(self.name, self.version, self._leases, timeout_s),
            )
        await self.close()
        self._drop_sessions()
        self.state = ModelState.UNLOADED
        await asyncio.get_running_loop().run_in_executor(None, release_memory)

    def _drop_sessions(self) -> None:
        self._batchers, self._runners, self._narrow = {}, {}, {}

    def require_ready(self) -> ModelCard:
        if self.state is ModelState.LOADING:
            raise ModelNotReady(f"model {self.name!r} is still loading", retry_after_s=5)
        if self.state is ModelState.UNLOADED:
            raise ModelNotReady(f"model {self.name!r} version {self.version} was unloaded", retry_after_s=1)
        if self.state is ModelState.FAILED or self.card is None:
            raise ModelNotReady(f"model {self.name!r} is not available: {self.error}", retry_after_s=30)
        return self.card

    async def infer(self, images: np.ndarray, alone: bool = False) -> Tensors:
        """Images (N, *image_shape) float32 -> every output on the card, keyed by name, batch-major. `alone`: the
        caller knows of no other request in the service (see `DynamicBatcher.submit`)."""
        card = self.require_ready()
        return self.finite(await self._batchers["capsnet"].submit({card.input.name: images}, alone), "capsnet")

    def infer_blocking(self, images: np.ndarray, on_cancel: CancelHook | None = None) -> Tensors:
        """`infer` for a caller on its own thread (a gRPC handler), which it blocks; see `submit_blocking`."""
        card = self.require_ready()
        return self.finite(self._batchers["capsnet"].submit_blocking({card.input.name: images}, on_cancel), "capsnet")

    def finite(self, outputs: Tensors, graph: str) -> Tensors:
        """`outputs` if every value is finite; else a NonFiniteOutput, logged in one line (a model cannot answer
        NaN or infinity as a number, on any route or encoding)."""
        if all_finite(outputs):
            return outputs
        logger.warning("model %s (%s graph) computed NaN or infinite outputs: refused with 422", self.name, graph)
        raise NonFiniteOutput(
            f"model {self.name!r} computed NaN or infinite outputs for this input, which cannot be sent as numbers; "
            "send inputs like those it was trained on"
        )

    def require_decoder(self) -> ModelCard:
        card = self.require_ready()
        if card.decoder is None:
            raise ModelCapabilityError(
                f"model {self.name!r} has no decoder, so it cannot reconstruct images (its card's decoder is null)"
            )
        return card

    async def decode(self, poses: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Poses (N, K, *pose_shape) and mask (N, K) -> reconstruction (N, *image_shape)."""
        card = self.require_decoder()
        assert card.decoder is not None
        out = self.finite(await self._batchers["decoder"].submit({"poses": poses, "mask": mask}), "decoder")
        return out[card.decoder.output.name]

    def queue_depth(self) -> dict[str, int]:
        return {graph: b.depth for graph, b in self._batchers.items()}
