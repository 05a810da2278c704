"""The model repository: a directory of model directories, each with a card whose checksums are verified."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.runtime.card import CARD_FILE, CardError, ModelCard, parse_card

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelDirectory:
    """One model directory as found on disk; `card` is None when the card could not be read."""

    name: str
    path: Path
    card: ModelCard | None
    raw_card: dict[str, Any] | None
    error: str | None = None


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verify_files(path: Path, card: ModelCard) -> None:
    """Every file the card lists must exist with its size and sha256; the graphs the service loads must be listed."""
    for required in card.graph_files:
        if required not in card.files:
            raise CardError(f"{required} is not listed in the card's files, so its checksum cannot be verified")
    for filename, entry in sorted(card.files.items()):
        file = path / filename
        if not file.is_file():
            raise CardError(f"{filename} is listed in the card but missing from {path}")
        size = file.stat().st_size
        if size != entry.bytes:
            raise CardError(f"{filename} has {size} bytes, the card says {entry.bytes}")
        actual = sha256_file(file)
        if actual != entry.sha256:
            raise CardError(f"{filename} sha256 mismatch: file {actual[:12]}…, card {entry.sha256[:12]}…")


def read_model_directory(path: Path) -> ModelDirectory:
    """Read and check one model directory; problems become `error` instead of exceptions."""
    try:
        raw = json.loads((path / CARD_FILE).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return ModelDirectory(path.name, path, None, None, f"cannot read {CARD_FILE}: {e}")
    try:
        card = parse_card(raw)
        if card.name != path.name:
            raise CardError(f"card name {card.name!r} differs from its directory name {path.name!r}")
        verify_files(path, card)
    except CardError as e:
        return ModelDirectory(path.name, path, None, raw if isinstance(raw, dict) else None, str(e))
    return ModelDirectory(card.name, path, card, raw)


def model_directories(root: Path) -> list[Path]:
    """The sub-directories of `root` that hold a card, sorted by name (nothing is read or verified)."""
    if not root.is_dir():
        raise FileNotFoundError(f"model repository {root} is not a directory")
    found = []
    for path in sorted(p for p in root.iterdir() if p.is_dir()):
        if (path / CARD_FILE).is_file():
            found.append(path)
        else:
            logger.debug("skipping %s: no %s", path, CARD_FILE)
    return found


def scan_repository(root: Path) -> list[ModelDirectory]:
    """Every sub-directory of `root` holding a card, read and verified, sorted by name."""
    found = []
    for path in model_directories(root):
        entry = read_model_directory(path)
        if entry.error:
            logger.error("model %s in %s is broken: %s", entry.name, path, entry.error)
        found.append(entry)
    return found
