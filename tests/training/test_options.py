"""The shared options: one flag, type, choices and default text whichever command adds them."""

from __future__ import annotations

import argparse

import pytest

from training import options


def parser_with_all() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="probe")
    options.add_data_dir(parser)
    options.add_device(parser, "training device")
    options.add_threads(parser, "torch CPU threads", 1)
    return parser


def test_defaults_and_help_text() -> None:
    parser = parser_with_all()
    args = parser.parse_args([])
    assert (args.data_dir, args.device, args.threads) == (None, "auto", 1)
    text = parser.format_help()
    assert "MNIST IDX directory (default: $CAPSNET_DATA_DIR)" in text
    assert "training device (default: auto)" in text and "torch CPU threads (default: 1)" in text


def test_values_are_parsed_and_checked(capsys: pytest.CaptureFixture[str]) -> None:
    parser = parser_with_all()
    args = parser.parse_args(["--data-dir", "d", "--device", "cpu", "--threads", "3"])
    assert (args.data_dir, args.device, args.threads) == ("d", "cpu", 3)
    for bad in (["--device", "gpu"], ["--threads", "two"]):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(bad)
        assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --device: invalid choice: 'gpu'" in err and "argument --threads: invalid int value" in err


def test_a_default_can_be_described_instead_of_shown() -> None:
    parser = argparse.ArgumentParser()
    options.add_threads(parser, "intra-op threads", default_text="the CPU quota, as the service")
    assert parser.parse_args([]).threads is None
    assert "intra-op threads (default: the CPU quota, as the service)" in parser.format_help()
