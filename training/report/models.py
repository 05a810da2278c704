"""Capsule models for Figure 4 and speed, behind numpy calls: a model directory (ONNX Runtime) or a checkpoint."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from service.contract import CARD_FILE, GRAPH_FILE, create_session, read_card
from training.fitting.architectures import get_architecture
from training.report.common import (
    Context,
    NotMeasured,
    shown,
)

log = logging.getLogger(__name__)


@dataclass
class CapsuleModel:
    """A capsule network behind numpy calls, from a model directory (ONNX Runtime) or a checkpoint (PyTorch)."""

    source: str
    backend: str
    trained: bool
    input_shape: tuple[int, int, int]
    classify: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # images -> scores (N, K), poses (N, K, D)
    decode: Callable[[np.ndarray, np.ndarray], np.ndarray] | None  # poses (N, K, D), mask (N, K) -> images


def model_from_dir(model_dir: Path) -> CapsuleModel:
    card = read_card(model_dir)
    names = {o["role"]: o["name"] for o in card["outputs"]}
    if "poses" not in names:
        raise NotMeasured(f"{model_dir}: the card has no poses output")
    session = create_session(model_dir / GRAPH_FILE, "cpu", torch.get_num_threads())
    input_name = card["input"]["name"]

    def classify(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        scores, poses = session.run([card["scores"]["output"], names["poses"]], {input_name: images})
        return scores, poses

    decode = None
    if card.get("decoder"):
        spec = card["decoder"]
        dec = create_session(model_dir / spec["file"], "cpu", torch.get_num_threads())
        pose_in, mask_in = (i["name"] for i in spec["inputs"])

        def decode(poses: np.ndarray, mask: np.ndarray) -> np.ndarray:
            (out,) = dec.run([spec["output"]["name"]], {pose_in: poses, mask_in: mask})
            return np.asarray(out)

    trained = (card.get("metrics") or {}).get("mnist_test_error") is not None
    shape = tuple(card["input"]["shape"][1:])
    return CapsuleModel(shown(model_dir), "onnxruntime", trained, shape, classify, decode)


def model_from_checkpoint(path: Path) -> CapsuleModel:
    from model.capsnet import CapsNet, capsule_length
    from training.fitting.checkpoint import load_model

    model, _, state = load_model(path)
    if not isinstance(model, CapsNet):
        raise NotMeasured(f"{path}: Figure 4 needs a CapsNet with a decoder, the checkpoint holds {state['arch']!r}")
    cfg = model.cfg

    def classify(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            poses, _ = model.encode(torch.from_numpy(images))
            return capsule_length(poses).numpy(), poses.numpy()

    def decode(poses: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model.decode(torch.from_numpy(poses), torch.from_numpy(mask)).numpy()

    shape = (cfg.in_channels, cfg.image_size, cfg.image_size)
    return CapsuleModel(shown(path), "pytorch", True, shape, classify, decode if model.decoder else None)


def zoo_models(ctx: Context) -> list[Path]:
    return sorted(p.parent for p in ctx.zoo.glob(f"*/{CARD_FILE}"))


def fresh_model_dir(ctx: Context) -> Path:
    """An untrained CapsNet of the run's preset, exported with capsnet-export's library call (cached per run)."""
    key = ctx.sizes.preset
    if key in ctx.fresh:
        return ctx.fresh[key]
    try:
        from training.export.exporter import export_module
    except ImportError as e:
        raise NotMeasured(f"training.export.exporter is not available to export a model ({e})") from e
    arch = get_architecture("dynamic")
    config = arch.make_config(ctx.sizes.preset, {})
    torch.manual_seed(ctx.seed)
    out = ctx.scratch / f"fresh-{key}"
    export_module(arch.build(config), "dynamic", config, out, name=f"fresh-{key}", torchscript=False, seed=ctx.seed)
    ctx.fresh[key] = out
    return out


def capsule_model(ctx: Context, need_decoder: bool) -> CapsuleModel:
    """--model, else the first bundled dynamic-routing model (with a decoder when needed), else (tiny) a fresh one."""
    if ctx.model is not None:
        if ctx.model.is_dir():
            return model_from_dir(ctx.model)
        return model_from_checkpoint(ctx.model)
    for d in zoo_models(ctx):
        card = read_card(d)
        if card.get("architecture") == "dynamic" and (card.get("decoder") or not need_decoder):
            return model_from_dir(d)
    if ctx.tiny:
        return model_from_dir(fresh_model_dir(ctx))
    raise NotMeasured(f"no trained dynamic-routing model in {ctx.zoo}; bundle one with capsnet-export or pass --model")
