"""deploy/requirements.py: each image variant installs pyproject's base dependencies, with exactly one ONNX Runtime
package (plain onnxruntime for CPU, onnxruntime-gpu for GPU), so the image cannot drift from pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from deploy import requirements
from tests.deploy.manifests import REPO_ROOT

PYPROJECT_DEPENDENCIES = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
ORT = set(requirements.ONNXRUNTIME.values())


def names(dependencies: list[str]) -> list[str]:
    return [requirements.requirement_name(d) for d in dependencies]


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_every_base_dependency_is_installed_as_pyproject_writes_it(variant: str) -> None:
    """The drift check: anything added to or changed in project.dependencies reaches the image as it is."""
    out = requirements.serving_requirements(variant)
    others = [d for d in PYPROJECT_DEPENDENCIES if requirements.requirement_name(d) not in ORT]
    assert [d for d in out if requirements.requirement_name(d) not in ORT] == others
    assert len(out) == len(others) + 1


@pytest.mark.parametrize(("variant", "package"), [("cpu", "onnxruntime"), ("gpu", "onnxruntime-gpu")])
def test_variant_gets_exactly_its_onnxruntime_unmarked(variant: str, package: str) -> None:
    out = requirements.serving_requirements(variant)
    (runtime,) = [d for d in out if requirements.requirement_name(d) in ORT]
    assert requirements.requirement_name(runtime) == package
    assert ";" not in runtime, "the variant decides, not the build machine's platform"
    (declared,) = [d for d in PYPROJECT_DEPENDENCIES if requirements.requirement_name(d) == package]
    assert runtime == declared.split(";")[0].strip(), "the version bound comes from pyproject.toml"


def test_pyproject_still_marks_the_two_runtimes_by_platform() -> None:
    """What the swap relies on: pyproject names both packages, each behind a platform marker."""
    runtimes = [d for d in PYPROJECT_DEPENDENCIES if requirements.requirement_name(d) in ORT]
    assert sorted(names(runtimes)) == sorted(ORT)
    assert all("platform_machine" in d for d in runtimes)


@pytest.mark.parametrize(
    ("requirement", "name"),
    [
        ("uvicorn[standard]>=0.29", "uvicorn"),
        ("Pydantic_Settings>=2", "pydantic-settings"),
        ("onnxruntime-gpu", "onnxruntime-gpu"),
    ],
)
def test_requirement_name_normalizes(requirement: str, name: str) -> None:
    assert requirements.requirement_name(requirement) == name


def test_a_pyproject_without_both_runtimes_is_refused(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\ndependencies = ["numpy>=1.26", "onnxruntime>=1.18"]\n')
    with pytest.raises(
        ValueError, match=r"must list both \['onnxruntime', 'onnxruntime-gpu'\].*found \['onnxruntime'\]"
    ):
        requirements.serving_requirements("cpu", pyproject)
    with pytest.raises(ValueError, match="unknown variant 'tpu'"):
        requirements.serving_requirements("tpu")


def test_cli_prints_one_requirement_per_line_and_fails_clearly(tmp_path: Path) -> None:
    script = REPO_ROOT / "deploy" / "requirements.py"
    out = subprocess.run([sys.executable, str(script), "cpu"], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == requirements.serving_requirements("cpu")
    bad = tmp_path / "pyproject.toml"
    bad.write_text('[project]\nname = "x"\ndependencies = []\n')
    out = subprocess.run(
        [sys.executable, str(script), "gpu", "--pyproject", str(bad)], capture_output=True, text=True, check=False
    )
    assert out.returncode == 1
    assert out.stderr.startswith("requirements.py: ") and "must list both" in out.stderr
