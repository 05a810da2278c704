"""The served models and their versions: loading, live reloads, zero-downtime swaps and drains, readiness.

How a swap goes (docs/model-management.md): a new or changed version is loaded and warmed beside the one
serving; only when it is ready do new requests go to it. The old one is retired: requests that already hold it
(`ServedModel.lease`) and its queued requests finish on it, then its sessions are dropped. A version that fails
to load never replaces a working one. Every lifecycle change runs under one lock, one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from service.core.config import Settings
from service.core.errors import Forbidden, ModelLoadFailed, ModelNotFound, ModelNotReady
from service.core.metrics import Metrics
from service.runtime.batcher import BatchingPolicy
from service.runtime.model import ModelState, RuntimeOptions, ServedModel
from service.runtime.model_dir import ModelCard, provider_summary
from service.runtime.repository import (
    ModelSource,
    check_model_name,
    discover,
    find_source,
    read_version,
    version_key,
)
from service.runtime.slots import RunSlots

logger = logging.getLogger(__name__)
T = TypeVar("T")

# The states of the repository index, as Triton names them.
READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"
DRAIN_MARGIN_S = 5.0  # a drain waits for the requests holding a version this long beyond the request timeout


def log_event(event: str, name: str, version: str, **fields: object) -> None:
    """One log line per lifecycle event: `lifecycle event=<event> model=<name> version=<v> key=value ...`."""
    extra = "".join(f" {key}={value}" for key, value in fields.items())
    level = logging.WARNING if event in ("load_failed", "reload_failed") else logging.INFO
    logger.log(level, "lifecycle event=%s model=%s version=%s%s", event, name, version or "-", extra)


@dataclass(frozen=True)
class IndexRow:
    """One line of the repository index: a model version (or a model not loaded, version "")."""

    name: str
    version: str
    state: str
    reason: str = ""


class ModelEntry:
    """The versions of one model: loaded (ready, or failed with nothing to replace), loading, and the failed
    reloads of versions that kept serving."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.versions: dict[str, ServedModel] = {}
        self.loading: dict[str, ServedModel] = {}
        self.rejected: dict[str, ServedModel] = {}  # version -> a failed reload of a version that kept serving
        self.failed_stamps: dict[str, str] = {}  # version -> the files' stamp when its last load failed
        self.error: str | None = None  # the model folder's problem (a malformed version policy)

    def newest_first(self) -> list[ServedModel]:
        return sorted(self.versions.values(), key=lambda m: version_key(m.version), reverse=True)

    def current(self) -> ServedModel | None:
        """The newest serving version; without one, the newest version of any state (it says why it cannot serve)."""
        ordered = self.newest_first()
        return next((m for m in ordered if m.serving), ordered[0] if ordered else None)


