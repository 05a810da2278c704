"""Fixtures the training tests share: a synthetic MNIST directory, written once per test module."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import write_mnist_dir


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mnist_dir(tmp_path_factory.mktemp("data") / "mnist")
