"""An app whose CAPSNET_DEFAULT_MODEL is not in the repository is not ready, and says why (capsnet-serve exits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def test_readiness_names_a_missing_default_model(make_client: Any, model_repository: Path) -> None:
    client = make_client(model_repository, default_model="nope")
    r = client.get("/health/ready")
    assert r.status_code == 503
    assert r.json()["error"] == (
        "the default model 'nope' (CAPSNET_DEFAULT_MODEL) is not in the repository; models there: "
        "['tiny', 'tiny-em', 'tiny-nodecoder']"
    )
    assert client.post("/v1/classify", json={"images": [{"array": [[0.0] * 28] * 28}]}).status_code == 404
    assert make_client(model_repository, default_model="tiny").get("/health/ready").status_code == 200
