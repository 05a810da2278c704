"""Expose a tensor the exported graph already computes as a new output, without re-exporting the model.

`python -m training.export.expose model/zoo/capsnet-em-mnist --tensor sigmoid_2 --name parts --role parts` adds
the tensor (squeezed of unit axes after the batch) as output `parts` of capsnet.onnx, checks on MNIST test images
(or random ones) that every existing output is bit for bit what it was, and writes the card: the new output, the
file's hash and size, version + 1 and `export.exposed` (which tensor, when). The weights and the arithmetic are
untouched, so the card's metrics, parity and calibration still hold. For a model whose checkpoint is gone and
whose rebuilt PyTorch model no longer reproduces the graph within the parity tolerance.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from service.contract import GRAPH_FILE, ModelDirError, create_session, parse_card, read_card, write_card
from training.data.mnist import load_split, to_float
from training.options import add_data_dir

log = logging.getLogger(__name__)

CHECK_IMAGES = 256  # images on which the old and new graphs must agree
CHECK_BATCH = 64
ROLES = ("parts", "explanation")


class ExposeError(ValueError):
    """The tensor cannot be exposed (unknown, already an output, or the graph's outputs changed)."""


def expose(proto: onnx.ModelProto, tensor: str, name: str) -> onnx.ModelProto:
    """A copy of `proto` with `tensor` as the new last output `name`, unit axes after the batch squeezed away."""
    produced = {out for node in proto.graph.node for out in node.output}
    if tensor not in produced:
        raise ExposeError(f"the graph computes no tensor {tensor!r}")
    if name in produced or name in {o.name for o in proto.graph.output}:
        raise ExposeError(f"the graph already has a tensor or output named {name!r}")
    shapes = onnx.shape_inference.infer_shapes(proto).graph.value_info
    dims = next((v.type.tensor_type.shape.dim for v in shapes if v.name == tensor), None)
    if dims is None:
        raise ExposeError(f"the shape of {tensor!r} cannot be inferred")
    unit = [i for i, d in enumerate(dims) if i > 0 and d.HasField("dim_value") and d.dim_value == 1]
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    axes = f"{name}_unit_axes"
    out.graph.initializer.append(helper.make_tensor(axes, TensorProto.INT64, [len(unit)], unit))
    out.graph.node.append(helper.make_node("Squeeze", [tensor, axes], [name], name=f"expose_{name}"))
    shape = ["batch", *[d.dim_value for i, d in enumerate(dims) if i > 0 and i not in unit]]
    out.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
    onnx.checker.check_model(out)
    return out


def check_unchanged(old: Path, new: Path, input_name: str, outputs: list[str], images: np.ndarray) -> None:
    """Every output of `old` equals `new`'s bit for bit on `images`, batch by batch."""
    a, b = create_session(old, "cpu"), create_session(new, "cpu")
    for start in range(0, len(images), CHECK_BATCH):
        feed = {input_name: images[start : start + CHECK_BATCH]}
        for output, x, y in zip(outputs, a.run(outputs, feed), b.run(outputs, feed), strict=True):
            if not np.array_equal(x, y):
                raise ExposeError(f"output {output!r} changed when exposing the tensor")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.export.expose", description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--tensor", required=True, help="the graph's name of the tensor to expose")
    parser.add_argument("--name", required=True, help="the new output's name")
    parser.add_argument("--role", required=True, choices=ROLES)
    parser.add_argument("--description", required=True, help="what the output holds, for the card")
    add_data_dir(parser, "MNIST IDX directory for the test images the graphs must agree on (default: random images)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        summary = run(args.model_dir, args.tensor, args.name, args.role, args.description, args.data_dir)
    except (ExposeError, OSError) as e:
        print(f"expose: error: {e}", file=sys.stderr)
        return 2
    print(summary)
    return 0


def run(model_dir: Path, tensor: str, name: str, role: str, description: str, data_dir: Path | None) -> str:
    card = read_card(model_dir)
    graph = model_dir / GRAPH_FILE
    proto = onnx.load(str(graph))
    new = expose(proto, tensor, name)
    if data_dir is not None:
        images = to_float(load_split(data_dir, "test").images[:CHECK_IMAGES])
    else:
        shape = card["input"]["shape"][1:]
        images = np.random.default_rng(0).random((CHECK_IMAGES, *shape), dtype=np.float32)
    staged = graph.with_suffix(".exposing.onnx")
    onnx.save(new, str(staged))
    try:
        check_unchanged(graph, staged, card["input"]["name"], [o["name"] for o in card["outputs"]], images)
        session = create_session(staged, "cpu")
        (sample,) = session.run([name], {card["input"]["name"]: images[:2]})
        checked = f"{len(images)} {'MNIST test' if data_dir else 'random'} images"
        entry = {"name": name, "shape": [-1, *sample.shape[1:]], "datatype": "FP32", "role": role,
                 "description": description}  # fmt: skip
        card = exposed_card(card, staged.read_bytes(), tensor, entry, checked)
        try:
            parse_card(card)  # before the graph is replaced: a card the service would refuse changes nothing
        except ModelDirError as e:
            raise ExposeError(str(e)) from e
        staged.replace(graph)
    finally:
        staged.unlink(missing_ok=True)
    write_card(model_dir, card)
    return f"{model_dir.name} version {card['version']}: output {name!r} ({role}, shape {entry['shape']}) added"


def exposed_card(
    card: dict[str, Any], graph: bytes, tensor: str, entry: dict[str, Any], checked: str
) -> dict[str, Any]:
    """The card after exposing: the new output `entry`, the graph's hash and size, version + 1 and
    `export.exposed` (which tensor, when, on what the other outputs were `checked` unchanged)."""
    version = str(card["version"])
    at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    exposed = {"tensor": tensor, "output": entry["name"], "at": at, "unchanged_on": checked}
    return {
        **card,
        "outputs": [*card["outputs"], entry],
        "files": {**card["files"], GRAPH_FILE: {"sha256": hashlib.sha256(graph).hexdigest(), "bytes": len(graph)}},
        "version": str(int(version) + 1) if version.isdigit() else f"{version}+1",
        "export": {**card["export"], "exposed": [*card["export"].get("exposed", []), exposed]},
    }


if __name__ == "__main__":
    sys.exit(main())
