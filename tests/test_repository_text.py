"""Tracked text files name no folder of the machine that wrote them and read as documentation, not a work diary."""

from __future__ import annotations

import ast
import re
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
# Paths inside the container image are the image's, not the machine's.
CONTAINER_FILES = re.compile(r"^deploy/(.*/)?(Dockerfile[^/]*|[^/]+\.ya?ml|\.dockerignore)$")
DIARY_TERMS = {
    "a period of work ('session N', 'this session')": re.compile(
        r"\bsessions? \d+|\b(this|that|a later|an earlier|the previous|the next) session\b", re.IGNORECASE
    ),
    "a reference no reader can follow ('the issue')": re.compile(r"\bthe issue\b", re.IGNORECASE),
    "an issue number ('#NN')": re.compile(r"(?<![\w&$#/])#[1-9]\d{0,3}\b"),
}


def tracked_text_files() -> list[str]:
    """Tracked files outside tests/ that decode as UTF-8 text (binary files and LFS pointers aside)."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: no list of tracked files")
    names = [n for n in listed.decode().split("\0") if n and not n.startswith("tests/")]
    texts = []
    for name in names:
        data = (REPO_ROOT / name).read_bytes() if (REPO_ROOT / name).is_file() else b"\0"
        if b"\0" in data:
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        texts.append(name)
    return texts


def machine_roots() -> list[str]:
    """The checkout's parent folders, the home folder and the temporary folder, as absolute paths."""
    roots = {str(p) for p in REPO_ROOT.parents if p != Path(p.anchor)}
    roots |= {str(REPO_ROOT), str(Path.home()), tempfile.gettempdir(), "/tmp", "/root"}
    return sorted(r for r in roots if r not in ("/", ""))


def offences(pattern: re.Pattern[str], names: list[str]) -> list[str]:
    found = []
    for name in names:
        for number, line in enumerate((REPO_ROOT / name).read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{name}:{number}: {m.group(0)!r}" for m in pattern.finditer(line)]
    return found


def test_no_absolute_path_of_the_machine() -> None:
    # a root followed by "/": "/tmp/x.json" is the machine's, a bare "/tmp" a mount point named in prose
    roots = "|".join(re.escape(r) for r in machine_roots())
    pattern = re.compile(rf"(?<![\w.~-])(?:{roots})/[\w.-]")
    names = [n for n in tracked_text_files() if not CONTAINER_FILES.match(n)]
    found = offences(pattern, names)
    assert not found, "absolute paths of the machine (write them relative to the checkout):\n" + "\n".join(found)


@pytest.mark.parametrize("term", sorted(DIARY_TERMS))
def test_no_work_diary(term: str) -> None:
    names = [n for n in tracked_text_files() if not n.endswith(".css")]  # "#000" is a colour
    found = offences(DIARY_TERMS[term], names)
    assert not found, f"{term} (describe the present; history goes into CHANGELOG.md):\n" + "\n".join(found)


def test_the_scan_finds_what_it_looks_for() -> None:
    """The patterns catch the forms they are meant to, and leave ONNX Runtime sessions and colours alone."""
    hits = {
        "measured in session 13": True,
        "Re-measured in a later session": True,
        "as the issue asked": True,
        "targets of #20": True,
        "an ONNX Runtime session per graph": False,
        "color: #000;": False,
        "&#39; and $#": False,
    }
    for text, expected in hits.items():
        assert any(p.search(text) for p in DIARY_TERMS.values()) is expected, text
    roots = "|".join(re.escape(r) for r in machine_roots())
    pattern = re.compile(rf"(?<![\w.~-])(?:{roots})/[\w.-]")
    assert pattern.search(f"--out {REPO_ROOT.parent}/runs/x") and pattern.search("--json /tmp/s13/quiet.json")
    assert not pattern.search("--out ../runs/x, an emptyDir on /tmp, https://example.org/tmp/x")


# The module docstrings of the big subsystems may say more than a contract; every other docstring states one.
LONG_MODULE_DOCSTRINGS = {"model/em.py", "model/fused.py"}
MAX_DOCSTRING_LINES = 12


def test_docstrings_state_the_contract_in_a_few_lines() -> None:
    found = []
    for path in sorted(p for package in ("model", "training", "service") for p in (REPO_ROOT / package).rglob("*.py")):
        name = path.relative_to(REPO_ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            doc = ast.get_docstring(node, clean=False)
            if not doc or (isinstance(node, ast.Module) and name in LONG_MODULE_DOCSTRINGS):
                continue
            if len(doc.splitlines()) > MAX_DOCSTRING_LINES:
                found.append(
                    f"{name}:{getattr(node, 'lineno', 1)} {getattr(node, 'name', 'module')}: {len(doc.splitlines())}"
                )
    assert not found, f"docstrings over {MAX_DOCSTRING_LINES} lines (measurements belong in docs/):\n" + "\n".join(
        found
    )
