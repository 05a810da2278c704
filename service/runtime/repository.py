"""The model repository (docs/model-management.md): model folders, their numbered versions and version policy.

A model folder is either a model directory (one version, its card's `version`) or a folder of numbered version
folders (`capsnet-mnist/1/`, `capsnet-mnist/2/`), each a model directory read and verified by
service/runtime/model_dir.py, beside an optional `version_policy.json`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from service.core.errors import InvalidInput, ModelNotFound
from service.runtime.model_dir import CARD_FILE, ModelCard, ModelDirError, is_model_dir, load_model_dir, read_card

logger = logging.getLogger(__name__)

POLICY_FILE = "version_policy.json"
MODEL_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")  # a card's name; never "..", never a separator


@dataclass(frozen=True)
class ModelDirectory:
    """One model version as found on disk; `card` is None when the card could not be read."""

    name: str
    path: Path
    card: ModelCard | None
    raw_card: dict[str, Any] | None
    error: str | None = None
    version: str = "1"
    card_sha256: str = ""


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions on disk are served: the `latest` N, `all`, or the `specific` ones listed."""

    kind: Literal["latest", "all", "specific"] = "latest"
    num_versions: int = 1
    versions: tuple[str, ...] = ()

    def select(self, available: list[str]) -> list[str]:
        """The versions of `available` this policy serves, newest first."""
        ordered = sorted(available, key=version_key, reverse=True)
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered[: self.num_versions]

    def describe(self) -> str:
        if self.kind == "latest":
            return f"latest {self.num_versions}"
        return "all" if self.kind == "all" else f"specific {list(self.versions)}"


def version_key(version: str) -> tuple[int, str]:
    """Numeric versions in numeric order (10 after 9); any other label sorts before them."""
    return (int(version), "") if version.isdigit() else (-1, version)


def read_policy(folder: Path) -> VersionPolicy:
    """The folder's `version_policy.json` (absent: latest 1); ModelDirError naming the problem when malformed.

    Format: `{"latest": 2}`, `{"all": true}` or `{"specific": [1, 3]}`.
    """
    file = folder / POLICY_FILE
    if not file.is_file():
        return VersionPolicy()
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelDirError(f"cannot read {POLICY_FILE} of {folder.name}: {e}") from e
    usage = 'write {"latest": N}, {"all": true} or {"specific": [versions]}'
    if not isinstance(data, dict) or len(data) != 1:
        raise ModelDirError(f"{POLICY_FILE} of {folder.name} must hold exactly one policy: {usage}")
    ((kind, value),) = data.items()
    if kind == "latest" and isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return VersionPolicy("latest", num_versions=value)
    if kind == "all" and value is True:
        return VersionPolicy("all")
    if kind == "specific" and isinstance(value, list) and value and all(_is_version(v) for v in value):
        return VersionPolicy("specific", versions=tuple(str(v) for v in value))
    raise ModelDirError(f"{POLICY_FILE} of {folder.name} holds {data!r}: {usage}")


def _is_version(value: object) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool) and value >= 0) or (
        isinstance(value, str) and value.isdigit()
    )


@dataclass(frozen=True)
class VersionSource:
    """One version on disk, not yet verified: its directory, the sha256 of its card (a change means reload) and a
    stamp of its files' names, sizes and times (a change means a failed load is worth another try)."""

    version: str
    path: Path
    card_sha256: str
    stamp: str = ""


@dataclass(frozen=True)
class ModelSource:
    """A model folder on disk: its versions and policy (`error` when the policy file is malformed)."""

    name: str
    path: Path
    versioned: bool
    policy: VersionPolicy = VersionPolicy()
    versions: dict[str, VersionSource] = field(default_factory=dict)
    error: str | None = None

    def selected(self) -> list[str]:
        """The versions on disk that the policy serves, newest first."""
        return self.policy.select(list(self.versions))


def card_sha256(path: Path) -> str:
    """The sha256 of a model directory's card ("" when it cannot be read)."""
    try:
        return hashlib.sha256((path / CARD_FILE).read_bytes()).hexdigest()
    except OSError:
        return ""


def files_stamp(path: Path) -> str:
    """A digest of the names, sizes and modification times of the files in `path` (nothing is read)."""
    try:
        files = [p for p in path.iterdir() if p.is_file()]
        stats = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    except OSError:
        return ""
    return hashlib.sha256(repr(stats).encode()).hexdigest()


def version_source(version: str, path: Path) -> VersionSource:
    return VersionSource(version, path, card_sha256(path), files_stamp(path))


