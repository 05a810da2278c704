"""Fixtures of the batch-prediction tests: the bundled models and small inputs of every kind, made from digits."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO_ROOT, idx_bytes, synthetic_digits

ZOO = REPO_ROOT / "model" / "zoo"
DYNAMIC = ZOO / "capsnet-mnist"  # calibrated, with a decoder: every column is filled
EM = ZOO / "capsnet-em-mnist"  # its card limits runs to one image


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(pixels, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def jpeg_dark_on_light(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(255 - np.asarray(pixels, np.uint8)).resize((56, 56)).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


@pytest.fixture(scope="session")
def digits() -> tuple[np.ndarray, np.ndarray]:
    return synthetic_digits(12, seed=3)


@pytest.fixture(scope="session")
def dynamic_model() -> Path:
    if not (DYNAMIC / "model.json").is_file():
        pytest.skip(f"the bundled model {DYNAMIC.name} is absent")
    return DYNAMIC


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory, digits: tuple[np.ndarray, np.ndarray]) -> Path:
    """class folders of PNGs, a dark-on-light JPEG among them, and a file at the top (no label)."""
    root = tmp_path_factory.mktemp("folder")
    images, labels = digits
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        (root / str(label)).mkdir(exist_ok=True)
        if i == 5:
            (root / str(label) / f"{i:03d}.jpg").write_bytes(jpeg_dark_on_light(image))
        else:
            (root / str(label) / f"{i:03d}.png").write_bytes(png(image))
    (root / "top.png").write_bytes(png(images[0]))
    return root


@pytest.fixture(scope="session")
def idx_file(tmp_path_factory: pytest.TempPathFactory, digits: tuple[np.ndarray, np.ndarray]) -> Path:
    root = tmp_path_factory.mktemp("idx")
    images, labels = digits
    (root / "t10k-images-idx3-ubyte").write_bytes(idx_bytes(images, 0x803))
    (root / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(labels, 0x801))
    return root / "t10k-images-idx3-ubyte"


@pytest.fixture(scope="session")
def tar_file(tmp_path_factory: pytest.TempPathFactory, image_folder: Path) -> Path:
    path = tmp_path_factory.mktemp("tar") / "digits.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for file in sorted(image_folder.rglob("*.*")):
            archive.add(file, arcname=file.relative_to(image_folder).as_posix())
    return path
