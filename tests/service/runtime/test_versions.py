"""Version folders, the version policy, version-aware routes, and what a name in a request can reach."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from service.core.errors import InvalidInput, ModelNotFound
from service.runtime.model import ModelState
from service.runtime.model_dir import ModelDirError
from service.runtime.repository import POLICY_FILE, VersionPolicy, discover, find_source, read_policy
from tests.service.conftest import EM_LIKE, TINY, digit_image, png_bytes

PNG = [("files", ("a.png", png_bytes(digit_image()), "image/png"))]


def versioned(root: Path, source: Path, versions: tuple[str, ...], policy: dict[str, Any] | None = None) -> Path:
    """`root/tiny/<v>/` for each version, copies of the tiny model; with a version_policy.json when given."""
    for version in versions:
        shutil.copytree(source / TINY, root / TINY / version)
    if policy is not None:
        (root / TINY / POLICY_FILE).write_text(json.dumps(policy))
    return root


def test_latest_version_serves_and_every_route_names_it(
    make_client: Any, model_repository: Path, tmp_path: Path
) -> None:
    client = make_client(versioned(tmp_path, model_repository, ("1", "2")))
    (model,) = client.get("/v1/models").json()["models"]
    assert (model["version"], model["versions"]) == (
        "2",
        [{"version": "2", "state": "ready", "ready": True, "error": None}],
    )
    assert client.post(f"/v1/models/{TINY}/classify", files=PNG).json()["model_version"] == "2"
    assert client.get(f"/v2/models/{TINY}").json()["versions"] == ["2"]
    r = client.post(f"/v1/models/{TINY}/classify?version=1", files=PNG)
    assert (r.status_code, r.json()["error"]) == (404, "model 'tiny' has no version '1' (versions: ['2'])")


def test_policy_all_serves_every_version_each_by_its_address(
    make_client: Any, model_repository: Path, tmp_path: Path
) -> None:
    client = make_client(versioned(tmp_path, model_repository, ("1", "2", "10"), {"all": True}))
    assert client.get(f"/v2/models/{TINY}").json()["versions"] == ["10", "2", "1"]  # numeric order, newest first
    for version in ("1", "2", "10"):
        body = {"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.0] * 784}]}
        r = client.post(f"/v2/models/{TINY}/versions/{version}/infer", json=body)
        assert (r.status_code, r.json()["model_version"]) == (200, version)
        r = client.post(f"/v1/classify?version={version}", files=PNG)  # the default model's version
        assert (r.status_code, r.json()["model_version"]) == (200, version)
    assert client.post(f"/v1/models/{TINY}/classify", files=PNG).json()["model_version"] == "10"
    states = [v["version"] for v in client.get(f"/v1/models/{TINY}").json()["versions"]]
    assert states == ["10", "2", "1"]


@pytest.mark.parametrize(
    ("policy", "serving"),
    [({"specific": [1, 3]}, ["3", "1"]), ({"latest": 2}, ["3", "2"]), ({"specific": ["2"]}, ["2"])],
)
def test_version_policy_selects(
    make_client: Any, model_repository: Path, tmp_path: Path, policy: dict[str, Any], serving: list[str]
) -> None:
    client = make_client(versioned(tmp_path, model_repository, ("1", "2", "3"), policy))
    assert client.get(f"/v2/models/{TINY}").json()["versions"] == serving


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (None, VersionPolicy()),
        ('{"latest": 3}', VersionPolicy("latest", 3)),
        ('{"all": true}', VersionPolicy("all")),
        ('{"specific": [2, "4"]}', VersionPolicy("specific", versions=("2", "4"))),
    ],
)
def test_read_policy(tmp_path: Path, text: str | None, expected: VersionPolicy) -> None:
    if text is not None:
        (tmp_path / POLICY_FILE).write_text(text)
    assert read_policy(tmp_path) == expected


@pytest.mark.parametrize("text", ['{"latest": 0}', '{"all": false}', '{"specific": []}', '{"newest": 1}', "[", "{}"])
def test_malformed_policy_is_refused_naming_the_file(tmp_path: Path, text: str) -> None:
    (tmp_path / POLICY_FILE).write_text(text)
    with pytest.raises(ModelDirError, match=POLICY_FILE):
        read_policy(tmp_path)


def test_malformed_policy_loads_nothing_and_says_why(make_client: Any, model_repository: Path, tmp_path: Path) -> None:
    root = versioned(tmp_path, model_repository, ("1",), {"latest": "two"})
    client = make_client(root, model_control="explicit", load_models=["*"])
    (row,) = client.post("/v2/repository/index").json()
    assert (row["name"], row["state"]) == (TINY, "UNAVAILABLE") and POLICY_FILE in row["reason"]


def test_card_name_must_be_the_model_folders(make_client: Any, model_repository: Path, tmp_path: Path) -> None:
    shutil.copytree(model_repository / EM_LIKE, tmp_path / TINY / "1")  # the card says tiny-em
    client = make_client(tmp_path)
    (model,) = client.get("/v1/models").json()["models"]
    assert model["error"] == "card name 'tiny-em' differs from its model folder's name 'tiny'"


def test_discover_reads_flat_and_versioned_folders(model_repository: Path, tmp_path: Path) -> None:
    shutil.copytree(model_repository / EM_LIKE, tmp_path / EM_LIKE)
    versioned(tmp_path, model_repository, ("1", "2"))
    (tmp_path / "notes").mkdir()  # neither: skipped
    sources = discover(tmp_path)
    assert sorted(sources) == [TINY, EM_LIKE]
    assert (sources[EM_LIKE].versioned, list(sources[EM_LIKE].versions)) == (False, ["3"])  # its card's version
    assert (sources[TINY].versioned, sources[TINY].selected()) == (True, ["2"])


@pytest.mark.parametrize("name", ["..", "../etc", "a/b", "", "Tiny", "-x", "x" * 200])
def test_a_request_name_cannot_leave_the_repository(model_repository: Path, name: str) -> None:
    with pytest.raises(InvalidInput, match="is not a model name"):
        find_source(model_repository, name)


def test_a_link_out_of_the_repository_is_not_found(model_repository: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(model_repository / TINY, root / TINY)
    with pytest.raises(ModelNotFound, match="no model folder 'tiny'"):
        find_source(root, TINY)
    assert find_source(model_repository, TINY).name == TINY


def test_poll_loads_new_versions_reloads_changed_cards_and_unloads_removed(
    make_client: Any, model_repository: Path, tmp_path: Path
) -> None:
    root = versioned(tmp_path, model_repository, ("1",))
    client = make_client(root, model_control="poll", poll_seconds=0.1)

    def serving() -> list[tuple[str, str]]:
        return [(r["version"], r["state"]) for r in client.post("/v2/repository/index").json()]

    def wait_for(expected: list[tuple[str, str]]) -> None:
        deadline = time.monotonic() + 30
        while serving() != expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert serving() == expected

    wait_for([("1", "READY")])
    shutil.copytree(model_repository / TINY, root / TINY / "2")
    wait_for([("2", "READY")])
    before = client.app.state.registry.get(TINY)
    card = json.loads((root / TINY / "2" / "model.json").read_text())
    (root / TINY / "2" / "model.json").write_text(json.dumps({**card, "description": "retrained"}))
    deadline = time.monotonic() + 30
    while client.app.state.registry.get(TINY) is before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.get(f"/v1/models/{TINY}").json()["description"] == "retrained"
    shutil.copytree(model_repository / TINY, root / TINY / "3")  # a copy caught half-way: the graph truncated
    graph = (root / TINY / "3" / "capsnet.onnx").read_bytes()
    (root / TINY / "3" / "capsnet.onnx").write_bytes(graph[: len(graph) // 2])
    deadline = time.monotonic() + 30
    while ("3", "UNAVAILABLE") not in serving() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert serving() == [("3", "UNAVAILABLE"), ("2", "READY")]  # the failed version never replaces the working one
    (root / TINY / "3" / "capsnet.onnx").write_bytes(graph)  # the copy completes: the files changed, tried again
    wait_for([("3", "READY")])
    r = client.post("/v2/repository/models/tiny/load")  # poll: the folder decides
    assert r.status_code == 403 and "CAPSNET_MODEL_CONTROL=explicit" in r.json()["error"]
    shutil.rmtree(root / TINY)
    wait_for([])
    assert client.get("/health/ready").status_code == 503  # the default model has no version left


def test_a_request_holding_the_old_version_finishes_on_it_before_it_is_released(
    make_client: Any, model_repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="service.runtime.registry")
    root = versioned(tmp_path, model_repository, ("1",))
    client = make_client(root, model_control="explicit", load_models=[TINY])
    registry = client.app.state.registry
    old = registry.get(TINY)
    images = np.zeros((1, 1, 28, 28), np.float32)
    with old.lease():  # a request that looked version 1 up and is still reading its body
        shutil.copytree(model_repository / TINY, root / TINY / "2")
        assert client.post(f"/v2/repository/models/{TINY}/load").status_code == 200
        assert registry.get(TINY).version == "2" and old.state is ModelState.UNLOADING
        assert [r["state"] for r in client.post("/v2/repository/index").json()] == ["READY", "UNLOADING"]
        ready = client.post("/v2/repository/index", json={"ready": True}).json()
        assert ready == [{"name": TINY, "version": "2", "state": "READY", "reason": ""}]
        r = client.post("/v2/repository/index", json={"ready": True, "models": []})
        assert r.status_code == 400
        assert r.json()["error"] == "invalid request body: models: Extra inputs are not permitted"
        assert client.portal.call(old.infer, images)["lengths"].shape == (1, 10)  # still served by version 1
    deadline = time.monotonic() + 10
    unloaded = 'capsnet_model_unloads_total{model="tiny"} 1.0'
    while unloaded not in (metrics := client.get("/metrics").text) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert old.state is ModelState.UNLOADED and not old.queue_depth()  # sessions and batchers dropped
    assert unloaded in metrics
    assert 'capsnet_model_loads_total{model="tiny",outcome="ready"} 2.0' in metrics
    assert 'capsnet_model_ready{model="tiny",version="2"} 1.0' in metrics
    assert 'capsnet_model_ready{model="tiny",version="1"}' not in metrics
    assert 'capsnet_model_load_seconds_count{model="tiny"} 2.0' in metrics
    events = [r.getMessage().split(" seconds=")[0] for r in caplog.records if r.getMessage().startswith("lifecycle")]
    assert events == [
        "lifecycle event=load_started model=tiny version=1 path=1",
        "lifecycle event=loaded model=tiny version=1",
        "lifecycle event=load_started model=tiny version=2 path=2",
        "lifecycle event=loaded model=tiny version=2",
        "lifecycle event=draining model=tiny version=1 requests=1",  # the lease held
        "lifecycle event=unloaded model=tiny version=1",
    ]
