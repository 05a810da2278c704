"""Static int8 quantization of a float32 model directory, calibrated on MNIST training images, verified against it.

    capsnet-quantize model/zoo/capsnet-mnist --data-dir DIR --out model/zoo/capsnet-mnist-int8
    capsnet-quantize bench model/zoo/capsnet-mnist model/zoo/capsnet-mnist-int8

The first form rewrites the chosen ops (default: the convolutions, the ReLU between them and the decoder's Gemms)
with int8 weights per output channel and uint8 activations calibrated on MNIST images, keeps routing float32, and
writes the new directory only when it passes verification against its parent on the full test set
(`ParityBounds`). The second prints the raw ONNX Runtime throughput of two model directories, alternated in
rounds. Options and measurements: docs/quantization.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shlex
import sys
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process

from service.contract import (
    DECODER_FILE,
    GRAPH_FILE,
    ModelDirError,
    create_session,
    load_model_dir,
    portable_command,
    portable_path,
)
from training.data.mnist import MNISTSplit, load_split, to_float
from training.entry import cli_error
from training.export.card import git_state
from training.export.directory import Artifacts, check_out_dir, check_request, write_model_dir
from training.export.graphs import check_onnx_graph, default_opset
from training.fitting.results import EvalResult, confusion_matrix
from training.options import add_data_dir
from training.quantize.rewrite import rewrite_u_hat_einsum

log = logging.getLogger(__name__)

METHODS = {
    "minmax": CalibrationMethod.MinMax,
    "entropy": CalibrationMethod.Entropy,
    "percentile": CalibrationMethod.Percentile,
}
FORMATS = {"qdq": QuantFormat.QDQ, "qoperator": QuantFormat.QOperator}
PERCENTILE = 99.999  # percentile calibration: the activation range covers this share of the calibration values
DEFAULT_OPS = ("Conv", "Relu", "Gemm")  # Relu: folded into the convolution before it (no requantization)
DEFAULT_CALIBRATION_IMAGES = 512
CALIBRATION_BATCH = 64
EVAL_BATCH = 500
INTEGER_OPS = frozenset({"ConvInteger", "MatMulInteger", "QGemm"})  # QOperator ops besides QLinear*
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
VERIFY_BATCHES = (1, 3, 64)  # 3: a batch size no calibration or evaluation batch has


def _verified_card(path: Path) -> dict[str, Any]:
    """The card of a model directory whose files match their checksums (ModelDirError naming the problem)."""
    return load_model_dir(path).raw_card


class QuantizeError(ModelDirError):
    """A quantization that cannot be done or fails its verification against the parent; the message says why."""


@dataclass(frozen=True)
class ParityBounds:
    """How far the int8 model may move from its float32 parent on the test set (absolute differences).

    Measured on the bundled capsnet-mnist (static QDQ, per-channel weights, 512 calibration images) over
    the 10,000 test images, convolutions only (v2): percentile calibration agrees on 99.99%, lengths
    max 0.095 / mean 0.0028, poses max 0.042 / mean 0.0011, reconstruction mean 0.0032; MinMax agrees
    on 99.96%, lengths 0.075 / 0.0033, poses 0.040 / 0.0012, reconstruction mean 0.0038. With the
    default ops (v3: ReLU folded, decoder Gemms int8), percentile: 99.99%, lengths 0.083 / 0.0027,
    poses 0.037 / 0.0010, reconstruction mean 0.0049. The reconstruction's max (0.43-0.81) is not
    bounded: an image whose class flips has the decoder draw another digit. The
    bounds leave 2-3x headroom over these for a retrained parent; the means are the sensitive checks
    (a few images near a class boundary set the maxima, a bad scale moves every image).
    """

    min_agreement: float = 0.999
    max_scores: float = 0.2
    mean_scores: float = 0.01
    max_poses: float = 0.1
    mean_poses: float = 0.004
    mean_reconstruction: float = 0.01


@dataclass(frozen=True)
class QuantizeOptions:
    """What to quantize and how; recorded on the card."""

    calibration_images: int = DEFAULT_CALIBRATION_IMAGES
    method: str = "percentile"
    ops: tuple[str, ...] = DEFAULT_OPS
    quant_format: str = "qdq"
    per_channel: bool = True
    rewrite_u_hat: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.calibration_images < 1:
            raise QuantizeError(f"calibration images must be >= 1, got {self.calibration_images}")
        if self.method not in METHODS:
            raise QuantizeError(f"calibration method {self.method!r} is not one of {sorted(METHODS)}")
        if self.quant_format not in FORMATS:
            raise QuantizeError(f"format {self.quant_format!r} is not one of {sorted(FORMATS)}")
        if not self.ops:
            raise QuantizeError("nothing to quantize: give at least one op type")


class CalibrationImages(CalibrationDataReader):
    """Feeds the calibration images to the calibrator in batches of CALIBRATION_BATCH."""

    def __init__(self, input_name: str, images: np.ndarray) -> None:
        self.batches = iter(
            [{input_name: images[i : i + CALIBRATION_BATCH]} for i in range(0, len(images), CALIBRATION_BATCH)]
        )

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def _calibration_record(indices: np.ndarray, n_train: int, seed: int) -> dict[str, Any]:
    return {
        "images": len(indices),
        "source": f"MNIST training set ({n_train} images)",
        "selection": f"numpy.random.default_rng({seed}).choice({n_train}, {len(indices)}, replace=False), sorted",
        "seed": seed,
        "indices": [int(i) for i in indices],
    }


def calibration_indices(n_train: int, count: int, seed: int) -> np.ndarray:
    """`count` distinct training-set indices drawn with `seed`, sorted."""
    if count > n_train:
        raise QuantizeError(f"{count} calibration images asked for, the training set has {n_train}")
    return np.sort(np.random.default_rng(seed).choice(n_train, size=count, replace=False))


def _quantize_graph(
    parent_graph: Path, work: Path, input_name: str, images: np.ndarray, opts: QuantizeOptions
) -> tuple[onnx.ModelProto, list[str]]:
    """Pre-process (shape inference, ORT basic fusions), rewrite, calibrate and quantize `parent_graph`.

    Returns the quantized graph and the names of the u_hat Einsum nodes rewritten as MatMuls.
    """
    pre, out = work / "preprocessed.onnx", work / "quantized.onnx"
    # Symbolic shape inference is skipped: it cannot read the Constant nodes of the dynamo exporter's graphs.
    quant_pre_process(str(parent_graph), str(pre), skip_symbolic_shape=True)
    rewritten: list[str] = []
    if opts.rewrite_u_hat:
        proto = onnx.load(str(pre))
        rewritten = rewrite_u_hat_einsum(proto)
        onnx.save(proto, str(pre))
    log.info("calibrating (%s, %d images) and quantizing %s", opts.method, len(images), ", ".join(opts.ops))
    with contextlib.redirect_stdout(sys.stderr):  # the calibrators print progress; stdout is the CLI's JSON
        quantize_static(
            str(pre),
            str(out),
            CalibrationImages(input_name, images),
            quant_format=FORMATS[opts.quant_format],
            op_types_to_quantize=list(opts.ops),
            per_channel=opts.per_channel,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=METHODS[opts.method],
            extra_options={"CalibPercentile": PERCENTILE},
        )
    return onnx.load(str(out)), rewritten


def _check_graph(proto: onnx.ModelProto, parent: dict[str, Any]) -> None:
    """`check_onnx_graph` against the parent's inputs and outputs, and something was quantized."""
    want_in, want_out = [parent["input"]["name"]], [o["name"] for o in parent["outputs"]]
    check_onnx_graph(proto, GRAPH_FILE, want_in, want_out, QuantizeError)
    if not any(n.op_type in ("QuantizeLinear", "QLinearConv", "ConvInteger") for n in proto.graph.node):
        raise QuantizeError(f"{GRAPH_FILE}: no op was quantized (none of the requested op types is in the graph?)")


