"""The model repository: a directory of model directories, each read and verified by service/runtime/model_dir.py."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.runtime.model_dir import CARD_FILE, ModelCard, ModelDirError, is_model_dir, load_model_dir, read_card

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelDirectory:
    """One model directory as found on disk; `card` is None when the card could not be read."""

    name: str
    path: Path
    card: ModelCard | None
    raw_card: dict[str, Any] | None
    error: str | None = None


def read_model_directory(path: Path) -> ModelDirectory:
    """Read and check one model directory; problems become `error` instead of exceptions."""
    try:
        loaded = load_model_dir(path)
    except ModelDirError as e:
        try:
            raw: dict[str, Any] | None = read_card(path)
        except ModelDirError:
            raw = None
        return ModelDirectory(path.name, path, None, raw, str(e))
    return ModelDirectory(loaded.name, path, loaded.card, loaded.raw_card)


def model_directories(root: Path) -> list[Path]:
    """The sub-directories of `root` that hold a card, sorted by name (nothing is read or verified); `root` alone
    when it holds a card itself (a repository of one model)."""
    if not root.is_dir():
        raise FileNotFoundError(f"model repository {root} is not a directory")
    if is_model_dir(root):
        logger.debug("%s is a model directory: a repository of one", root)
        return [root]
    found = []
    for path in sorted(p for p in root.iterdir() if p.is_dir()):
        if is_model_dir(path):
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
