"""`capsnet-export` as a console script: it never replaces a model directory without --force, and says what is next."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from training.fitting.config import TrainConfig
from training.fitting.train import mnist_trainer

SCRIPT = Path(sys.executable).with_name("capsnet-export")
FAST = ["--no-torchscript", "--no-evaluate"]


def export(*args: str) -> subprocess.CompletedProcess[str]:
    """.venv/bin/capsnet-export run from the checkout, as the README writes it (PATH without any venv)."""
    if not SCRIPT.exists():
        pytest.skip(f"capsnet-export is not installed beside {sys.executable} (pip install -e .)")
    env = {k: v for k, v in os.environ.items() if k != "CAPSNET_DATA_DIR"} | {"PATH": "/usr/bin:/bin"}
    command = os.path.relpath(SCRIPT, REPO_ROOT)
    return subprocess.run([command, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def checkpoint(mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    cfg = TrainConfig(preset="tiny", epochs=1, batch_size=16, eval_batch_size=32, device="cpu", seed=1)
    mnist_trainer(cfg, str(mnist_dir), out).fit()
    return out / "best.pt"


@pytest.fixture(scope="module")
def first_export(checkpoint: Path, mnist_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("zoo") / "my-capsnet"
    done = export(str(checkpoint), "--out", str(out), "--data-dir", str(mnist_dir), "--no-torchscript")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["model_dir"] == str(out)
    return out, done.stderr


def test_an_export_ends_with_what_to_run_next(first_export: tuple[Path, str], mnist_dir: Path) -> None:
    out, stderr = first_export
    assert stderr.splitlines()[-3:] == [
        f"next: evaluate it:  .venv/bin/capsnet-evaluate --model {out} --data-dir {mnist_dir}",
        '      calibrate its "not a digit" score (without it reject_ood=true answers 409):  '
        f".venv/bin/capsnet-ood --model {out} --data-dir {mnist_dir} --write-card",
        f"      serve it beside the other models of {out.parent}:  .venv/bin/capsnet-serve --model-repository "
        f"{out.parent}",
    ]


def test_an_existing_model_directory_is_not_replaced_without_force(
    first_export: tuple[Path, str], checkpoint: Path
) -> None:
    out, _ = first_export
    before = digest(out)
    done = export(str(checkpoint), "--out", str(out), *FAST)
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"capsnet-export: error: --out {out} holds model 'my-capsnet' version 1: write to a new name (e.g. --out "
        f"{out.parent / 'my-capsnet-2'}), or pass --force to replace it"
    )
    assert digest(out) == before
    card = json.loads((out / "model.json").read_text())
    replaced = export(str(checkpoint), "--out", str(out), "--force", "--version", "2", *FAST)
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert json.loads((out / "model.json").read_text())["version"] == "2" != card["version"]


def test_a_non_empty_directory_is_refused_and_an_empty_one_is_used(checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    done = export(str(checkpoint), "--out", str(tmp_path / "notes"), *FAST)
    assert done.returncode == 2
    assert f"capsnet-export: error: --out {tmp_path / 'notes'} exists: write to a new name" in done.stderr
    assert (tmp_path / "notes" / "todo.txt").read_text() == "mine" and len(list((tmp_path / "notes").iterdir())) == 1
    (tmp_path / "empty").mkdir()
    assert export(str(checkpoint), "--out", str(tmp_path / "empty"), *FAST).returncode == 0


def test_an_export_into_model_zoo_is_served_by_make_serve() -> None:
    """model/zoo is the repository `make serve` serves: the export says so instead of naming the repository."""
    from training.export.exporter import next_steps

    lines = next_steps(Path("model/zoo/my-capsnet"), "../shared/data/mnist")
    assert lines[-1] == "      serve it beside the other models of model/zoo:  make serve"
    assert (
        lines[0] == "next: evaluate it:  capsnet-evaluate --model model/zoo/my-capsnet --data-dir ../shared/data/mnist"
    )
