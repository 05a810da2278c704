"""Fixtures of the "not a digit" calibration tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised tiny CapsNet exported as a model directory named 'tiny'."""
    import torch

    from model.capsnet import CapsNet
    from model.config import CapsNetConfig
    from training.export.exporter import export_module

    torch.manual_seed(0)
    cfg = CapsNetConfig.tiny()
    out = tmp_path_factory.mktemp("zoo") / "tiny"
    export_module(CapsNet(cfg).eval(), "dynamic", cfg.to_dict(), out, name="tiny", torchscript=False)
    return out