class ModelRegistry:
    """Holds the served models. `start` loads them as the control mode says; `load`, `unload` and the poller change
    them while the service runs; `close` drains them.

    All ONNX Runtime runs of the batchers share one `RunSlots` budget, the intra-op threads the container's CPU
    quota allows: a lone run uses them all, runs under load one each (`CAPSNET_PARALLEL_RUNS`).
    """

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.entries: dict[str, ModelEntry] = {}
        self.started = False  # the start-up loading is over
        self.load_error: str | None = None
        self.slots = RunSlots(settings.run_slots)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._default: str | None = None
        self._lock = asyncio.Lock()
        self._draining: dict[ServedModel, asyncio.Task[None]] = {}
        self._poller: asyncio.Task[None] | None = None
        self.listeners: list[Callable[[], None]] = []  # called after every change of what serves

    @property
    def options(self) -> RuntimeOptions:
        s = self.settings
        policy = BatchingPolicy(s.max_batch_size, s.max_queue_delay_ms / 1000.0, s.max_queue_size, s.request_timeout_s)
        return RuntimeOptions(s.provider, s.intra_op_threads, s.warmup_runs, policy, s.run_slots)

    @property
    def models(self) -> dict[str, ServedModel]:
        """Each model's current version (the newest serving one, else the newest, which says why it cannot)."""
        return {name: m for name, entry in self.entries.items() if (m := entry.current()) is not None}

    async def start(self) -> None:
        """Load what the control mode says (`explicit`: the `load_models`; otherwise every model), then in `poll`
        mode start the poller. A broken model is logged and reported, never fatal."""
        self.loop = asyncio.get_running_loop()
        try:
            sources = await self._discover()
        except OSError as e:
            self.load_error = str(e)
            logger.error("cannot read the model repository: %s", e)
            self.started = True
            return
        if not sources:
            self.load_error = f"no model directories (with model.json) in {self.settings.model_repository}"
            logger.error(self.load_error)
        control = self.settings.model_control
        explicit = control == "explicit" and "*" not in self.settings.load_models
        names = self.settings.load_models if explicit else list(sources)
        options = self.options
        logger.info(
            "model control %s; execution provider %s; %d intra-op threads, %d parallel runs under load",
            *(control, provider_summary(options.provider), options.intra_op_threads, options.parallel_runs),
        )
        async with self._lock:
            for name in names:
                if name not in sources:
                    logger.error("cannot load model %r (CAPSNET_LOAD_MODELS): no such model folder", name)
                    continue
                await self._reconcile(name, sources[name], retry_failed=True)
            self._refresh_default()
        if self.settings.default_model and self.settings.default_model not in sources:
            self.load_error = (
                f"the default model {self.settings.default_model!r} (CAPSNET_DEFAULT_MODEL) is not in the repository; "
                f"models there: {sorted(sources)}"
            )
            logger.error(self.load_error)
        self.started = True
        ready = [m.name for m in self.models.values() if m.serving]
        logger.info(
            "ready: %d of %d models (%s); default model: %s", len(ready), len(self.entries), ready, self._default
        )
        if control == "poll":
            self._poller = asyncio.create_task(self._poll(), name="poll-model-repository")

    async def _discover(self) -> dict[str, ModelSource]:
        return await asyncio.get_running_loop().run_in_executor(None, discover, self.settings.model_repository)

    # --- the repository API -------------------------------------------------------------------------------

    def require_control(self, change: bool) -> None:
        """Forbidden unless the control mode allows the repository API (`change`: load or unload)."""
        control = self.settings.model_control
        if control == "none":
            raise Forbidden(
                "the model repository API is off (CAPSNET_MODEL_CONTROL=none); start the server with "
                "--model-control explicit (load and unload by the API) or poll"
            )
        if change and control != "explicit":
            raise Forbidden(
                "loading and unloading by the API needs CAPSNET_MODEL_CONTROL=explicit; in poll mode the repository "
                "folder decides: add, change or remove the model's files instead"
            )

    async def load(self, name: str) -> None:
        """Load the model `name` as its folder and version policy say, or reload the versions whose card changed;
        ModelLoadFailed naming every version that failed (what served before keeps serving)."""
        root = self.settings.model_repository
        source = await asyncio.get_running_loop().run_in_executor(None, find_source, root, name)
        async with self._lock:
            failed = await self._reconcile(name, source, retry_failed=True)
            self._refresh_default()
        if source.error:
            raise ModelLoadFailed(f"cannot load model {name!r}: {source.error}")
        if failed:
            serving = [m.version for m in self.versions(name) if m.serving]
            raise ModelLoadFailed(
                f"failed to load model {name!r}: "
                + "; ".join(f"version {m.version}: {m.error}" for m in failed)
                + (f"; still serving version(s) {serving}" if serving else "")
            )

    async def unload(self, name: str) -> None:
        """Take every version of `name` out of service and wait until each has drained and been released."""
        check_model_name(name)
        async with self._lock:
            entry = self.entries.pop(name, None)
            if entry is None:
                sources = await self._discover()
                if name not in sources:
                    raise ModelNotFound(f"model {name!r} is neither loaded nor in the model repository")
                return
            drains = [self._retire(m) for m in entry.versions.values() if m.state is not ModelState.FAILED]
            self._refresh_default()
        log_event("unload_requested", name, "", versions=len(drains))
        await asyncio.gather(*drains)

    async def index(self, ready_only: bool = False) -> list[IndexRow]:
        """Every model of the repository and every version loaded, loading or draining, with its state."""
        try:
            on_disk = set(await self._discover())
        except OSError:
            on_disk = set()
        rows: list[IndexRow] = []
        for name in sorted(on_disk | set(self.entries)):
            entry = self.entries.get(name)
            draining = [m for m in self._draining if m.name == name]
            if entry is None and not draining:
                rows.append(IndexRow(name, "", UNAVAILABLE, "unloaded"))
                continue
            found = self._entry_rows(entry) if entry is not None else []
            found += [IndexRow(name, m.version, UNLOADING, "draining") for m in draining]
            rows.extend(found or [IndexRow(name, "", UNAVAILABLE, (entry.error if entry else None) or "unloaded")])
        return [r for r in rows if r.state == READY] if ready_only else rows

    @staticmethod
    def _entry_rows(entry: ModelEntry) -> list[IndexRow]:
        rows = [IndexRow(entry.name, v, LOADING) for v in entry.loading]
        for model in entry.newest_first():
            reason = "" if model.serving else (model.error or "")
            rejected = entry.rejected.get(model.version)
            if rejected is not None:
                reason = f"a reload failed: {rejected.error}; the version loaded before keeps serving"
            if entry.error:
                reason = f"{reason}; {entry.error}" if reason else entry.error
            rows.append(IndexRow(entry.name, model.version, READY if model.serving else UNAVAILABLE, reason))
        return rows

    def run_blocking(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a lifecycle coroutine on the registry's event loop from another thread (a gRPC handler)."""
        if self.loop is None:
            coroutine.close()
            raise ModelNotReady("models are still loading", retry_after_s=5)
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    # --- reconciling a model with its folder ------------------------------------------------------------

    async def _reconcile(self, name: str, source: ModelSource | None, retry_failed: bool) -> list[ServedModel]:
        """Make the loaded versions of `name` what its folder and policy say (holding the lock); the failed loads."""
        if source is None:
            entry = self.entries.pop(name, None)
            if entry is not None:
                log_event("removed", name, "", reason="model folder gone from the repository")
                for model in entry.versions.values():
                    if model.state is not ModelState.FAILED:
                        self._retire(model)
            return []
        entry = self.entries.setdefault(name, ModelEntry(name))
        entry.error = source.error
        if source.error:  # a malformed policy changes nothing that serves
            log_event("policy_invalid", name, "", reason=source.error)
            return []
        wanted = source.selected()
        failed = []
        for version in wanted:
            disk = source.versions[version]
            have = entry.versions.get(version)
            if have is not None and have.ready and have.card_sha256 == disk.card_sha256:
                continue  # serving, card unchanged
            if not retry_failed and entry.failed_stamps.get(version) == disk.stamp:
                continue  # failed with these very files: wait until they change
            new = await self._load_version(entry, source, version)
            if new.ready:
                entry.rejected.pop(version, None)
                entry.failed_stamps.pop(version, None)
                entry.versions[version] = new
                if have is not None and have.state is not ModelState.FAILED:
                    log_event("swapped", name, version, reason="card changed")
                    self._retire(have)
            else:
                failed.append(new)
                entry.failed_stamps[version] = disk.stamp
                if have is not None and have.ready:
                    entry.rejected[version] = new
                else:
                    entry.versions[version] = new
        self._retire_unwanted(entry, source, wanted)
        if not entry.versions and not entry.loading:
            del self.entries[name]
        return failed

    def _retire_unwanted(self, entry: ModelEntry, source: ModelSource, wanted: list[str]) -> None:
        """Retire the ready versions the policy no longer serves (never the last ready one for a failed new one)."""
        ready = [v for v, m in entry.versions.items() if m.ready and v in source.versions]
        keep = set(source.policy.select(ready)) or set(sorted(ready, key=version_key)[-1:])
        for version, model in list(entry.versions.items()):
            if model.ready and version not in keep:
                del entry.versions[version]
                self._retire(model)
            elif not model.ready and version not in wanted:
                del entry.versions[version]
        for version in [v for v in entry.rejected if v not in entry.versions]:
            del entry.rejected[version]
        for version in [v for v in entry.failed_stamps if v not in wanted]:
            del entry.failed_stamps[version]

    async def _load_version(self, entry: ModelEntry, source: ModelSource, version: str) -> ServedModel:
        """Read, verify, load and warm one version beside whatever serves (in threads); ready or failed."""
        loop = asyncio.get_running_loop()
        log_event("load_started", entry.name, version, path=source.versions[version].path.name)
        start = time.perf_counter()
        directory = await loop.run_in_executor(None, read_version, source, version)
        model = ServedModel(directory, self.metrics)
        serving = next((m for m in entry.newest_first() if m.serving), None)
        if model.card is not None and serving is not None and serving.card is not None:
            problem = incompatible(serving.card, model.card)
            if problem:
                model.fail(f"refused: {problem}; serve it under another model name")
        if model.state is ModelState.LOADING:
            entry.loading[version] = model
            try:
                await loop.run_in_executor(None, model.load, self.options, self.slots)
                model.start()
            finally:
                del entry.loading[version]
        seconds = time.perf_counter() - start
        if model.ready:
            self.metrics.model_loads.labels(model=entry.name, outcome="ready").inc()
            self.metrics.model_load_time.labels(model=entry.name).observe(seconds)
            log_event("loaded", entry.name, version, seconds=f"{seconds:.2f}", provider=model.provider)
        else:
            self.metrics.model_loads.labels(model=entry.name, outcome="failed").inc()
            log_event("load_failed", entry.name, version, reason=repr(model.error))
        self._record(model)
        return model

    def _record(self, model: ServedModel) -> None:
        self.metrics.model_ready.labels(model=model.name, version=model.version).set(1 if model.serving else 0)
        self.metrics.models_loaded.set(sum(1 for m in self.models.values() if m.serving))
        if model.provider and model.serving:
            self.metrics.provider.labels(model=model.name, version=model.version, provider=model.provider).set(1)

    def _retire(self, model: ServedModel) -> asyncio.Task[None]:
        """Route no new request to `model` and drain it in the background; the drain's task."""
        model.retire()
        self._record(model)
        task = self._draining.get(model)
        if task is None:
            task = self._draining[model] = asyncio.create_task(self._drain(model), name=f"drain-{model.name}")
        return task

    async def _drain(self, model: ServedModel) -> None:
        log_event("draining", model.name, model.version, requests=model.leases)
        start = time.perf_counter()
        try:
            await model.drain(self.settings.request_timeout_s + DRAIN_MARGIN_S)
        finally:
            self._draining.pop(model, None)
        self.metrics.model_unloads.labels(model=model.name).inc()
        for gauge, labels in (
            (self.metrics.model_ready, (model.name, model.version)),
            (self.metrics.provider, (model.name, model.version, model.provider or "")),
        ):
            with contextlib.suppress(KeyError):  # never set: the version failed before serving
                gauge.remove(*labels)
        self.metrics.models_loaded.set(sum(1 for m in self.models.values() if m.serving))
        log_event("unloaded", model.name, model.version, seconds=f"{time.perf_counter() - start:.2f}")

    async def _poll(self) -> None:
        """Every `poll_seconds`: load new models and versions, reload changed ones, unload removed ones."""
        while True:
            await asyncio.sleep(self.settings.poll_seconds)
            try:
                await self.poll_once()
            except Exception:
                logger.exception("polling the model repository failed; nothing was changed")

    async def poll_once(self) -> None:
        """One scan of the repository (an unreadable repository changes nothing)."""
        try:
            sources = await self._discover()
        except OSError as e:
            logger.warning("cannot read the model repository (%s): keeping the models loaded", e)
            return
        async with self._lock:
            for name in sorted(set(sources) | set(self.entries)):
                await self._reconcile(name, sources.get(name), retry_failed=False)
            self._refresh_default()

    # --- serving -----------------------------------------------------------------------------------------

    def _refresh_default(self) -> None:
        """CAPSNET_DEFAULT_MODEL; else keep the default while it serves, or choose one among the serving models.
        Then tell the listeners that what serves may have changed."""
        if self.settings.default_model:
            self._default = self.settings.default_model
        else:
            current = self.entries.get(self._default) if self._default else None
            if current is None or (model := current.current()) is None or not model.serving:
                self._default = self._choose_default()
        for listener in self.listeners:
            listener()

    def _choose_default(self) -> str | None:
        """The serving model with the lowest test error on its card (then by name)."""
        ready = [m for m in self.models.values() if m.serving and m.card is not None]

        def error_rate(m: ServedModel) -> float:
            metrics = (m.card.metrics if m.card else None) or {}
            value = metrics.get("mnist_test_error")
            return float(value) if isinstance(value, int | float) else math.inf

        return min(ready, key=lambda m: (error_rate(m), m.name)).name if ready else None

    async def close(self) -> None:
        """Stop polling, stop taking requests and finish the queued ones, model by model."""
        if self._poller is not None:
            self._poller.cancel()
        async with self._lock:
            for entry in self.entries.values():
                for model in entry.versions.values():
                    await model.close()
        if self._draining:
            await asyncio.gather(*self._draining.values())

    @property
    def ready(self) -> bool:
        """Start-up loading is over and the default model has a serving version (the Kubernetes readiness)."""
        if not self.started or self._default is None:
            return False
        entry = self.entries.get(self._default)
        model = entry.current() if entry else None
        return model is not None and model.serving

    @property
    def all_ready(self) -> bool:
        """Every loaded model has a serving version (the Open Inference Protocol's server readiness)."""
        models = self.models
        return self.started and bool(models) and all(m.serving for m in models.values())

    def get(self, name: str, version: str | None = None) -> ServedModel:
        """The model's newest serving version, or the given `version`; ModelNotFound / ModelNotReady otherwise."""
        entry = self.entries.get(name)
        if entry is None:
            if not self.started:
                raise ModelNotReady(f"models are still loading; model {name!r} is not known yet", retry_after_s=5)
            raise ModelNotFound(f"model {name!r} not found; served models: {sorted(self.entries)}")
        model = entry.current() if version is None else entry.versions.get(version)
        if model is None or model.retired:
            if version is not None and version in entry.loading:
                raise ModelNotReady(f"model {name!r} version {version} is still loading", retry_after_s=5)
            loaded = [m.version for m in entry.newest_first()]
            raise ModelNotFound(f"model {name!r} has no version {version!r} (versions: {loaded})")
        return model

    def versions(self, name: str) -> list[ServedModel]:
        """Every loaded version of `name` (ready or failed), newest first."""
        entry = self.entries.get(name)
        return entry.newest_first() if entry else []

    def default(self) -> ServedModel:
        if not self.started:
            raise ModelNotReady("models are still loading", retry_after_s=5)
        if self._default is None:
            raise ModelNotFound("no default model: no model in the repository is ready")
        if self._default not in self.entries:
            raise ModelNotFound(
                f"the default model {self._default!r} (CAPSNET_DEFAULT_MODEL) is not loaded; "
                f"served models: {sorted(self.entries)}"
            )
        return self.get(self._default)

    @property
    def default_name(self) -> str | None:
        return self._default

    def states(self) -> dict[str, ModelState]:
        return {name: m.state for name, m in self.models.items()}


def incompatible(serving: ModelCard, new: ModelCard) -> str | None:
    """Why `new` cannot be a version of the model `serving` is one of (architecture, input, classes), or None."""
    for what, old_value, new_value in (
        ("architecture", serving.architecture, new.architecture),
        ("input shape", serving.input.shape, new.input.shape),
        ("classes", serving.classes, new.classes),
    ):
        if old_value != new_value:
            return (
                f"version {new.version} has {what} {new_value!r} but the serving version {serving.version} has "
                f"{old_value!r}: the versions of a model share their architecture, input and classes"
            )
    return None
