"""Write a model directory safely: stage every file beside it, stamp each with its card, hash them, move them in.

Both writers of model directories use it: export (training/export/exporter.py) and int8 quantization
(training/quantize/static.py). Nothing reaches the directory until every file is written; the card goes in last
and the directory is verified against it (docs/model-card.md).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import torch

from service.contract import (
    CARD_FILE,
    DECODER_FILE,
    GRAPH_FILE,
    ModelDirError,
    file_entries,
    load_model_dir,
    read_card,
    write_card,
)
from training.export.card import stamp
from training.export.graphs import TORCHSCRIPT, ExportError, quiet_torch

log = logging.getLogger(__name__)

PROGRAM = "capsnet.pt2"  # torch.export program of forward (for AOTInductor / ExecuTorch users)
DECODER_PROGRAM = "decoder.pt2"
ARTIFACTS = (GRAPH_FILE, DECODER_FILE, TORCHSCRIPT, PROGRAM, DECODER_PROGRAM)
MIN_OPSET = 18
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9._-]*")


@dataclass
class Artifacts:
    """What an export has built and checked against PyTorch so far; nothing is written until all of it passes."""

    parity: dict[str, Any]
    protos: dict[str, onnx.ModelProto] = field(default_factory=dict)
    twin: torch.jit.ScriptModule | None = None
    programs: dict[str, torch.export.ExportedProgram] = field(default_factory=dict)


def check_request(name: str, opset: int, out_dir: Path | str) -> None:
    """Refuse a model name that is not URL-safe or differs from its directory's, and an opset older than MIN_OPSET."""
    if not NAME_PATTERN.fullmatch(name):
        raise ExportError(f"model name {name!r} is not URL-safe: use [a-z0-9][a-z0-9._-]*")
    if Path(out_dir).name != name:
        raise ExportError(
            f"model name {name!r} differs from its directory name {Path(out_dir).name!r}; they must match"
        )
    if opset < MIN_OPSET:
        raise ExportError(f"opset {opset} is too old: use {MIN_OPSET} or newer")


def check_out_dir(out: Path, force: bool) -> None:
    """Refuse to replace an existing model directory (or any non-empty directory) unless `force` (the CLIs' --force)."""
    if force or not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    try:
        card = read_card(out)
        what = f"holds model {card.get('name')!r} version {card.get('version')}"
    except ModelDirError:
        what = "exists" if out.is_dir() else "exists and is not a directory"
    raise ExportError(
        f"--out {out} {what}: write to a new name (e.g. --out {out.parent / (out.name + '-2')}), or pass --force "
        "to replace it"
    )


def verify_model_dir(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Check every file of a model directory against the sha256 in its card; return the card."""
    try:
        return load_model_dir(path).raw_card
    except ModelDirError as e:
        raise ExportError(f"{path}: {e}") from e


def write_model_dir(out_dir: Path, card: dict[str, Any], artifacts: Artifacts) -> dict[str, Any]:
    """Write every file into a staging directory beside out_dir, hash them into the card, then move them in."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.export-", dir=out_dir.parent))
    try:
        for file, proto in artifacts.protos.items():
            (staging / file).write_bytes(stamp(proto, card))
        if artifacts.twin is not None:
            with quiet_torch():
                torch.jit.save(artifacts.twin, str(staging / TORCHSCRIPT), _extra_files={CARD_FILE: json.dumps(card)})
        for file, program in artifacts.programs.items():
            with quiet_torch():
                torch.export.save(program, str(staging / file), extra_files={CARD_FILE: json.dumps(card)})
        files = file_entries(staging, list(ARTIFACTS))
        card = {**card, "files": files}
        write_card(staging, card)
        _install(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("wrote %s: %s", out_dir, ", ".join(f"{f} ({e['bytes']:,} bytes)" for f, e in files.items()))
    return verify_model_dir(out_dir)


def _install(staging: Path, out_dir: Path) -> None:
    """Move the verified files into out_dir (card last) and drop artifacts a previous export left behind."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ARTIFACTS:
        if (staging / name).exists():
            os.replace(staging / name, out_dir / name)
        else:
            (out_dir / name).unlink(missing_ok=True)
    os.replace(staging / CARD_FILE, out_dir / CARD_FILE)
