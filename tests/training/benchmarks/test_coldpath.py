"""The cold-cache step timer: it times the service's own read and respond steps and refuses bad arguments."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.service.conftest import TINY
from training.benchmarks import coldpath


def test_prints_each_step_cold_and_warm(model_repository: Path, capsys: pytest.CaptureFixture[str]) -> None:
    coldpath.main(["--model-repository", str(model_repository), "--model", TINY, "--samples", "3"])
    text = capsys.readouterr().out
    assert text.startswith("machine: ") and "| step | cold (µs) | warm (µs) | cold ÷ warm |" in text
    rows = re.findall(r"^\| (read|respond) \| (\d+) \| (\d+) \| ([\d.]+) \|$", text, re.MULTILINE)
    assert [r[0] for r in rows] == ["read", "respond"] and all(int(r[1]) > 0 and int(r[2]) > 0 for r in rows)


def test_a_step_that_awaits_is_an_error() -> None:
    async def suspends() -> None:
        import asyncio

        await asyncio.sleep(0)

    with pytest.raises(RuntimeError, match="awaited"):
        coldpath.at_once(suspends())


@pytest.mark.parametrize("args", [["--model", "no-such-model"], ["--samples", "0"]])
def test_bad_arguments_are_usage_errors(
    model_repository: Path, args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        coldpath.main(["--model-repository", str(model_repository), *args])
    assert exit_info.value.code == 2 and ("no model directory" in capsys.readouterr().err or "samples" in args[0])
