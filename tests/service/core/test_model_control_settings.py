"""The model control settings: the CLI options, CAPSNET_LOAD_MODELS and what they refuse."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.core.config import Settings
from service.main import parse_args


def test_cli_options_name_the_control_mode_and_the_models_to_load() -> None:
    args = parse_args(["--model-control", "explicit", "--load-model", "a", "--load-model", "b"])
    assert (args.model_control, args.load_model) == ("explicit", ["a", "b"])
    assert parse_args([]).model_control is None  # the setting (default none) decides


def test_load_models_from_the_environment_are_comma_separated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPSNET_MODEL_CONTROL", "explicit")
    monkeypatch.setenv("CAPSNET_LOAD_MODELS", "capsnet-mnist, capsnet-em-mnist,")
    settings = Settings()
    assert settings.load_models == ["capsnet-mnist", "capsnet-em-mnist"]
    assert (Settings().model_control, Settings(model_control="poll", load_models=[]).poll_seconds) == ("explicit", 10)


def test_load_models_need_explicit_control() -> None:
    with pytest.raises(ValidationError, match="load_models \\(a\\) needs model_control=explicit"):
        Settings(model_control="poll", load_models=["a"])


@pytest.mark.parametrize("field", [{"model_control": "sometimes"}, {"poll_seconds": 0}])
def test_bad_control_settings_are_refused(field: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Settings(**field)