def _flat_version(path: Path) -> str:
    try:
        version = read_card(path).get("version", "1")
    except ModelDirError:
        return "1"
    return str(version) if isinstance(version, str | int) and not isinstance(version, bool) else "1"


def read_source(path: Path) -> ModelSource | None:
    """The model folder at `path`, or None when it holds neither a card nor numbered version folders."""
    if is_model_dir(path):
        version = _flat_version(path)
        return ModelSource(path.name, path, False, versions={version: version_source(version, path)})
    numbered = sorted((p for p in path.iterdir() if p.is_dir() and p.name.isdigit() and is_model_dir(p)), key=str)
    if not numbered:
        return None
    versions = {p.name: version_source(p.name, p) for p in numbered}
    try:
        policy = read_policy(path)
    except ModelDirError as e:
        return ModelSource(path.name, path, True, versions=versions, error=str(e))
    return ModelSource(path.name, path, True, policy, versions)


def model_directories(root: Path) -> list[Path]:
    """The model folders of `root` (a card, or numbered version folders with cards), sorted by name; `root` alone
    when it holds a card itself (a repository of one model)."""
    if not root.is_dir():
        raise FileNotFoundError(f"model repository {root} is not a directory")
    if is_model_dir(root):
        logger.debug("%s is a model directory: a repository of one", root)
        return [root]
    found = []
    for path in sorted(p for p in root.iterdir() if p.is_dir()):
        if read_source(path) is not None:
            found.append(path)
        else:
            logger.debug("skipping %s: no %s and no numbered version folders", path, CARD_FILE)
    return found


def discover(root: Path) -> dict[str, ModelSource]:
    """Every model folder of `root` by name, with its versions' card checksums (the graphs are not read)."""
    sources = (read_source(path) for path in model_directories(root))
    return {s.name: s for s in sources if s is not None}


def check_model_name(name: str) -> None:
    """InvalidInput unless `name` could be a model's (a card's name pattern: no separator, no `..`)."""
    if not MODEL_NAME.fullmatch(name):
        shown = name if len(name) <= 64 else name[:64] + "…"
        raise InvalidInput(
            f"{shown!r} is not a model name: lower-case letters, digits, '.', '_' and '-', starting with a letter "
            "or digit"
        )


def find_source(root: Path, name: str) -> ModelSource:
    """The model folder `name` directly inside `root`: InvalidInput for a name that is not one, ModelNotFound
    when absent (a symbolic link leading out of the repository is absent too)."""
    check_model_name(name)
    if is_model_dir(root) and root.resolve().name == name:  # a repository of one model
        return read_source(root)  # type: ignore[return-value]  # not None: it holds a card
    path = root / name
    try:
        inside = path.resolve().parent == root.resolve()
    except OSError:
        inside = False
    source = read_source(path) if inside and path.is_dir() else None
    if source is None:
        raise ModelNotFound(f"no model folder {name!r} in the model repository")
    return source


def read_model_directory(path: Path, name: str | None = None, version: str | None = None) -> ModelDirectory:
    """Read and check one model version; problems become `error` instead of exceptions.

    `name`: the model folder's name the card must carry (default: the directory's name); `version`: the version
    folder's number, which the served card's `version` becomes (default: the card's own).
    """
    sha = card_sha256(path)
    shown = name or path.name
    try:
        loaded = load_model_dir(path, name=name)
    except ModelDirError as e:
        try:
            raw: dict[str, Any] | None = read_card(path)
        except ModelDirError:
            raw = None
        return ModelDirectory(shown, path, None, raw, str(e), version or _flat_version(path), sha)
    card, raw = loaded.card, loaded.raw_card
    if version is not None and version != card.version:
        card = card.model_copy(update={"version": version})
        raw = {**raw, "version": version}
    return ModelDirectory(loaded.name, path, card, raw, None, card.version, sha)


def read_version(source: ModelSource, version: str) -> ModelDirectory:
    """One version of a model folder, read and verified (the graphs' checksums are computed: slow for big ones)."""
    entry = source.versions[version]
    return read_model_directory(entry.path, source.name, version if source.versioned else None)


def scan_repository(root: Path) -> list[ModelDirectory]:
    """The newest version its policy serves of every model folder of `root`, read and verified, sorted by name."""
    found = []
    for source in discover(root).values():
        selected = source.selected()
        if not selected:
            continue
        entry = read_version(source, selected[0])
        if entry.error:
            logger.error("model %s in %s is broken: %s", entry.name, entry.path, entry.error)
        found.append(entry)
    return found
