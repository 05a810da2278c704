"""One model directory run over batches of items with the service's own preprocessing, sessions and "not a digit"
score, giving Arrow record batches of the output schema (docs/batch-predict.md)."""

from __future__ import annotations

import json
import math
import os
import queue
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from service.contract import (
    ImageDecodeError,
    ImageLimits,
    ModelDir,
    array_from_pixels,
    create_session,
    decode_image,
    load_model_dir,
    one_blas_thread,
    preprocess,
)
from training.predict.sources import Item

SCHEMA_VERSION = "1"


class ItemError(ValueError):
    """An image that cannot be predicted; str() is the message the service would answer (or the read error)."""


@dataclass(frozen=True)
class PredictOptions:
    """How images are prepared and run. `invert` None detects the polarity; the rest as the service's query options
    and settings of the same names (docs/batch-predict.md)."""

    invert: bool | None = None
    normalize: bool = True
    batch_size: int = 32
    threads: int | None = None  # intra-op threads per session; None: the service's default
    parallel_runs: int = 1  # sessions run at once, each on threads // parallel_runs threads
    all_poses: bool = False
    provider: str = "cpu"
    max_pixels: int = ImageLimits().max_pixels


@dataclass
class Prepared:
    """The items of one batch: the model inputs of those that could be read, and the error of each that could not."""

    items: list[Item]
    arrays: list[np.ndarray | None]
    inverted: list[bool | None]
    errors: list[str | None]


Ran = tuple[Prepared, dict[str, np.ndarray] | None, np.ndarray]  # a batch, its outputs and model inputs


