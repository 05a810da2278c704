"""The packages' shape: no import cycles, training reaches service/ only through the model directory, small modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "training", "service")
MAX_LINES = 600
MODEL_DIR_MODULE = "service.runtime.model_dir"
# The torch-free service modules training may use, each because both sides must compute the same thing:
SHARED_WITH_TRAINING = {
    MODEL_DIR_MODULE: "the model directory: export writes it, evaluation and the service read it",
    "service.runtime.ood": "the 'not a digit' score: calibration writes its card entry, the service computes it",
    "service.imaging": "the service's preprocessing of uploads, which the non-digit sets must go through",
    "service.machine": "the torch-free machine facts (CPU model, load, busy share) both benchmarks record",
    "service.raw_ort": "raw ONNX Runtime timing with parallel callers, as the service runs, for both benchmarks",
    "service.explanation": "the explanation maps: the faithfulness report measures the ones the service serves",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((REPO_ROOT / package).rglob("*.py"))}


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports anywhere (also inside functions), resolved to module names."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    """Packages' __init__ modules are left out: importing a submodule runs them, but they import nothing back."""
    edges = {m: {d for d in deps if d not in PACKAGES} for m, deps in graph.items()}
    state: dict[str, str] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(edges.get(node, ())):
            if state.get(dep) == "open":
                cycles.append([*stack[stack.index(dep) :], dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_training_reaches_service_only_through_the_shared_modules(graph: dict[str, set[str]]) -> None:
    allowed = {"service", "service.runtime", *SHARED_WITH_TRAINING}
    leaks = {
        m: sorted(d for d in deps if d.startswith("service") and d not in allowed)
        for m, deps in graph.items()
        if m.startswith("training")
    }
    assert {m: d for m, d in leaks.items() if d} == {}


def test_model_and_service_stay_apart(graph: dict[str, set[str]]) -> None:
    """model/ imports only model/; service/ never imports model/ or training/ (the serving install has no torch)."""
    model_leaks = {
        m: sorted(d) for m, d in graph.items() if m.startswith("model") and any(not x.startswith("model") for x in d)
    }
    service_leaks = {
        m: sorted(d)
        for m, d in graph.items()
        if m.startswith("service") and any(x.startswith(("model", "training")) for x in d)
    }
    assert (model_leaks, service_leaks) == ({}, {})


def test_no_module_is_longer_than_the_limit() -> None:
    long = {
        name: n for name, path in project_modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
