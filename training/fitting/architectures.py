"""The trainable architectures: how to build each, its loss and its class scores.

One table keeps the train loop, evaluation and export free of per-architecture branches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from model.baseline import BASELINE_PRESETS, BaselineCNN, BaselineConfig
from model.capsnet import CapsNet
from model.config import EM_PRESETS, CapsNetConfig, EMCapsNetConfig
from model.em import EMCapsNet
from model.losses import margin_loss, margin_loss_multi, reconstruction_loss, spread_loss, spread_margin


@dataclass(frozen=True)
class LossParts:
    total: torch.Tensor
    parts: dict[str, torch.Tensor]


OutputRole = Literal["scores", "poses", "reconstruction", "explanation", "parts"]


@dataclass(frozen=True)
class ExportOutput:
    """One named output of `capsnet.onnx`; the roles are defined in docs/model-card.md."""

    name: str
    role: OutputRole
    description: str
    attributes: dict[str, Any] = field(default_factory=dict)  # extra fields of the card's output entry


@dataclass(frozen=True)
class ExportSpec:
    """What `training.export.exporter` needs to know about one built model; shapes are measured, not declared.

    Args:
        outputs: the outputs of `capsnet.onnx` in order; exactly one has role "scores".
        forward: (model, images (N, C, H, W)) -> the tensors of `outputs`, in order, at inference
            (no labels: any masking uses the model's own prediction).
        decode: (model, poses (N, K, *pose_shape), mask (N, K)) -> reconstruction (N, C, H, W);
            None when the model has no decoder (no `decoder.onnx`, the card's `decoder` is null).
        routing: the card's routing object, {"algorithm", "variant", "iterations"}.
        scores_kind, description: the card's "capsule_length" or "activation", and its one-line description.
        input_shape, serving: one image, (C, H, W); the card's `serving` hints for the service, or None.
    """

    outputs: tuple[ExportOutput, ...]
    forward: Callable[[nn.Module, torch.Tensor], tuple[torch.Tensor, ...]]
    decode: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None
    routing: dict[str, Any]
    scores_kind: Literal["capsule_length", "activation"]
    description: str
    input_shape: tuple[int, int, int] = (1, 28, 28)
    serving: dict[str, Any] | None = None


@dataclass(frozen=True)
class Architecture:
    """Args:
    build: model config dict -> module.
    make_config: (preset name, overrides) -> model config dict.
    loss: (outputs, images, labels, training progress in [0, 1]) -> LossParts.
    scores: outputs -> class scores (B, K); the argmax is the prediction.
    forward: (model, images, labels or None) -> outputs.
    export: (model, model config dict) -> ExportSpec; None when the architecture cannot be exported.
    default_lr: Adam's learning rate when the run does not set one (`capsnet-train --lr`).
    absent: outputs of images with no digit -> the loss that says no class is present (outlier exposure,
        `capsnet-train --exposure`); None when the architecture's scores cannot say it.
    """

    name: str
    build: Callable[[dict[str, Any]], nn.Module]
    make_config: Callable[[str, dict[str, Any]], dict[str, Any]]
    loss: Callable[[Any, torch.Tensor, torch.Tensor, float], LossParts]
    scores: Callable[[Any], torch.Tensor]
    forward: Callable[[nn.Module, torch.Tensor, torch.Tensor | None], Any]
    export: Callable[[nn.Module, dict[str, Any]], ExportSpec] | None = None
    default_lr: float = 1e-3
    absent: Callable[[Any], torch.Tensor] | None = None


RECONSTRUCTION_WEIGHT = 0.0005  # Sabour et al. 2017 §4.1
# EM routing learns 10x faster at 0.01 than at the 0.001 of the other architectures (docs/em-routing.md, "Training")
EM_LEARNING_RATE = 0.01
# EM routing's ONNX Runtime rate falls as the batch grows (its vote tensors leave the caches) and is best at batch 1
# with the service's parallel runs (docs/em-model.md): the service runs EM models one image per run.
EM_SERVING = {
    "max_batch_size": 1,
    "why": "EM routing runs fastest one image per run on ONNX Runtime's CPU provider, with parallel runs "
    "(python -m training.benchmarks.speed --arch em); larger batches are slower and need more memory",
}


def _dynamic_config(preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    clean = {k: v for k, v in overrides.items() if v is not None}
    if preset == "paper":
        return CapsNetConfig(**clean).to_dict()
    if preset == "tiny":
        return CapsNetConfig.tiny(**clean).to_dict()
    raise ValueError(f"unknown preset {preset!r} for arch 'dynamic' (choose paper or tiny)")


def _dynamic_loss(out: Any, images: torch.Tensor, labels: torch.Tensor, progress: float) -> LossParts:
    margin = margin_loss(out.lengths.float(), labels)
    recon = reconstruction_loss(out.reconstruction.float(), images)
    return LossParts(margin + RECONSTRUCTION_WEIGHT * recon, {"margin_loss": margin, "reconstruction_loss": recon})


def _dynamic_export_forward(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
    out, explanation = cast(CapsNet, model).explain(images)  # masks the decoder input with the longest capsule
    if cast(CapsNet, model).decoder is None:
        return out.lengths, out.poses, explanation
    # reconstruction (N, pixels) -> (N, C, H, W)
    return out.lengths, out.poses, out.reconstruction.reshape(images.shape), explanation


def _dynamic_decode(model: nn.Module, poses: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    cfg = cast(CapsNet, model).cfg
    flat = cast(CapsNet, model).decode(poses, mask)  # (N, pixels)
    return flat.reshape(-1, cfg.in_channels, cfg.image_size, cfg.image_size)


def _dynamic_export(model: nn.Module, config: dict[str, Any]) -> ExportSpec:
    cfg = CapsNetConfig.from_dict(config)
    outputs = [
        ExportOutput("lengths", "scores", "capsule lengths |v_j| in [0, 1): the presence probability of each class"),
        ExportOutput("poses", "poses", "DigitCaps activity vectors v_j: the instantiation parameters of each class"),
    ]
    if cfg.use_decoder:
        outputs.append(ExportOutput("reconstruction", "reconstruction", "decoder output from the longest capsule"))
    size, stride = cfg.primary_receptive_field
    outputs.append(
        ExportOutput(
            "explanation",
            "explanation",
            "routing map: final coupling c_ij of each primary capsule to each class times |u_hat_j|i|, summed over "
            "the capsule types at each PrimaryCaps grid cell (Sabour et al. 2017 Procedure 1)",
            {"receptive_field": {"size": size, "stride": stride}},
        )
    )
    return ExportSpec(
        outputs=tuple(outputs),
        forward=_dynamic_export_forward,
        decode=_dynamic_decode if cfg.use_decoder else None,
        routing={"algorithm": "dynamic", "variant": cfg.routing, "iterations": cfg.routing_iterations},
        scores_kind="capsule_length",
        description=f"CapsNet with dynamic routing (Sabour et al. 2017; {cfg.routing}, "
        f"{cfg.routing_iterations} iterations) for MNIST digits",
        input_shape=(cfg.in_channels, cfg.image_size, cfg.image_size),
    )


def _no_class_present(scores: torch.Tensor) -> torch.Tensor:
    """Margin loss with no class present (eq. 4 with all T_k = 0): every capsule length, or EM activation, below
    m- = 0.1. A digit's own EM activation ends at least the spread margin, 0.9, above the others', so the two stay
    apart."""
    scores = scores.float()
    return margin_loss_multi(scores, torch.zeros_like(scores))


def _em_config(preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    clean = {k: v for k, v in overrides.items() if v is not None}
    if "routing" in clean:
        raise ValueError(
            f"--routing {clean['routing']} applies to --arch dynamic only; "
            "arch 'em' has a single routing algorithm (--routing-iterations still applies)"
        )
    if preset not in EM_PRESETS:
        raise ValueError(f"unknown preset {preset!r} for arch 'em' (choose paper, small or tiny)")
    return cast(EMCapsNetConfig, EM_PRESETS[preset](**clean)).to_dict()


def _em_loss(out: Any, images: torch.Tensor, labels: torch.Tensor, progress: float) -> LossParts:
    margin = spread_margin(progress)  # 0.2 -> 0.9 over the first half of training, then held (docs/em-routing.md)
    loss = spread_loss(out.activations.float(), labels, margin)
    return LossParts(loss, {"spread_loss": loss, "spread_margin": torch.tensor(margin)})


def _em_export(model: nn.Module, config: dict[str, Any]) -> ExportSpec:
    cfg = EMCapsNetConfig.from_dict(config)
    return ExportSpec(
        outputs=(
            ExportOutput(
                "activations", "scores", "class capsule activations a_j in (0, 1): the presence of each class"
            ),
            ExportOutput("poses", "poses", "class capsule 4x4 pose matrices M_j (the mean of each class's votes)"),
            ExportOutput(
                "parts",
                "parts",
                "ConvCaps2 activations (cells x capsule types): the parts present in the image, from which the class "
                "capsules are routed",
            ),
        ),
        forward=lambda m, images: tuple(m(images)),
        decode=None,
        routing={"algorithm": "em", "variant": None, "iterations": cfg.routing_iterations},
        scores_kind="activation",
        description=f"Matrix capsules with EM routing (Hinton et al. 2018; {cfg.routing_iterations} iterations) "
        "for MNIST digits",
        input_shape=(cfg.in_channels, cfg.image_size, cfg.image_size),
        serving=EM_SERVING,
    )


def _baseline_config(preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    clean = {k: v for k, v in overrides.items() if v is not None}
    for key in ("routing", "routing_iterations"):
        if key in clean:
            raise ValueError(f"--{key.replace('_', '-')} does not apply to arch 'baseline' (a CNN has no routing)")
    if preset not in BASELINE_PRESETS:
        raise ValueError(f"unknown preset {preset!r} for arch 'baseline' (choose paper or tiny)")
    return cast(BaselineConfig, BASELINE_PRESETS[preset](**clean)).to_dict()


def _baseline_loss(out: Any, images: torch.Tensor, labels: torch.Tensor, progress: float) -> LossParts:
    loss = F.cross_entropy(out.logits.float(), labels)  # Sabour et al. 2017 §5: softmax with cross entropy
    return LossParts(loss, {"cross_entropy": loss})


ARCHITECTURES: dict[str, Architecture] = {
    "dynamic": Architecture(
        name="dynamic",
        build=lambda cfg: CapsNet(CapsNetConfig.from_dict(cfg)),
        make_config=_dynamic_config,
        loss=_dynamic_loss,
        scores=lambda out: out.lengths,
        forward=lambda model, images, labels: model(images, labels),
        export=_dynamic_export,
        absent=lambda out: _no_class_present(out.lengths),
    ),
    "em": Architecture(
        name="em",
        build=lambda cfg: EMCapsNet(EMCapsNetConfig.from_dict(cfg)),
        make_config=_em_config,
        loss=_em_loss,
        scores=lambda out: out.activations,
        forward=lambda model, images, labels: model(images, labels),
        export=_em_export,
        default_lr=EM_LEARNING_RATE,
        absent=lambda out: _no_class_present(out.activations),
    ),
    "baseline": Architecture(
        name="baseline",
        build=lambda cfg: BaselineCNN(BaselineConfig.from_dict(cfg)),
        make_config=_baseline_config,
        loss=_baseline_loss,
        scores=lambda out: out.probabilities,
        forward=lambda model, images, labels: model(images),
    ),
}


def get_architecture(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {name!r}; choose one of {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[name]
