"""The IDX reader: real files, .gz and raw, and clear errors for missing, truncated and malformed files."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import idx_bytes, write_mnist_dir
from training.data.mnist import IDXError, file_hashes, load_split, resolve_data_dir
from training.fitting.train import random_shift


@pytest.mark.mnist
def test_reads_the_official_files(real_mnist: Path) -> None:
    train, test = load_split(real_mnist, "train"), load_split(real_mnist, "test")
    assert train.images.shape == (60000, 1, 28, 28) and train.images.dtype == np.uint8
    assert test.images.shape == (10000, 1, 28, 28)
    assert np.bincount(test.labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    assert np.bincount(train.labels)[0] == 5923


@pytest.mark.parametrize("gz", [True, False])
def test_reads_gz_and_raw(tmp_path: Path, gz: bool) -> None:
    root = write_mnist_dir(tmp_path, n_train=10, n_test=4, gz=gz)
    split = load_split(root, "test")
    assert len(split) == 4 and split.images.shape == (4, 1, 28, 28)


def test_hashes_do_not_depend_on_compression(tmp_path: Path) -> None:
    assert file_hashes(write_mnist_dir(tmp_path / "a", gz=True)) == file_hashes(
        write_mnist_dir(tmp_path / "b", gz=False)
    )


def test_a_loaded_split_carries_the_hashes_of_its_files(tmp_path: Path) -> None:
    root = write_mnist_dir(tmp_path, gz=True)
    train, test = load_split(root, "train"), load_split(root, "test")
    assert {**train.sha256, **test.sha256} == file_hashes(root)
    assert len(train.sha256) == len(test.sha256) == 2


def test_missing_file_is_named(tmp_path: Path) -> None:
    root = write_mnist_dir(tmp_path)
    (root / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(IDXError, match=r"t10k-labels-idx1-ubyte\[\.gz\]: file not found"):
        load_split(root, "test")


def test_truncated_file_is_rejected_with_its_name(tmp_path: Path) -> None:
    root = write_mnist_dir(tmp_path, gz=False)
    path = root / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(IDXError, match=r"t10k-images-idx3-ubyte: truncated: .* bytes, expected"):
        load_split(root, "test")


def test_truncated_gzip_stream_is_rejected(tmp_path: Path) -> None:
    root = write_mnist_dir(tmp_path, gz=True)
    path = root / "t10k-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(IDXError, match=r"t10k-images-idx3-ubyte\.gz: cannot be read as gzip"):
        load_split(root, "test")


def test_wrong_magic_number_is_rejected(tmp_path: Path) -> None:
    root = write_mnist_dir(tmp_path, gz=True)
    labels = np.zeros(32, dtype=np.uint8)
    with gzip.open(root / "t10k-labels-idx1-ubyte.gz", "wb") as f:
        f.write(idx_bytes(labels, 0x803))
    with pytest.raises(
        IDXError, match=r"t10k-labels-idx1-ubyte.gz: wrong magic number 0x00000803, expected 0x00000801"
    ):
        load_split(root, "test")


def test_count_mismatch_and_bad_shape(tmp_path: Path) -> None:
    root = write_mnist_dir(tmp_path, gz=False)
    (root / "t10k-labels-idx1-ubyte").write_bytes(idx_bytes(np.zeros(5, dtype=np.uint8), 0x801))
    with pytest.raises(IDXError, match=r"has 32 images but .* has 5 labels"):
        load_split(root, "test")
    (root / "t10k-images-idx3-ubyte").write_bytes(idx_bytes(np.zeros((5, 32, 32), dtype=np.uint8), 0x803))
    with pytest.raises(IDXError, match=r"item shape \(32, 32\), expected \(28, 28\)"):
        load_split(root, "test")


def test_data_dir_from_env_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CAPSNET_DATA_DIR", raising=False)
    with pytest.raises(IDXError, match="pass --data-dir or set"):
        resolve_data_dir(None)
    monkeypatch.setenv("CAPSNET_DATA_DIR", str(tmp_path))
    assert resolve_data_dir(None) == tmp_path
    with pytest.raises(IDXError, match="does not exist"):
        resolve_data_dir(tmp_path / "nope")


def test_random_shift_moves_each_image_by_at_most_two_pixels() -> None:
    images = torch.zeros(64, 1, 28, 28)
    images[:, :, 13, 13] = 1.0
    shifted = random_shift(images, 2, torch.Generator().manual_seed(0))
    assert shifted.shape == images.shape
    positions = shifted.flatten(start_dim=1).argmax(dim=1)
    rows, cols = positions // 28, positions % 28
    assert shifted.sum() == 64  # zero padded: nothing lost, nothing added
    assert ((rows - 13).abs() <= 2).all() and ((cols - 13).abs() <= 2).all()
    assert len(set(zip(rows.tolist(), cols.tolist(), strict=True))) > 10  # independent per image
    assert torch.equal(random_shift(images, 0, torch.Generator()), images)