def default_threads() -> int:
    """The cores this process may use (its CPU affinity), the budget split among parallel runs."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class Predictor:
    """Sessions of one model directory and the output schema; `predict` maps a list of items to a record batch.

    Batches run at most the card's `serving.max_batch_size` images at a time, as the service runs them; a batched
    model never runs a lone image (it is padded to two), so every row has the bits of ONNX Runtime's batched kernels.
    """

    def __init__(self, model: str | os.PathLike[str] | ModelDir, options: PredictOptions) -> None:
        one_blas_thread()  # as the server runs
        self.model = model if isinstance(model, ModelDir) else load_model_dir(model)
        self.options = options
        card = self.card = self.model.card
        card_max = card.serving.max_batch_size if card.serving and card.serving.max_batch_size else None
        self.run_batch = min(options.batch_size, card_max or options.batch_size)
        self.output_names = [o.name for o in card.outputs]
        budget = default_threads() if options.threads is None and options.parallel_runs > 1 else options.threads
        per_run = None if budget is None else max(1, budget // options.parallel_runs)
        self.sessions: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for _ in range(options.parallel_runs):
            self.sessions.put(create_session(self.model.graph, options.provider, per_run))
        self.limits = ImageLimits(max_pixels=options.max_pixels)
        self.schema = output_schema(self.model, options)

    # --- preparing ------------------------------------------------------------------------------------------

    def prepare(self, items: list[Item]) -> Prepared:
        prepared = Prepared(items, [], [], [])
        for item in items:
            try:
                array, inverted = self.prepare_one(item)
            except ItemError as e:
                prepared.arrays.append(None)
                prepared.inverted.append(None)
                prepared.errors.append(str(e))
            else:
                prepared.arrays.append(array)
                prepared.inverted.append(inverted)
                prepared.errors.append(None)
        return prepared

    def prepare_one(self, item: Item) -> tuple[np.ndarray, bool]:
        """The model input (H, W) float32 of one item and whether it was inverted, as the service prepares an
        uploaded file (encoded bytes) or a JSON `array` (pixels); an ItemError with the service's message."""
        size = self.card.image_size
        try:
            if item.data is not None:
                result = preprocess(
                    decode_image(item.data, self.limits), size, self.options.invert, self.options.normalize
                )
                return result.array, result.inverted
            pixels = item.pixels
            if isinstance(pixels, np.ndarray) and pixels.ndim == 1 and pixels.size == math.prod(size):
                pixels = pixels.reshape(size)  # a flat row of H*W numbers (a Parquet list column)
            elif isinstance(pixels, list) and len(pixels) == math.prod(size) and not isinstance(pixels[0], list):
                pixels = np.asarray(pixels).reshape(size)
            return array_from_pixels(pixels, size), False
        except ImageDecodeError as e:
            raise ItemError(str(e)) from e

    # --- running --------------------------------------------------------------------------------------------

    def infer(self, arrays: np.ndarray) -> dict[str, np.ndarray]:
        """Every output on the card for model inputs (N, *image_shape), run `run_batch` images at a time."""
        parts = [self._run(arrays[i : i + self.run_batch]) for i in range(0, len(arrays), self.run_batch)]
        return {name: np.concatenate([p[name] for p in parts]) for name in self.output_names}

    def _run(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        n = len(batch)
        if n == 1 and self.run_batch > 1:  # ONNX Runtime's batch-of-one kernels round differently: pad to two
            batch = np.concatenate([batch, np.zeros_like(batch)])
        session = self.sessions.get()
        try:
            outputs = session.run(self.output_names, {self.card.input.name: batch})
        finally:
            self.sessions.put(session)
        return {name: value[:n] for name, value in zip(self.output_names, outputs, strict=True)}

    # --- the rows -------------------------------------------------------------------------------------------

    def predict(self, items: list[Item]) -> pa.RecordBatch:
        return self.finish(self.run_prepared(self.prepare(items)))

    def run_prepared(self, prepared: Prepared) -> Ran:
        """The prepared batch, the outputs of its readable items (None if there are none) and their inputs."""
        good = [a for a in prepared.arrays if a is not None]
        images = np.stack(good).reshape(len(good), *self.card.image_shape) if good else np.zeros((0,), np.float32)
        return prepared, (self.infer(images) if good else None), images

    def finish(self, ran: Ran) -> pa.RecordBatch:
        """The record batch of a batch that has run: one row per item, in order; error rows have nulls."""
        prepared, outputs, images = ran
        card = self.card
        n = len(prepared.items)
        ok = np.array([a is not None for a in prepared.arrays], dtype=bool)
        k, p = len(card.classes), card.pose_size
        scores = np.zeros((n, k), np.float32)
        poses = np.zeros((n, k, p), np.float32)
        predicted = np.zeros(n, np.int64)
        ink = np.zeros(n, np.float64)
        ood_score = np.zeros(n, np.float64)
        in_distribution = np.zeros(n, bool)
        if outputs is not None:
            scores[ok] = outputs[card.scores.output]
            poses[ok] = outputs[card.output_for("poses").name].reshape(len(images), k, p)
            predicted[ok] = scores[ok].argmax(axis=1)
            ink[ok] = images.reshape(len(images), -1).astype(np.float64).sum(axis=1)
            calibration = card.ood_calibration
            if calibration is not None:
                ood_score[ok], in_distribution[ok] = calibration.assess(images, *card.ood_inputs(outputs))
        calibrated = card.ood_calibration is not None
        columns: dict[str, pa.Array] = {
            "source": pa.array([item.source for item in prepared.items], pa.string()),
            "label": pa.array([item.label for item in prepared.items], pa.string()),
            "predicted_class": pa.array(predicted, pa.int32(), mask=~ok),
            "predicted_label": pa.array(
                [card.classes[c] if good else None for c, good in zip(predicted, ok, strict=True)], pa.string()
            ),
            "scores": fixed_lists(scores, k, ok),
            "pose": fixed_lists(poses[np.arange(n), predicted], p, ok),
        }
        if self.options.all_poses:
            columns["poses"] = fixed_lists(poses.reshape(n, k * p), k * p, ok)
        columns["ink"] = pa.array(ink, pa.float64(), mask=~ok)
        unscored = ~ok | (not calibrated)
        columns["ood_score"] = pa.array(ood_score, pa.float64(), mask=unscored)
        columns["in_distribution"] = pa.array(in_distribution, pa.bool_(), mask=unscored)
        columns["inverted"] = pa.array(prepared.inverted, pa.bool_())
        columns["error"] = pa.array(prepared.errors, pa.string())
        return pa.RecordBatch.from_arrays(list(columns.values()), schema=self.schema)


def fixed_lists(values: np.ndarray, size: int, ok: np.ndarray) -> pa.Array:
    """(N, size) float32 as a fixed-size list column, null where `ok` is False."""
    flat = pa.array(np.ascontiguousarray(values, np.float32).reshape(-1), pa.float32())
    lists = pa.FixedSizeListArray.from_arrays(flat, size)
    if ok.all():
        return lists
    return pa.FixedSizeListArray.from_arrays(flat, size, mask=pa.array(~ok))


def output_schema(model: ModelDir, options: PredictOptions) -> pa.Schema:
    """The Parquet schema: one row per image; the model and preprocessing in the schema's metadata."""
    card = model.card
    k, p = len(card.classes), card.pose_size
    fields = [
        pa.field("source", pa.string(), nullable=False),
        pa.field("label", pa.string()),
        pa.field("predicted_class", pa.int32()),
        pa.field("predicted_label", pa.string()),
        pa.field("scores", pa.list_(pa.float32(), k)),
        pa.field("pose", pa.list_(pa.float32(), p)),
    ]
    if options.all_poses:
        fields.append(pa.field("poses", pa.list_(pa.float32(), k * p)))
    fields += [
        pa.field("ink", pa.float64()),
        pa.field("ood_score", pa.float64()),
        pa.field("in_distribution", pa.bool_()),
        pa.field("inverted", pa.bool_()),
        pa.field("error", pa.string()),
    ]
    calibration = card.ood_calibration
    metadata = {
        "capsnet.schema_version": SCHEMA_VERSION,
        "capsnet.model": card.name,
        "capsnet.model_version": card.version,
        "capsnet.graph_sha256": card.files["capsnet.onnx"].sha256 if "capsnet.onnx" in card.files else "",
        "capsnet.classes": json.dumps(card.classes),
        "capsnet.pose_shape": json.dumps(card.pose_shape),
        "capsnet.score_kind": card.scores.kind,
        "capsnet.ood_threshold": json.dumps(None if calibration is None else calibration.threshold),
        "capsnet.preprocessing": json.dumps({"invert": options.invert, "normalize": options.normalize}),
    }
    return pa.schema(fields, metadata=metadata)


def job_fingerprint(model: ModelDir, options: PredictOptions) -> dict[str, Any]:
    """What makes two runs' rows comparable: model, graph and the options that change a row's values or columns."""
    chosen = asdict(options)
    return {
        "model": model.card.name,
        "model_version": model.card.version,
        "graph_sha256": model.card.files["capsnet.onnx"].sha256 if "capsnet.onnx" in model.card.files else "",
        **{key: chosen[key] for key in ("invert", "normalize", "all_poses", "max_pixels")},
    }
