"""Rebuild a PyTorch model from an exported model directory (ONNX initializers + card) and re-export it.

For when the training checkpoint is gone but the model directory is not: the exporter names every
ONNX initializer after its state_dict key under the `model.` prefix of `ImageGraph`, so the weights
map back one to one. The rebuilt model must reproduce the old graphs' outputs within the parity
tolerances recorded on the old card before anything is written (capsnet-export --from-model-dir) or
trained (capsnet-train --init-from, `warm_start`).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import nn

from service.contract import GRAPH_FILE, ModelDirError, create_session, load_model_dir, portable_path
from training.data.mnist import MNISTSplit, to_float
from training.export.graphs import TOLERANCES
from training.fitting.architectures import get_architecture

log = logging.getLogger(__name__)

GRAPH_PREFIX = "model."  # ImageGraph / DecoderGraph hold the model as `self.model`
PARITY_IMAGES = 256  # MNIST test images compared between the old graphs and the rebuilt model
PARITY_BATCH = 64  # compared in batches of the exporter's size: EM routing's float32 sums depend on the batch


class RebuildError(ValueError):
    """The model directory cannot be turned back into a PyTorch model that reproduces it."""


def _initializers(path: Path) -> dict[str, np.ndarray]:
    proto = onnx.load(str(path))
    return {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}


def _state_dict(model_dir: Path, card: dict[str, Any], model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state_dict from the graphs' initializers; decoder weights must agree between the two files."""
    weights = _initializers(model_dir / "capsnet.onnx")
    if card.get("decoder"):
        for name, array in _initializers(model_dir / card["decoder"]["file"]).items():
            if name in weights and not np.array_equal(weights[name], array):
                raise RebuildError(f"{name} differs between capsnet.onnx and {card['decoder']['file']}")
            weights.setdefault(name, array)
    wanted = model.state_dict()
    state = {
        k[len(GRAPH_PREFIX) :]: torch.from_numpy(v.copy()) for k, v in weights.items() if k.startswith(GRAPH_PREFIX)
    }
    derived = {k: b for k, b in model.named_buffers() if k not in wanted}  # non-persistent: built from the config
    for key in [k for k in state if k in derived]:
        if not torch.equal(state.pop(key).to(derived[key].dtype), derived[key]):
            raise RebuildError(f"{key}: the graph's constant differs from the one the card's model_config builds")
    missing, extra = sorted(set(wanted) - set(state)), sorted(set(state) - set(wanted))
    if missing or extra:
        raise RebuildError(
            f"{model_dir}: the graphs' initializers do not match a {card['architecture']!r} model of the card's "
            f"model_config (missing {missing}, unexpected {extra})"
        )
    for key, tensor in state.items():
        if tensor.shape != wanted[key].shape:
            raise RebuildError(f"{key}: shape {list(tensor.shape)} in the graph, {list(wanted[key].shape)} expected")
    return state


def _worst(want: np.ndarray, have: np.ndarray) -> float:
    return float(np.max(np.abs(want.astype(np.float64) - have))) if want.size else 0.0


def check_reproduces(model: nn.Module, model_dir: Path, card: dict[str, Any], images: np.ndarray) -> dict[str, float]:
    """Compare the rebuilt model with the old capsnet.onnx (and decoder.onnx) on `images`; return the max differences.

    Every output of the old card is compared by its role, at the tolerance the old card records (a role the card
    records none for, at the exporter's).
    """
    arch = get_architecture(card["architecture"])
    assert arch.export is not None
    spec = arch.export(model, card["model_config"])
    tolerance = {**TOLERANCES, **card["export"]["parity"]["tolerance"]}  # a role added since: today's tolerance
    x = to_float(images) if images.dtype == np.uint8 else images.astype(np.float32)
    parts: dict[str, list[np.ndarray]] = {o.name: [] for o in spec.outputs}
    with torch.no_grad():
        for start in range(0, len(x), PARITY_BATCH):
            out = spec.forward(model, torch.from_numpy(x[start : start + PARITY_BATCH]))
            for o, t in zip(spec.outputs, out, strict=True):
                parts[o.name].append(t.numpy())
    mine = {name: np.concatenate(p) for name, p in parts.items()}
    old = card["outputs"]
    session = create_session(model_dir / GRAPH_FILE, "cpu")
    runs = [session.run([o["name"] for o in old], {card["input"]["name"]: x[start : start + PARITY_BATCH]})
            for start in range(0, len(x), PARITY_BATCH)]  # fmt: skip
    got = [np.concatenate([run[k] for run in runs]) for k in range(len(old))]
    diffs: dict[str, float] = {}
    for entry, array in zip(old, got, strict=True):
        diffs[f"capsnet.onnx:{entry['name']}"] = _check(
            entry["name"], mine[entry["name"]], array, tolerance[entry["role"]]
        )
    if card.get("decoder") and spec.decode is not None:
        poses = mine[next(o["name"] for o in old if o["role"] == "poses")]
        mask = np.eye(poses.shape[1], dtype=np.float32)[np.arange(len(x)) % poses.shape[1]]
        decoder = create_session(model_dir / card["decoder"]["file"], "cpu")
        (want,) = decoder.run(None, {"poses": poses, "mask": mask})
        with torch.no_grad():
            have = spec.decode(model, torch.from_numpy(poses), torch.from_numpy(mask)).numpy()
        diffs["decoder.onnx:reconstruction"] = _check("decoder reconstruction", want, have, tolerance["reconstruction"])
    return diffs


