"""Settings from CAPSNET_* variables, and the thread default from the container's CPU quota."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.core import config
from service.core.config import BUNDLED_REPOSITORY, Settings, cgroup_cpu_limit, default_intra_op_threads


def test_environment_variables_use_the_capsnet_prefix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CAPSNET_MAX_BATCH_SIZE", "16")
    monkeypatch.setenv("CAPSNET_PROVIDER", "cpu")
    monkeypatch.setenv("CAPSNET_MODEL_REPOSITORY", str(tmp_path))
    monkeypatch.setenv("CAPSNET_INTRA_OP_THREADS", "3")
    settings = Settings()
    assert (settings.max_batch_size, settings.provider, settings.model_repository) == (16, "cpu", tmp_path)
    assert settings.intra_op_threads == 3
    assert Settings(max_batch_size=2).max_batch_size == 2  # explicit values (the CLI) win


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("CAPSNET_")]:
        monkeypatch.delenv(name)
    settings = Settings()
    assert settings.model_repository == BUNDLED_REPOSITORY == Path(config.__file__).parents[2] / "model" / "zoo"
    assert (settings.host, settings.port, settings.provider) == ("127.0.0.1", 8000, "auto")
    assert settings.max_body_bytes == 10 * 1024 * 1024


def test_invalid_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPSNET_PROVIDER", "tpu")
    with pytest.raises(ValueError, match="provider"):
        Settings()


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota(tmp_path: Path) -> None:
    write(tmp_path / "cpu.max", "150000 100000\n")
    assert cgroup_cpu_limit(tmp_path) == 1.5
    write(tmp_path / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    write(tmp_path / "cpu" / "cpu.cfs_quota_us", "200000\n")
    write(tmp_path / "cpu" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path) == 2.0
    write(tmp_path / "cpu" / "cpu.cfs_quota_us", "-1\n")
    assert cgroup_cpu_limit(tmp_path) is None


def test_threads_follow_the_quota_not_the_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    write(tmp_path / "cpu.max", "150000 100000\n")
    assert default_intra_op_threads(tmp_path) == 2  # 1.5 CPUs, rounded up
    write(tmp_path / "cpu.max", "max 100000\n")
    assert default_intra_op_threads(tmp_path) == 64  # no quota: the CPUs this process may use
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    write(tmp_path / "cpu.max", "800000 100000\n")
    assert default_intra_op_threads(tmp_path) == 2  # never more than the CPUs it may run on


@pytest.mark.parametrize("text", ["garbage\n", "abc 100000\n", "100000 0\n", "1.5e5 100000\n"])
def test_unreadable_cgroup_quota_falls_back_to_the_cpus(tmp_path: Path, text: str) -> None:
    write(tmp_path / "cpu.max", text)
    assert cgroup_cpu_limit(tmp_path) is None


def test_grpc_port_default_and_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("CAPSNET_")]:
        monkeypatch.delenv(name)
    assert Settings().grpc_port == 8001
    assert Settings(grpc_port=0, port=8000).grpc_port == 0  # gRPC off
    with pytest.raises(ValueError, match="grpc_port and port are both 9000: gRPC needs a port of its own"):
        Settings(port=9000, grpc_port=9000)


def test_parallel_runs_default_to_the_intra_op_threads_and_cannot_exceed_them() -> None:
    assert Settings(intra_op_threads=3).run_slots == 3
    assert Settings(intra_op_threads=3, parallel_runs=1).run_slots == 1
    with pytest.raises(ValueError, match=r"parallel_runs \(3\) exceeds intra_op_threads \(2\)"):
        Settings(intra_op_threads=2, parallel_runs=3)
