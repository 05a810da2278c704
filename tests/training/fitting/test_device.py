"""glibc malloc tuning for training on the CPU (`keep_freed_memory`)."""

from __future__ import annotations

import ctypes
import platform
import sys
from collections.abc import Callable
from typing import Any

import pytest

from training.fitting import device


class FakeLibc:
    """A C library whose mallopt records its calls and answers `result` (glibc: 1 on success, 0 on refusal)."""

    def __init__(self, result: int) -> None:
        self.calls: list[tuple[int, int]] = []

        def mallopt(param: int, value: int) -> int:
            self.calls.append((param, value))
            return result

        self.mallopt: Callable[[int, int], int] = mallopt


def use_libc(monkeypatch: pytest.MonkeyPatch, libc: object) -> None:
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(ctypes, "CDLL", lambda name: libc)


def test_sets_the_mmap_threshold_and_the_trim_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = FakeLibc(result=1)
    use_libc(monkeypatch, libc)
    assert device.keep_freed_memory() is True
    assert libc.calls == [(device.M_MMAP_THRESHOLD, 32 * 2**20), (device.M_TRIM_THRESHOLD, 2**30)]
    assert (device.M_MMAP_THRESHOLD, device.M_TRIM_THRESHOLD) == (-3, -1)  # glibc's malloc.h


def test_a_refused_setting_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    libc = FakeLibc(result=0)
    use_libc(monkeypatch, libc)
    assert device.keep_freed_memory() is False


def test_nothing_is_done_without_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    use_libc(monkeypatch, object())  # a C library without mallopt
    assert device.keep_freed_memory() is False

    def unloadable(name: Any) -> None:
        raise OSError("no C library")

    monkeypatch.setattr(ctypes, "CDLL", unloadable)
    assert device.keep_freed_memory() is False
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(ctypes, "CDLL", lambda name: pytest.fail("the C library is not touched off Linux"))
    assert device.keep_freed_memory() is False


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="needs glibc's mallopt")
def test_glibc_accepts_the_settings() -> None:
    assert device.keep_freed_memory() is True