def _run_all(session: ort.InferenceSession, input_name: str, names: list[str], split: MNISTSplit) -> list[np.ndarray]:
    """Every output of `session` over the whole split, in EVAL_BATCH batches."""
    chunks = [
        session.run(names, {input_name: to_float(split.images[i : i + EVAL_BATCH])})
        for i in range(0, len(split), EVAL_BATCH)
    ]
    return [np.concatenate([c[k] for c in chunks]) for k in range(len(names))]


def _metrics(scores: np.ndarray, split: MNISTSplit, num_classes: int) -> dict[str, Any]:
    preds = scores.argmax(axis=1)
    result = EvalResult(
        n=len(split),
        errors=int((preds != split.labels).sum()),
        confusion=confusion_matrix(split.labels, preds, num_classes),
    )
    return result.card_metrics("onnxruntime")


def _diffs(
    parent: list[np.ndarray], child: list[np.ndarray], names: list[str]
) -> tuple[dict[str, float], dict[str, float]]:
    """Max and mean absolute difference of each output."""
    maxes, means = {}, {}
    for name, want, have in zip(names, parent, child, strict=True):
        d = np.abs(want.astype(np.float64) - have)
        maxes[name], means[name] = float(d.max()), float(d.mean())
    return maxes, means


def _enforce(parity: dict[str, Any], roles: dict[str, str], bounds: ParityBounds) -> None:
    """Raise when agreement or a difference is outside its bound (NaN fails every comparison)."""
    if not parity["class_agreement"] >= bounds.min_agreement:
        raise QuantizeError(
            f"class agreement with the parent {parity['class_agreement']:.4%} on {parity['n']} test images is below "
            f"{bounds.min_agreement:.4%} ({parity['disagreements']} images change class)"
        )
    limits = asdict(bounds)
    for stat in ("max", "mean"):
        for name, value in parity[f"{stat}_abs_difference"].items():
            limit = limits.get(f"{stat}_{roles[name]}")
            if limit is not None and not value <= limit:
                raise QuantizeError(
                    f"{name} ({roles[name]}) {stat} |difference| from the parent {value:.3g} "
                    f"exceeds its bound {limit:g}"
                )


