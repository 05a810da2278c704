"""Print one image variant's serving requirements, derived from pyproject.toml: its base dependencies with the
variant's ONNX Runtime package (plain `onnxruntime` for CPU, `onnxruntime-gpu` for GPU) in place of the
platform-marked pair. deploy/Dockerfile installs these, then the project with `--no-deps`.

    python3 deploy/requirements.py cpu > requirements.txt

Standard library only: it runs in the image's builder stage before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import tomllib

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
# The ONNX Runtime distribution each image variant installs.
ONNXRUNTIME = {"cpu": "onnxruntime", "gpu": "onnxruntime-gpu"}


def requirement_name(requirement: str) -> str:
    """The normalized distribution name of a PEP 508 requirement (`uvicorn[standard]>=0.29` -> `uvicorn`)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def serving_requirements(variant: str, pyproject: Path = PYPROJECT) -> list[str]:
    """The base dependencies, in pyproject order, with exactly one ONNX Runtime package: the variant's, unmarked.

    Raises ValueError if the variant is unknown or pyproject no longer lists both ONNX Runtime packages."""
    if variant not in ONNXRUNTIME:
        raise ValueError(f"unknown variant {variant!r}; expected one of {sorted(ONNXRUNTIME)}")
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    runtimes = {requirement_name(d): d for d in dependencies if requirement_name(d) in ONNXRUNTIME.values()}
    if set(runtimes) != set(ONNXRUNTIME.values()):
        raise ValueError(
            f"{pyproject} must list both {sorted(ONNXRUNTIME.values())} (platform-marked) in project.dependencies; "
            f"found {sorted(runtimes)}"
        )
    chosen = runtimes[ONNXRUNTIME[variant]].split(";")[0].strip()
    out = []
    for dependency in dependencies:
        name = requirement_name(dependency)
        if name == ONNXRUNTIME[variant]:
            out.append(chosen)
        elif name not in ONNXRUNTIME.values():
            out.append(dependency)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", choices=sorted(ONNXRUNTIME), help="image variant")
    parser.add_argument(
        "--pyproject", type=Path, default=PYPROJECT, help=f"project file to read (default: {PYPROJECT})"
    )
    args = parser.parse_args(argv)
    try:
        requirements = serving_requirements(args.variant, args.pyproject)
    except (OSError, ValueError, KeyError) as e:
        print(f"requirements.py: {e}", file=sys.stderr)
        return 1
    print("\n".join(requirements))
    return 0


if __name__ == "__main__":
    sys.exit(main())
