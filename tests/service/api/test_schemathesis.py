"""The OpenAPI document tells the truth: schemathesis, every check on, against a live server on the tiny repository.

Bounded by tests/service/api/schemathesis.toml (10 examples per operation, deterministic generation, no cache) to
about 20 s on two busy cores; its comments say which statuses a schema-valid request may get and why. Its `tiny`
carries a "not a digit" calibration that rejects every image, so that `reject_ood=true` reaches the 422 answer
and the status-code conformance check sees it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.conftest import synthetic_digits
from tests.service.conftest import TINY
from tests.service.live_server import running_server

CONFIG = Path(__file__).with_name("schemathesis.toml")


def schemathesis_command() -> list[str]:
    """The schemathesis CLI of this interpreter's environment (the dev extra)."""
    pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install -e '.[dev]')")
    script = Path(sys.executable).with_name("schemathesis")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from schemathesis.cli import schemathesis; sys.exit(schemathesis())"]


def rejecting_repository(model_repository: Path, root: Path) -> Path:
    """A copy of the tiny repository whose `tiny` is calibrated with a threshold below every score: every image is
    "not a digit", so reject_ood=true answers 422 (the default model is `tiny`: the first name, none has a test
    error)."""
    from training.ood.calibrate import ModelOutputs, calibrate, write_ood_calibration

    repository = root / "repository"
    shutil.copytree(model_repository, repository)
    images, _ = synthetic_digits(32, seed=0)
    features, _ = ModelOutputs(repository / TINY).features((images / 255.0).astype(np.float32).reshape(-1, 1, 28, 28))
    ood = calibrate(features, 50.0, "32 synthetic digits", 0.5)
    write_ood_calibration(repository / TINY, {**ood, "threshold": -1.0})  # scores are >= 0: nothing passes
    assert json.loads((repository / TINY / "model.json").read_text())["ood"]["threshold"] == -1.0
    return repository


@pytest.mark.slow
def test_every_schemathesis_check_passes_on_every_operation(model_repository: Path, tmp_path: Path) -> None:
    with running_server(rejecting_repository(model_repository, tmp_path)) as (base, _):
        done = subprocess.run(
            [*schemathesis_command(), "--config-file", str(CONFIG), "run", f"{base}/openapi.json",
             "--checks", "all", "--workers", "1", "--no-color"],
            cwd=tmp_path, capture_output=True, text=True, timeout=240,
        )  # fmt: skip
    report = done.stdout + done.stderr
    assert done.returncode == 0, report[-8000:]
    selected = re.search(r"Selected: (\d+)/(\d+)", report)
    tested = re.search(r"Tested: (\d+)", report)
    assert selected and tested, report[-3000:]
    assert selected[1] == selected[2] == tested[1] and int(tested[1]) >= 20  # every operation, none skipped
    assert re.search(r"(\d+) generated, \1 passed", report), report[-3000:]


def operation(schema: dict[str, Any], path: str, method: str = "post") -> dict[str, Any]:
    return dict(schema["paths"][path][method])


def test_v2_health_documents_an_empty_body(client: TestClient) -> None:
    """The Open Inference Protocol's health answers carry no body, and the document says so (no JSON promised)."""
    schema = client.get("/openapi.json").json()
    for path, codes in (("/v2/health/live", {"200"}), ("/v2/health/ready", {"200", "400"})):
        responses = operation(schema, path, "get")["responses"]
        assert set(responses) == codes and all("content" not in r for r in responses.values()), path
        assert all("empty body" in r["description"] for r in responses.values())
        response = client.get(path)
        assert response.status_code == 200 and response.content == b"" and "content-type" not in response.headers


def test_request_bodies_require_what_the_server_requires(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    components = schema["components"]["schemas"]
    multipart = operation(schema, "/v1/classify")["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert multipart["required"] == ["files"] and multipart["properties"]["files"]["minItems"] == 1
    assert components["ImagesRequest"]["properties"]["images"]["minItems"] == 1
    decode = components["DecodeRequest"]
    assert decode["oneOf"] == [{"required": ["class"]}, {"required": ["mask"]}]
    assert decode["properties"]["class"]["type"] == "integer" and decode["properties"]["mask"]["type"] == "array"
    assert components["InferenceRequest"]["properties"]["inputs"]["minItems"] == 1
    r = client.post("/v2/models/tiny/infer", json={"inputs": []})
    assert r.status_code == 400 and r.json() == {"error": "missing input 'image' for model 'tiny'"}
