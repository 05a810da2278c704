"""MNIST from the standard IDX files (.gz or raw); numpy only, so ONNX-only evaluation needs no torch."""

from __future__ import annotations

import gzip
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DATA_DIR_ENV = "CAPSNET_DATA_DIR"
SPLIT_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
IMAGE_MAGIC = 0x00000803  # unsigned byte, 3 dimensions
LABEL_MAGIC = 0x00000801  # unsigned byte, 1 dimension


class IDXError(ValueError):
    """A missing, truncated or malformed IDX file; the message names the file."""


@dataclass(frozen=True)
class MNISTSplit:
    images: np.ndarray  # (N, 1, 28, 28) uint8
    labels: np.ndarray  # (N,) int64
    sha256: dict[str, str] = field(default_factory=dict)  # file stem -> sha256 of the decompressed file read

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def subset(self, n: int | None) -> MNISTSplit:
        if n is None or n >= len(self):
            return self
        return MNISTSplit(self.images[:n], self.labels[:n])


def resolve_data_dir(data_dir: str | os.PathLike[str] | None) -> Path:
    """The data directory from the argument, else from $CAPSNET_DATA_DIR."""
    value = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV)
    if not value:
        raise IDXError(f"no MNIST data directory given: pass --data-dir or set ${DATA_DIR_ENV}")
    path = Path(value)
    if not path.is_dir():
        raise IDXError(f"MNIST data directory {path} does not exist or is not a directory")
    return path


def find_idx_file(data_dir: Path, stem: str) -> Path:
    """`stem` or `stem.gz` inside data_dir (raw preferred when both exist)."""
    for candidate in (data_dir / stem, data_dir / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    raise IDXError(f"{data_dir / stem}[.gz]: file not found")


def read_idx_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except FileNotFoundError as e:
        raise IDXError(f"{path}: file not found") from e
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise IDXError(f"{path}: cannot be read as {'gzip' if path.suffix == '.gz' else 'IDX'}: {e}") from e


def parse_idx(data: bytes, path: Path, magic: int, item_shape: tuple[int, ...]) -> np.ndarray:
    """Check magic number, dimensions and size, and return the array (N, *item_shape) uint8."""
    ndim = 1 + len(item_shape)
    header = 4 + 4 * ndim
    if len(data) < header:
        raise IDXError(f"{path}: truncated header ({len(data)} bytes, expected at least {header})")
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        raise IDXError(f"{path}: wrong magic number 0x{found:08x}, expected 0x{magic:08x}")
    dims = tuple(int.from_bytes(data[4 + 4 * k : 8 + 4 * k], "big") for k in range(ndim))
    if dims[1:] != item_shape:
        raise IDXError(f"{path}: item shape {dims[1:]}, expected {item_shape}")
    expected = header + int(np.prod(dims))
    if len(data) != expected:
        kind = "truncated" if len(data) < expected else "has trailing bytes"
        raise IDXError(f"{path}: {kind}: {len(data)} bytes, expected {expected} for {dims[0]} items")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims).copy()


def load_split(data_dir: str | os.PathLike[str] | None, split: str) -> MNISTSplit:
    """Load 'train' or 'test' from IDX files, checking that image and label counts match."""
    if split not in SPLIT_FILES:
        raise ValueError(f"split must be one of {sorted(SPLIT_FILES)}, got {split!r}")
    root = resolve_data_dir(data_dir)
    image_stem, label_stem = SPLIT_FILES[split]
    image_path, label_path = find_idx_file(root, image_stem), find_idx_file(root, label_stem)
    image_bytes, label_bytes = read_idx_bytes(image_path), read_idx_bytes(label_path)
    images = parse_idx(image_bytes, image_path, IMAGE_MAGIC, (28, 28))
    labels = parse_idx(label_bytes, label_path, LABEL_MAGIC, ())
    if images.shape[0] != labels.shape[0]:
        raise IDXError(f"{image_path} has {images.shape[0]} images but {label_path} has {labels.shape[0]} labels")
    if labels.size and int(labels.max()) > 9:
        raise IDXError(f"{label_path}: label {int(labels.max())} outside 0-9")
    return MNISTSplit(
        images=images[:, None, :, :],  # (N, 1, 28, 28)
        labels=labels.astype(np.int64),
        sha256={
            image_stem: hashlib.sha256(image_bytes).hexdigest(),
            label_stem: hashlib.sha256(label_bytes).hexdigest(),
        },
    )


def file_hashes(data_dir: str | os.PathLike[str] | None) -> dict[str, str]:
    """sha256 of the decompressed content of each MNIST file (stable whether .gz or raw).

    `load_split(...).sha256` gives the same for the files a split was read from, without reading them again.
    """
    root = resolve_data_dir(data_dir)
    out: dict[str, str] = {}
    for stems in SPLIT_FILES.values():
        for stem in stems:
            path = find_idx_file(root, stem)
            out[stem] = hashlib.sha256(read_idx_bytes(path)).hexdigest()
    return out


def to_float(images: np.ndarray) -> np.ndarray:
    """uint8 (N, 1, 28, 28) -> float32 in [0, 1]."""
    return images.astype(np.float32) / 255.0