def _verify(
    session: ort.InferenceSession,
    parent_session: ort.InferenceSession,
    parent: dict[str, Any],
    test: MNISTSplit,
    bounds: ParityBounds,
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Both models on the whole test set: (int8 metrics, parent metrics, parity); raise when a bound is broken."""
    input_name, names = parent["input"]["name"], [o["name"] for o in parent["outputs"]]
    roles = {o["name"]: o["role"] for o in parent["outputs"]}
    scores_at = names.index(parent["scores"]["output"])
    num_classes = len(parent["classes"])
    log.info("running the parent and the int8 model on %d test images", len(test))
    want, got = _run_all(parent_session, input_name, names, test), _run_all(session, input_name, names, test)
    agree = want[scores_at].argmax(axis=1) == got[scores_at].argmax(axis=1)
    maxes, means = _diffs(want, got, names)
    parity: dict[str, Any] = {
        "reference": f"the parent's {GRAPH_FILE} (float32) on the MNIST test set",
        "n": len(test),
        "class_agreement": round(float(agree.mean()), 6),
        "disagreements": int((~agree).sum()),
        "max_abs_difference": maxes,
        "mean_abs_difference": means,
        "bounds": asdict(bounds),
    }
    _enforce(parity, roles, bounds)
    for b in VERIFY_BATCHES:
        images = to_float(np.resize(test.images, (b, *test.images.shape[1:])))
        outs = session.run(names, {input_name: images})
        for name, out, ref in zip(names, outs, want, strict=True):
            if out.shape != (b, *ref.shape[1:]):
                raise QuantizeError(
                    f"{GRAPH_FILE}: {name} has shape {list(out.shape)} at batch {b}, expected {[b, *ref.shape[1:]]}"
                )
        batch_max, _ = _diffs([np.resize(w, (b, *w.shape[1:])) for w in want], outs, names)
        parity[f"batch_{b}"] = batch_max
        _enforce({**parity, "max_abs_difference": batch_max, "mean_abs_difference": {}}, roles, bounds)
    return _metrics(got[scores_at], test, num_classes), _metrics(want[scores_at], test, num_classes), parity


def _card(
    parent: dict[str, Any],
    parent_dir: Path,
    name: str,
    proto: onnx.ModelProto,
    opts: QuantizeOptions,
    rewritten: list[str],
    calibration: dict[str, Any],
    metrics: dict[str, Any],
    parent_metrics: dict[str, Any],
    parity: dict[str, Any],
    command: str | None,
) -> dict[str, Any]:
    """The parent's card with the int8 model's name, metrics, quantization and parent objects (docs/model-card.md)."""
    quantized = sorted(
        {n.name for n in proto.graph.node if n.op_type.startswith("QLinear") or n.op_type in INTEGER_OPS}
        | _dequantized_weights(proto)
    )
    card = {k: v for k, v in parent.items() if k != "files"}
    return {
        **card,
        "name": name,
        "description": f"{parent['description']}; int8 ({opts.quant_format.upper()}, {opts.method} calibration)",
        "metrics": {**metrics, "parent": {k: parent_metrics[k] for k in ("mnist_test_error", "n", "errors")}},
        "quantization": {
            "method": opts.method,
            **({"percentile": PERCENTILE} if opts.method == "percentile" else {}),
            "calibration": calibration,
            "op_types": list(opts.ops),
            "quantized": quantized,
            "float32_op_types": sorted({n.op_type for n in proto.graph.node if n.name not in quantized} - QDQ_OPS),
            "u_hat_einsum_as_matmul": rewritten,
            "format": opts.quant_format.upper(),
            "per_channel": opts.per_channel,
            "activations": "uint8 (asymmetric, per tensor)",
            "weights": "int8 (symmetric, " + ("per output channel)" if opts.per_channel else "per tensor)"),
            "onnxruntime": ort.__version__,
            "command": command,
        },
        "parent": {
            "name": parent["name"],
            "version": parent["version"],
            "capsnet_onnx_sha256": parent["files"][GRAPH_FILE]["sha256"],
            "path": portable_path(parent_dir),
        },
        "export": {
            "onnx_opset": default_opset(proto),
            "tools": {"onnx": onnx.__version__, "onnxruntime": ort.__version__, "python": sys.version.split()[0]},
            **git_state(),
            "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "parity": parity,
        },
    }


def _dequantized_weights(proto: onnx.ModelProto) -> set[str]:
    """QDQ: the consumers of DequantizeLinear nodes whose input is an int8 initializer, i.e. the quantized ops."""
    weights = {i.name for i in proto.graph.initializer if i.data_type == onnx.TensorProto.INT8}
    dequantized = {n.output[0] for n in proto.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in weights}
    return {n.name for n in proto.graph.node if n.op_type != "DequantizeLinear" and dequantized.intersection(n.input)}


def _load_data(data_dir: str | os.PathLike[str] | None) -> tuple[MNISTSplit, MNISTSplit]:
    return load_split(data_dir, "train"), load_split(data_dir, "test")


def quantize_model_dir(
    parent_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    data_dir: str | os.PathLike[str] | None,
    options: QuantizeOptions | None = None,
    bounds: ParityBounds | None = None,
    name: str | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Quantize the float32 model directory `parent_dir` into `out_dir` (written only when verified); return its card.

    Args:
        data_dir: MNIST IDX directory: calibration images come from its training set, verification and
            both test errors from its test set (default: $CAPSNET_DATA_DIR).
        command: the command line, recorded on the card.
    """
    opts, bounds = options or QuantizeOptions(), bounds or ParityBounds()
    parent_dir, out = Path(parent_dir), Path(out_dir)
    name = name or out.resolve().name
    parent = _verified_card(parent_dir)
    check_request(name, parent["export"]["onnx_opset"], out.resolve())
    if out.resolve() == parent_dir.resolve():
        raise QuantizeError(f"--out {out} is the parent model directory; write the int8 model beside it")
    train, test = _load_data(data_dir)
    indices = calibration_indices(len(train), opts.calibration_images, opts.seed)
    input_name = parent["input"]["name"]
    with tempfile.TemporaryDirectory(prefix="capsnet-quantize-") as work:
        proto, rewritten = _quantize_graph(
            parent_dir / GRAPH_FILE, Path(work), input_name, to_float(train.images[indices]), opts
        )
    _check_graph(proto, parent)
    session = create_session(proto.SerializeToString(), "cpu")
    parent_session = create_session(parent_dir / GRAPH_FILE, "cpu")
    metrics, parent_metrics, parity = _verify(session, parent_session, parent, test, bounds)
    log.info(
        "test error: int8 %.4f (%d errors), parent %.4f (%d errors); agreement %.4f",
        metrics["mnist_test_error"], metrics["errors"], parent_metrics["mnist_test_error"], parent_metrics["errors"],
        parity["class_agreement"],
    )  # fmt: skip
    calibration = _calibration_record(indices, len(train), opts.seed)
    card = _card(
        parent, parent_dir, name, proto, opts, rewritten, calibration, metrics, parent_metrics, parity, command
    )
    protos = {GRAPH_FILE: proto}
    if parent.get("decoder"):
        protos[DECODER_FILE] = onnx.load(str(parent_dir / parent["decoder"]["file"]))
    return write_model_dir(out, card, Artifacts(parity=parity, protos=protos))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="capsnet-quantize",
        description="Quantize a float32 model directory to static int8 (calibrated on MNIST training images), "
        "verify it against its parent on the full test set and write a model directory; prints a JSON summary. "
        "`capsnet-quantize bench FLOAT_DIR INT8_DIR` prints their raw ONNX Runtime throughput instead.",
    )
    defaults, bounds = QuantizeOptions(), ParityBounds()
    p.add_argument("parent", metavar="MODEL_DIR", help="float32 model directory, e.g. model/zoo/capsnet-mnist")
    p.add_argument(
        "--out",
        required=True,
        help="model directory to write, e.g. model/zoo/my-capsnet-int8; an existing one only with --force (required)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the model directory --out if it exists (default: refuse; write to a new name instead)",
    )
    add_data_dir(p)
    p.add_argument(
        "--calibration-images",
        type=int,
        default=defaults.calibration_images,
        help=f"training images to calibrate on, drawn with --seed (default: {defaults.calibration_images})",
    )
    p.add_argument(
        "--method",
        choices=sorted(METHODS),
        default=defaults.method,
        help=f"calibration method (default: {defaults.method})",
    )
    p.add_argument(
        "--ops",
        default=",".join(defaults.ops),
        help="comma-separated ONNX op types to quantize; Relu folds into the Conv before it, Gemm is the decoder "
        "inside capsnet.onnx, MatMul would take the routing's products too "
        f"(default: {','.join(defaults.ops)})",
    )
    p.add_argument(
        "--format",
        choices=sorted(FORMATS),
        default=defaults.quant_format,
        help=f"quantized graph format (default: {defaults.quant_format})",
    )
    p.add_argument(
        "--per-tensor", action="store_true", help="one weight scale per tensor (default: per output channel)"
    )
    p.add_argument(
        "--keep-einsum",
        action="store_true",
        help="keep the u_hat Einsum as exported (default: rewrite it as a batched MatMul, which ONNX Runtime runs "
        "faster; the numbers are the same)",
    )
    p.add_argument(
        "--seed", type=int, default=defaults.seed, help=f"seed of the calibration image draw (default: {defaults.seed})"
    )
    p.add_argument(
        "--min-agreement",
        type=float,
        default=bounds.min_agreement,
        help=f"least share of test images classified as the parent does (default: {bounds.min_agreement})",
    )
    for field, value in asdict(bounds).items():
        if field != "min_agreement":
            stat, role = field.split("_", 1)
            p.add_argument(
                f"--{stat}-{role}-delta",
                dest=field,
                type=float,
                default=value,
                help=f"bound on the {stat} |difference| of the {role} output from the parent's (default: {value})",
            )
    p.add_argument(
        "--dry-run", action="store_true", help="quantize and verify into a temporary directory; write nothing to --out"
    )
    return p


