"""The card of an exported model (docs/model-card.md), built from measured outputs, and its copy inside each graph."""

from __future__ import annotations

import json
import platform
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch

from service.contract import CARD_FORMAT_VERSION, DECODER_FILE
from training.fitting.architectures import ExportSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
INPUT_NAME = "image"
DECODER_INPUTS = ("poses", "mask")


def git_state() -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", "model", "training")
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def tool_versions() -> dict[str, str]:
    return {
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "python": platform.python_version(),
    }


def stamp(proto: onnx.ModelProto, card: dict[str, Any]) -> bytes:
    """Carry the card (without `files`) in metadata_props; return the serialized model."""
    del proto.metadata_props[:]
    onnx.helper.set_model_props(
        proto,
        {
            "capsnet.card": json.dumps(card),
            "capsnet.format_version": str(card["format_version"]),
            "capsnet.name": card["name"],
            "capsnet.version": card["version"],
            "capsnet.architecture": card["architecture"],
            "capsnet.classes": json.dumps(card["classes"]),
            "capsnet.scores_output": card["scores"]["output"],
        },
    )
    proto.producer_name = "capsnet-serve"
    proto.doc_string = card["description"]
    return proto.SerializeToString()


def output_shape(array: np.ndarray) -> list[int]:
    return [-1, *(int(d) for d in array.shape[1:])]


@dataclass(frozen=True)
class CardIdentity:
    """What the card says the model is, as opposed to what export measures."""

    name: str
    version: str
    arch: str
    model_config: dict[str, Any]
    parameters: int


def build_card(
    identity: CardIdentity,
    spec: ExportSpec,
    outputs: list[np.ndarray],
    decoder_inputs: list[np.ndarray],
    parity: dict[str, Any],
    opset: int,
    metrics: dict[str, Any] | None = None,
    training_info: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The card without `files` (docs/model-card.md); shapes come from the measured PyTorch outputs.

    Args:
        outputs: the image graph's outputs in the spec's order; decoder_inputs: (poses, masks), or [] without
            a decoder; parity: the card's `export.parity`.
    """
    roles = [o.role for o in spec.outputs]
    num_classes = int(outputs[roles.index("scores")].shape[1])
    image_shape = [-1, *spec.input_shape]
    poses = outputs[roles.index("poses")] if "poses" in roles else None
    decoder = None
    if decoder_inputs:
        decoder = {
            "file": DECODER_FILE,
            "inputs": [
                {"name": n, "shape": output_shape(a), "datatype": "FP32"}
                for n, a in zip(DECODER_INPUTS, decoder_inputs, strict=True)
            ],
            "output": {"name": "reconstruction", "shape": image_shape, "datatype": "FP32"},
        }
    return {
        "format_version": CARD_FORMAT_VERSION,
        "name": identity.name,
        "version": identity.version,
        "description": spec.description,
        "architecture": identity.arch,
        "model_config": identity.model_config,
        "routing": spec.routing,
        "parameters": identity.parameters,
        "input": {
            "name": INPUT_NAME,
            "shape": image_shape,
            "datatype": "FP32",
            "range": [0.0, 1.0],
            "layout": "NCHW",
            "normalization": "pixel / 255: white digit on black, as in the MNIST files; no mean or std shift",
        },
        "classes": [str(k) for k in range(num_classes)],
        "outputs": [
            {
                "name": o.name,
                "shape": output_shape(a),
                "datatype": "FP32",
                "role": o.role,
                "description": o.description,
                **o.attributes,
            }
            for o, a in zip(spec.outputs, outputs, strict=True)
        ],
        "scores": {"output": spec.outputs[roles.index("scores")].name, "kind": spec.scores_kind},
        "pose_shape": None if poses is None else [int(d) for d in poses.shape[2:]],
        "decoder": decoder,
        **({"serving": spec.serving} if spec.serving else {}),
        "metrics": {"mnist_test_error": None, "n": 0, "evaluated_with": None, **(metrics or {})},
        "training": {
            "command": None,
            "epochs": None,
            "seed": None,
            "data_sha256": {},
            "history": [],
            **(training_info or {}),
        },
        "export": {
            "onnx_opset": opset,
            "tools": tool_versions(),
            **git_state(),
            "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "parity": parity,
        },
    }
