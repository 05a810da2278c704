"""Model directories with ONNX Runtime and numpy only: read and check the card, evaluate on MNIST (no torch)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from training.data import MNISTSplit, to_float
from training.evaluate import EvalResult, confusion_matrix

CARD_FILE = "model.json"
CARD_FORMAT_VERSION = 1


class ModelDirError(ValueError):
    """A model directory that cannot be used: missing or malformed card, missing or altered file."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_card(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The card of a model directory, with its format checked (files are not hashed: see check_model_dir)."""
    path = Path(model_dir) / CARD_FILE
    if not path.is_file():
        raise ModelDirError(f"{path}: card not found (is {Path(model_dir)} a model directory?)")
    try:
        card = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelDirError(f"{path}: cannot be read as JSON: {e}") from e
    if not isinstance(card, dict) or card.get("format_version") != CARD_FORMAT_VERSION:
        found = card.get("format_version") if isinstance(card, dict) else None
        raise ModelDirError(f"{path}: card format_version {found!r}, expected {CARD_FORMAT_VERSION}")
    return card


def check_model_dir(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Check the card's name and every file it lists against its recorded size and sha256; return the card."""
    root = Path(model_dir)
    card = read_card(root)
    if card.get("name") != root.resolve().name:
        raise ModelDirError(f"{root / CARD_FILE}: card name {card.get('name')!r} differs from its directory name")
    files: dict[str, dict[str, Any]] = card.get("files") or {}
    needed = ["capsnet.onnx"] + ([card["decoder"]["file"]] if card.get("decoder") else [])
    for name in needed:
        if name not in files:
            raise ModelDirError(f"{root / CARD_FILE}: card lists no entry for {name}")
    for name, entry in files.items():
        path = root / name
        if not path.is_file():
            raise ModelDirError(f"{path}: listed in the card but missing")
        if path.stat().st_size != entry["bytes"]:
            raise ModelDirError(
                f"{path}: {path.stat().st_size} bytes, the card says {entry['bytes']}: "
                "the file was altered after export; re-export it with capsnet-export"
            )
        actual = sha256_file(path)
        if actual != entry["sha256"]:
            raise ModelDirError(
                f"{path}: sha256 mismatch (card {entry['sha256'][:12]}…, file {actual[:12]}…): "
                "the file was altered after export; re-export it with capsnet-export"
            )
    return card


def make_session(model: str | os.PathLike[str] | bytes, providers: list[str] | None = None) -> ort.InferenceSession:
    """An ONNX Runtime session (CPU unless `providers` says otherwise) honouring $OMP_NUM_THREADS."""
    options = ort.SessionOptions()
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit():
        options.intra_op_num_threads = int(threads)
    options.log_severity_level = 3  # errors only
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, sess_options=options, providers=providers or ["CPUExecutionProvider"])


def evaluate_session(
    session: ort.InferenceSession,
    input_name: str,
    scores_output: str,
    num_classes: int,
    split: MNISTSplit,
    batch_size: int = 500,
) -> EvalResult:
    """Error and confusion matrix of the argmax of `scores_output` over `split`."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    preds = [np.zeros(0, dtype=np.int64)]
    for start in range(0, len(split), batch_size):
        images = to_float(split.images[start : start + batch_size])  # (B, 1, 28, 28) in [0, 1]
        (scores,) = session.run([scores_output], {input_name: images})  # (B, K)
        preds.append(scores.argmax(axis=1))
    p = np.concatenate(preds)
    cm = confusion_matrix(split.labels, p, num_classes)
    return EvalResult(n=len(split), errors=int((p != split.labels).sum()), confusion=cm)


def evaluate_model_dir(model_dir: str | os.PathLike[str], split: MNISTSplit, batch_size: int = 500) -> dict[str, Any]:
    """Evaluate a checked model directory with ONNX Runtime: the JSON of checkpoint evaluation plus the model name."""
    card = check_model_dir(model_dir)
    session = make_session(Path(model_dir) / "capsnet.onnx")
    scores_output, num_classes = card["scores"]["output"], len(card["classes"])
    result = evaluate_session(session, card["input"]["name"], scores_output, num_classes, split, batch_size)
    return {
        **result.to_dict(),
        "model": card["name"],
        "evaluated_with": "onnxruntime",
        "source": {"model": str(model_dir)},
    }
