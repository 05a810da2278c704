"""Shared fixtures: synthetic MNIST-format data, the real MNIST directory, and thread limits."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_MNIST = Path(os.environ.get("CAPSNET_DATA_DIR", REPO_ROOT.parent / "shared" / "data" / "mnist"))

# Tests share two cores with whatever else runs; one intra-op thread keeps them predictable.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def synthetic_digits(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """n 28x28 uint8 images whose class is visible: a bright bar whose position encodes the label."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n).astype(np.uint8)
    images = (rng.random((n, 28, 28)) * 30).astype(np.uint8)
    for k, label in enumerate(labels):
        row = 4 + 2 * int(label)
        images[k, row : row + 2, 6:22] = 255
    return images, labels


def write_mnist_dir(root: Path, n_train: int = 64, n_test: int = 32, gz: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split, n, seed in (("train", n_train, 0), ("t10k", n_test, 1)):
        images, labels = synthetic_digits(n, seed)
        for kind, array, magic in (("images-idx3", images, 0x803), ("labels-idx1", labels, 0x801)):
            name = f"{split}-{kind}-ubyte"
            data = idx_bytes(array, magic)
            if gz:
                with gzip.open(root / f"{name}.gz", "wb") as f:
                    f.write(data)
            else:
                (root / name).write_bytes(data)
    return root


@pytest.fixture
def synthetic_mnist(tmp_path: Path) -> Path:
    """A directory of small, learnable, MNIST-format IDX files (.gz)."""
    return write_mnist_dir(tmp_path / "mnist")


@pytest.fixture(scope="session")
def real_mnist() -> Path:
    """The official MNIST files; tests that need them skip with the reason when absent."""
    if not (REAL_MNIST / "t10k-images-idx3-ubyte.gz").exists() and not (REAL_MNIST / "t10k-images-idx3-ubyte").exists():
        pytest.skip(f"real MNIST files not found in {REAL_MNIST} (set CAPSNET_DATA_DIR)")
    return REAL_MNIST


@pytest.fixture(autouse=True, scope="session")
def _limit_torch_threads() -> None:
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)
