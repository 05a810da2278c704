"""Where a newcomer starts: the console scripts are not on PATH, and the Makefile says so when it installs them."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO_ROOT

ACTIVATE = "source .venv/bin/activate"


@pytest.mark.parametrize("target", [".venv/.serve-installed", ".venv/.dev-installed"])
def test_installing_says_where_the_commands_are(target: str) -> None:
    if shutil.which("make") is None:
        pytest.skip("no make on PATH")
    plan = subprocess.run(["make", "-n", "-B", target], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    (hint,) = [line for line in plan.stdout.splitlines() if "capsnet-* commands" in line]
    assert ".venv/bin/capsnet-train" in hint and f"'{ACTIVATE}'" in hint


def code_lines(page: str) -> list[str]:
    """The lines inside the page's fenced code blocks, in order."""
    lines, inside = [], False
    for line in page.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            lines.append(line)
    return lines


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_the_pages_say_where_the_commands_are_before_the_first_bare_one(page: str) -> None:
    text = (REPO_ROOT / page).read_text()
    bare = [i for i, line in enumerate(code_lines(text)) if line.lstrip().startswith("capsnet-")]
    if not bare:
        return
    first = code_lines(text)[bare[0]]
    said = text[: text.index(first)]
    assert ACTIVATE in said or ".venv/bin/capsnet-" in said, f"{page}: {first!r} comes before any word on .venv"