def _check(name: str, want: np.ndarray, have: np.ndarray, tolerance: float) -> float:
    """The largest difference, within `tolerance` times the output's largest magnitude where that exceeds 1 (the
    exporter's rule: EM's pose matrices are unbounded)."""
    if want.shape != have.shape:
        raise RebuildError(f"{name}: the rebuilt model gives shape {list(want.shape)}, the graph {list(have.shape)}")
    diff = _worst(want, have)
    tolerance *= max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    if not diff <= tolerance:
        raise RebuildError(f"{name}: the rebuilt model differs from the graph by {diff:.3g} (tolerance {tolerance:g})")
    return diff


def rebuild_model(
    model_dir: str | os.PathLike[str], test: MNISTSplit | None = None
) -> tuple[nn.Module, dict[str, Any], dict[str, float]]:
    """Rebuild the PyTorch model of a verified model directory; return it (eval mode), its card and the parity.

    Args:
        test: MNIST test images to compare the rebuilt model with the graphs on (the first PARITY_IMAGES);
            None: uniform random images (seed 0).
    """
    root = Path(model_dir)
    return _rebuild(root, load_model_dir(root).raw_card, test)


def _rebuild(
    root: Path, card: dict[str, Any], test: MNISTSplit | None
) -> tuple[nn.Module, dict[str, Any], dict[str, float]]:
    """`rebuild_model` of a directory whose files `load_model_dir` has verified against `card`."""
    arch = get_architecture(card["architecture"])
    if arch.export is None:
        raise RebuildError(f"architecture {card['architecture']!r} has no export spec")
    model = arch.build(card["model_config"]).eval()
    model.load_state_dict(_state_dict(root, card, model), strict=True)
    shape = tuple(card["input"]["shape"][1:])
    if test is None:
        images = np.random.default_rng(0).random((PARITY_IMAGES, *shape), dtype=np.float32)
    else:
        images = test.images[:PARITY_IMAGES].reshape(-1, *shape)
    parity = check_reproduces(model, root, card, images)
    log.info("rebuilt %s from its graphs; max differences %s", root, parity)
    return model, card, parity


@dataclass(frozen=True)
class WarmStart:
    """A new run's first weights, rebuilt from a model directory (capsnet-train --init-from), and their origin."""

    state_dict: dict[str, torch.Tensor]
    provenance: dict[str, Any]  # the run's `init_from`: {"path", "name", "version", "capsnet_onnx_sha256"}


def _shown(config: dict[str, Any], key: str) -> str:
    return json.dumps(config[key]) if key in config else "absent"


def check_same_model(model_dir: Path, card: dict[str, Any], arch: str, model_config: dict[str, Any]) -> None:
    """Refuse a model directory whose architecture or model_config differs from the model a run builds."""
    if card["architecture"] != arch:
        differ = [f"architecture {json.dumps(card['architecture'])} there, {json.dumps(arch)} here"]
    else:
        theirs: dict[str, Any] = card.get("model_config") or {}
        differ = [
            f"{key} {_shown(theirs, key)} there, {_shown(model_config, key)} here"
            for key in sorted(theirs.keys() | model_config.keys())
            if key not in theirs or key not in model_config or theirs[key] != model_config[key]
        ]
    if differ:
        raise RebuildError(
            f"--init-from {model_dir} holds a different model from the one this run builds ({'; '.join(differ)}): "
            "set --arch, --preset, --routing, --routing-iterations and --canvas to match its card"
        )


def warm_start(
    model_dir: str | os.PathLike[str], arch: str, model_config: dict[str, Any], test: MNISTSplit | None = None
) -> WarmStart:
    """The weights of the model in `model_dir` for a new run of `arch` with `model_config`, which must be the card's.

    The directory is verified against its card, the model rebuilt from its graphs and checked to reproduce
    them (`rebuild_model`; `test` as there). Builds the model once, so it draws from torch's global RNG:
    seed the run's own model after this.
    """
    root = Path(model_dir)
    if not root.is_dir():
        raise RebuildError(f"--init-from {root}: no such directory (give a model directory such as model/zoo/<name>)")
    try:
        card = load_model_dir(root).raw_card
    except ModelDirError as e:
        raise RebuildError(f"--init-from {root}: {e}") from e
    if card.get("quantization"):
        parent = (card.get("parent") or {}).get("path", "its float32 parent")
        raise RebuildError(f"--init-from {root} is a quantized model; start from the float32 model ({parent})")
    check_same_model(root, card, arch, model_config)
    model, card, _ = _rebuild(root, card, test)
    provenance = {
        "path": portable_path(model_dir),
        "name": card["name"],
        "version": card["version"],
        "capsnet_onnx_sha256": card["files"][GRAPH_FILE]["sha256"],
    }
    return WarmStart(model.state_dict(), provenance)