def _summary(card: dict[str, Any], out: Path, dry_run: bool) -> dict[str, Any]:
    parity = card["export"]["parity"]
    return {
        "model_dir": None if dry_run else str(out),
        "dry_run": dry_run,
        "name": card["name"],
        "mnist_test_error": card["metrics"]["mnist_test_error"],
        "errors": card["metrics"]["errors"],
        "parent_mnist_test_error": card["metrics"]["parent"]["mnist_test_error"],
        "parent_errors": card["metrics"]["parent"]["errors"],
        "class_agreement": parity["class_agreement"],
        "max_abs_difference": parity["max_abs_difference"],
        "mean_abs_difference": parity["mean_abs_difference"],
        "quantized": card["quantization"]["quantized"],
        "u_hat_einsum_as_matmul": card["quantization"]["u_hat_einsum_as_matmul"],
        "files": {f: e["bytes"] for f, e in card["files"].items()},
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if argv[:1] == ["bench"]:
        from training.benchmarks.quantize import main as bench_main

        return bench_main(argv[1:])
    args = build_parser().parse_args(argv)
    out = Path(args.out)
    name = out.resolve().name
    bounds = ParityBounds(**{f: getattr(args, f) for f in asdict(ParityBounds())})
    command = shlex.join(["capsnet-quantize", *portable_command(argv)])
    try:
        options = QuantizeOptions(
            calibration_images=args.calibration_images, method=args.method,
            ops=tuple(o for o in args.ops.split(",") if o), quant_format=args.format,
            per_channel=not args.per_tensor, rewrite_u_hat=not args.keep_einsum, seed=args.seed,
        )  # fmt: skip
        if not args.dry_run and out.resolve() != Path(args.parent).resolve():  # the parent: refused below
            check_out_dir(out, args.force)
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / name if args.dry_run else out
            card = quantize_model_dir(
                args.parent, target, data_dir=args.data_dir, options=options, bounds=bounds, name=name, command=command
            )
    except (ValueError, FileNotFoundError) as e:  # QuantizeError, ModelDirError and IDXError are ValueErrors
        return cli_error("capsnet-quantize", e)
    print(json.dumps(_summary(card, out, args.dry_run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
