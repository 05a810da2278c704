"""The packages' shape: one concern per folder, the rules between packages, one owner per duty, the layout page."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "training", "service")
MAX_LINES = 600
# The one service module training/ imports (outside its benchmarks, which measure the server itself).
CONTRACT = "service.contract"
BENCHMARKS = "training.benchmarks"
# training/'s top level holds the subpackages and the command-line modules only.
TRAINING_TOP_LEVEL = {"training.entry", "training.options"}
# service/ is the server: the app, its packages and the modules the app itself runs.
SERVICE_TOP_LEVEL = {"service.main", "service.contract", "service.imaging", "service.explanation", "service.machine"}
LAYOUT_PAGE = REPO_ROOT / "docs" / "code-layout.md"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in sorted((REPO_ROOT / package).rglob("*.py"))}


def project_packages() -> list[str]:
    return sorted(name for name, path in project_modules().items() if path.name == "__init__.py")


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
    packages = set(project_packages())
    edges = {m: {d for d in deps if d not in packages} for m, deps in graph.items()}
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


def test_training_reaches_service_only_through_the_contract(graph: dict[str, set[str]]) -> None:
    """training.benchmarks measures the server, so it may import it; the rest of training/ imports service.contract."""
    allowed = {"service", CONTRACT}
    leaks = {
        m: sorted(d for d in deps if d.split(".")[0] == "service" and d not in allowed)
        for m, deps in graph.items()
        if m.split(".")[0] == "training" and not (m == BENCHMARKS or m.startswith(BENCHMARKS + "."))
    }
    assert {m: d for m, d in leaks.items() if d} == {}


def test_the_contract_is_only_reexports() -> None:
    """service/contract.py defines nothing: every name it offers has one owner elsewhere in service/."""
    tree = ast.parse((REPO_ROOT / "service" / "contract.py").read_text())
    own = [type(n).__name__ for n in tree.body if not isinstance(n, ast.ImportFrom | ast.Assign | ast.Expr)]
    assert own == []


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


def test_training_is_in_subpackages() -> None:
    """Apart from the command-line modules, every training module sits in a subpackage."""
    top = {m for m in project_modules() if m.count(".") == 1 and m.startswith("training.")}
    loose = {m for m in top if m not in TRAINING_TOP_LEVEL and m not in project_packages()}
    assert loose == set()


def test_service_is_the_server() -> None:
    """No benchmark, load generator or probe in service/: its top level is the app and what the app runs."""
    top = {m for m in project_modules() if m.count(".") == 1 and m.startswith("service.")}
    assert top - SERVICE_TOP_LEVEL - set(project_packages()) == set()


def test_no_module_is_longer_than_the_limit() -> None:
    long = {
        name: n for name, path in project_modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_tests_mirror_the_packages() -> None:
    """Every folder under tests/ (but deploy/, the image's checks) is a package's mirror, with an __init__.py."""
    folders = [p for p in (REPO_ROOT / "tests").rglob("*") if p.is_dir() and p.name != "__pycache__"]
    mirrors = [
        p.relative_to(REPO_ROOT / "tests") for p in folders if p.relative_to(REPO_ROOT / "tests").parts[0] in PACKAGES
    ]
    assert [str(m) for m in mirrors if not (REPO_ROOT / m / "__init__.py").is_file()] == []
    assert [str(m) for m in mirrors if not (REPO_ROOT / "tests" / m / "__init__.py").is_file()] == []


def test_the_layout_page_names_every_package_and_no_other() -> None:
    """docs/code-layout.md names each package as `path/` in its packages table, and nothing that is not there."""
    page = LAYOUT_PAGE.read_text()
    named = set(re.findall(r"^\| `((?:model|training|service)(?:/[a-z_]+)*)/` \|", page, re.M))
    packages = {p.replace(".", "/") for p in project_packages()}
    assert (sorted(packages - named), sorted(named - packages)) == ([], [])


# One owner per duty: (what is written, the one module that may write it).
SESSION_MAKERS = {"InferenceSession", "SessionOptions"}
CLOCKS = {"perf_counter", "process_time", "clock"}
SHARED_OPTIONS = {"--data-dir", "--device", "--threads"}
# The load generators keep requests in flight until a deadline: load, not a timed loop (asyncio, so timed_runs
# cannot drive them).
LOAD_LOOPS = {"training.benchmarks.loadgen", "training.benchmarks.grpc_load"}


def called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def is_torch_optimizer(call: ast.Call) -> bool:
    """`torch.optim.Adam(...)` and the like (not `torch.optim.lr_scheduler.*`)."""
    func = call.func
    return (
        isinstance(func, ast.Attribute)
        and func.attr[:1].isupper()
        and isinstance(func.value, ast.Attribute)
        and func.value.attr == "optim"
        and isinstance(func.value.value, ast.Name)
        and func.value.value.id == "torch"
    )


def duty_sites() -> dict[str, set[str]]:
    """For each duty, the modules that perform it."""
    sites: dict[str, set[str]] = {"session": set(), "optimizer": set(), "timing loop": set(), "shared option": set()}
    for name, path in project_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                called = called_name(node)
                if called in SESSION_MAKERS:
                    sites["session"].add(name)
                if is_torch_optimizer(node) or called == "zero_grad":
                    sites["optimizer"].add(name)
                first = node.args[0] if node.args else None
                if called == "add_argument" and isinstance(first, ast.Constant) and first.value in SHARED_OPTIONS:
                    sites["shared option"].add(name)
            if isinstance(node, ast.While) and any(
                isinstance(n, ast.Call) and called_name(n) in CLOCKS for n in ast.walk(node.test)
            ):
                sites["timing loop"].add(name)
    return sites


def test_each_duty_has_one_owner() -> None:
    """Sessions and their options, the optimizer and its step, timing loops and the shared options: one module each."""
    sites = duty_sites()
    sites["timing loop"] -= LOAD_LOOPS
    assert sites == {
        "session": {"service.runtime.model_dir"},
        "optimizer": {"training.fitting.loop"},
        "timing loop": {"training.benchmarks.timing"},
        "shared option": {"training.options"},
    }


def test_the_duty_check_sees_a_second_owner(tmp_path: Path) -> None:
    """The checks above find what they look for: each pattern, written in a scratch module, is seen."""
    source = (
        "import time, torch, onnxruntime as ort\n"
        "ort.InferenceSession(b'')\n"
        "torch.optim.SGD([])\n"
        "while time.perf_counter() < 1: pass\n"
        "parser.add_argument('--device')\n"
    )
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    assert {called_name(c) for c in calls} >= {"InferenceSession", "perf_counter", "add_argument"}
    assert any(is_torch_optimizer(c) for c in calls)
    assert not is_torch_optimizer(ast.parse("torch.optim.lr_scheduler.ExponentialLR(o)").body[0].value)  # type: ignore[attr-defined]
