"""docs/api-examples.md shows what docs/api-examples.sh printed: the server's compact JSON, not re-serialised."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import REPO_ROOT

START, END = "<!-- api-examples:start -->", "<!-- api-examples:end -->"
EXAMPLES_PAGE = REPO_ROOT / "docs" / "api-examples.md"


def example_outputs(page: Path) -> list[str]:
    """The output blocks (the un-tagged fences after each ```sh command) between the api-examples markers."""
    text = page.read_text()
    section = text[text.index(START) : text.index(END)]
    return [block.strip("\n") for block in re.findall(r"```sh\n.*?\n```\n```\n(.*?)```", section, flags=re.S)]


def test_every_json_example_is_compact_as_the_server_sends_it() -> None:
    outputs = example_outputs(EXAMPLES_PAGE)
    json_outputs = [o for o in outputs if o.startswith("{")]
    assert len(outputs) >= 18 and len(json_outputs) >= 12
    for output in json_outputs:
        json.loads(output)
        # no whitespace outside strings (numbers keep the server's spelling: its encoder writes 4e-6, Python 4e-06)
        assert not re.search(r"\s", re.sub(r'"(?:\\.|[^"\\])*"', '""', output)), output[:200]


def test_the_examples_cover_both_bundled_models() -> None:
    outputs = "\n".join(example_outputs(EXAMPLES_PAGE))
    for model in sorted(p.parent.name for p in (REPO_ROOT / "model" / "zoo").glob("*/model.json")):
        assert f'"model":"{model}"' in outputs, model
