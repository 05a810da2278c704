"""The documentation site builds strictly (no broken link, anchor or page) and every file under docs/ is reachable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCS = REPO_ROOT / "docs"
# Files under docs/ that are not pages and that no page links to, each with the page that names it.
NAMED_NOT_LINKED = {"api-examples.sh": "api-examples.md"}
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)|src=\"([^\"#]+)\"")


@pytest.mark.slow
def test_mkdocs_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert (site / "index.html").is_file() and (site / "getting-started.html").is_file()
    html = (site / "index.html").read_text()
    assert "fonts.googleapis.com" not in html and "fonts.gstatic.com" not in html  # builds and reads offline


def nav_pages(entries: list) -> set[str]:
    pages: set[str] = set()
    for entry in entries:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            pages |= nav_pages(value) if isinstance(value, list) else {value}
    return pages


def test_every_file_under_docs_is_reachable_from_the_navigation_or_a_page() -> None:
    config = yaml.load((REPO_ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    pages = nav_pages(config["nav"])
    assert "getting-started.md" in pages and "serving.md" in pages and "kubernetes.md" in pages
    linked: set[Path] = set()
    for page in DOCS.rglob("*.md"):
        for match in LINK.finditer(page.read_text()):
            target = match.group(1) or match.group(2)
            if "://" not in target:
                linked.add((page.parent / target).resolve())
    unreachable = []
    for path in sorted(p for p in DOCS.rglob("*") if p.is_file()):
        name = path.relative_to(DOCS).as_posix()
        if name in pages or path.resolve() in linked:
            continue
        if name in NAMED_NOT_LINKED and name in (DOCS / NAMED_NOT_LINKED[name]).read_text():
            continue
        unreachable.append(name)
    assert not unreachable, "not in mkdocs.yml's nav nor linked from a page: " + ", ".join(unreachable)
