"""With bearer tokens on, readiness tells a client without one its status, never the models' names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.service.conftest import EM_LIKE, NO_DECODER, TINY


def test_ready_names_the_models_only_to_a_client_with_a_token(
    make_client: Any, model_repository: Path, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("ready-token\n")
    client = make_client(model_repository, auth_tokens_file=tokens)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = client.get("/health/ready", headers=headers)
        assert (r.status_code, r.json()) == (200, {"ready": True})
    r = client.get("/health/ready", headers={"Authorization": "Bearer ready-token"})
    assert r.status_code == 200 and set(r.json()["models"]) == {TINY, NO_DECODER, EM_LIKE}


def test_without_tokens_ready_names_the_models(client: Any) -> None:
    assert set(client.get("/health/ready").json()["models"]) == {TINY, NO_DECODER, EM_LIKE}
