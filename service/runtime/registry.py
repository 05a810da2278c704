"""Every model of the repository, loaded once at start-up; readiness, the default model and shutdown."""

from __future__ import annotations

import asyncio
import logging
import math

from service.core.config import Settings
from service.core.errors import ModelNotFound, ModelNotReady
from service.core.metrics import Metrics
from service.runtime.batcher import BatchingPolicy
from service.runtime.model import ModelState, RuntimeOptions, ServedModel
from service.runtime.model_dir import provider_summary
from service.runtime.repository import scan_repository
from service.runtime.slots import RunSlots

logger = logging.getLogger(__name__)


class ModelRegistry:
    """Holds the served models. `start` loads them (in threads) and warms them up; `close` drains them.

    All ONNX Runtime runs of the batchers share one `RunSlots` budget, the intra-op threads the container's CPU
    quota allows: a lone run uses them all, runs under load one each (`CAPSNET_PARALLEL_RUNS`).
    """

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.models: dict[str, ServedModel] = {}
        self.started = False  # every model has been loaded (or has failed)
        self.load_error: str | None = None
        self.slots = RunSlots(settings.run_slots)
        self._default: str | None = None

    @property
    def options(self) -> RuntimeOptions:
        s = self.settings
        policy = BatchingPolicy(s.max_batch_size, s.max_queue_delay_ms / 1000.0, s.max_queue_size, s.request_timeout_s)
        return RuntimeOptions(s.provider, s.intra_op_threads, s.warmup_runs, policy, s.run_slots)

    async def start(self) -> None:
        """Scan the repository, load and warm every model; a broken model is logged and reported, never fatal."""
        loop = asyncio.get_running_loop()
        try:
            found = await loop.run_in_executor(None, scan_repository, self.settings.model_repository)
        except OSError as e:
            self.load_error = str(e)
            logger.error("cannot read the model repository: %s", e)
            self.started = True
            return
        self.models = {entry.name: ServedModel(entry, self.metrics) for entry in found}
        if not self.models:
            self.load_error = f"no model directories (with model.json) in {self.settings.model_repository}"
            logger.error(self.load_error)
        options = self.options
        logger.info(
            "execution provider %s; %d intra-op threads, %d parallel runs under load",
            provider_summary(options.provider),
            options.intra_op_threads,
            options.parallel_runs,
        )
        for model in self.models.values():
            await loop.run_in_executor(None, model.load, options, self.slots)
            model.start()
            self._record(model)
        self._default = self._choose_default()
        if self._default is not None and self._default not in self.models:
            self.load_error = (
                f"the default model {self._default!r} (CAPSNET_DEFAULT_MODEL) is not in the repository; "
                f"served models: {sorted(self.models)}"
            )
            logger.error(self.load_error)
        self.started = True
        ready = [m.name for m in self.models.values() if m.ready]
        logger.info(
            "ready: %d of %d models (%s); default model: %s", len(ready), len(self.models), ready, self._default
        )

    def _record(self, model: ServedModel) -> None:
        self.metrics.model_ready.labels(model=model.name).set(1 if model.ready else 0)
        self.metrics.models_loaded.set(sum(m.ready for m in self.models.values()))
        if model.provider:
            self.metrics.provider.labels(model=model.name, provider=model.provider).set(1)

    def _choose_default(self) -> str | None:
        """CAPSNET_DEFAULT_MODEL, else the ready model with the lowest test error on its card (then by name)."""
        if self.settings.default_model:
            return self.settings.default_model
        ready = [m for m in self.models.values() if m.ready and m.card is not None]

        def error_rate(m: ServedModel) -> float:
            metrics = (m.card.metrics if m.card else None) or {}
            value = metrics.get("mnist_test_error")
            return float(value) if isinstance(value, int | float) else math.inf

        return min(ready, key=lambda m: (error_rate(m), m.name)).name if ready else None

    async def close(self) -> None:
        """Stop taking requests and finish the queued ones, model by model."""
        for model in self.models.values():
            await model.close()

    @property
    def ready(self) -> bool:
        """Loading is over, at least one model serves and so does the default model's name (the Kubernetes
        readiness)."""
        named = self._default is None or self._default in self.models
        return self.started and named and any(m.ready for m in self.models.values())

    @property
    def all_ready(self) -> bool:
        """Every model serves (the Open Inference Protocol's server readiness)."""
        return self.started and bool(self.models) and all(m.ready for m in self.models.values())

    def get(self, name: str) -> ServedModel:
        model = self.models.get(name)
        if model is None:
            if not self.started:
                raise ModelNotReady(f"models are still loading; model {name!r} is not known yet", retry_after_s=5)
            raise ModelNotFound(f"model {name!r} not found; served models: {sorted(self.models)}")
        return model

    def default(self) -> ServedModel:
        if not self.started:
            raise ModelNotReady("models are still loading", retry_after_s=5)
        if self._default is None:
            raise ModelNotFound("no default model: no model in the repository is ready")
        if self._default not in self.models:
            raise ModelNotFound(
                f"the default model {self._default!r} (CAPSNET_DEFAULT_MODEL) is not in the repository; "
                f"served models: {sorted(self.models)}"
            )
        return self.models[self._default]

    @property
    def default_name(self) -> str | None:
        return self._default

    def states(self) -> dict[str, ModelState]:
        return {name: m.state for name, m in self.models.items()}
