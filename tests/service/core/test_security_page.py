"""docs/security.md lists every limit with the default the settings really have."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.core.config import Settings, env_name

PAGE = Path(__file__).resolve().parents[3] / "docs" / "security.md"
NOT_LIMITS = {"max_batch_size", "max_queue_delay_ms"}  # batching choices, not bounds on a client
LIMITS = [name for name in Settings.model_fields if name.startswith(("http_", "max_")) and name not in NOT_LIMITS]
LIMITS += ["request_timeout_s", "auth_metrics", "auth_tokens_file"]


@pytest.mark.parametrize("name", LIMITS)
def test_the_security_page_names_each_limit_with_its_default(name: str) -> None:
    text = PAGE.read_text()
    default = Settings.model_fields[name].default
    if isinstance(default, bool) or default is None:
        assert f"`{env_name(name)}" in text
        return
    shown = f"{default:g}" if isinstance(default, float) else str(default)
    assert f"| `{env_name(name)}` | `{shown}`" in text, name
