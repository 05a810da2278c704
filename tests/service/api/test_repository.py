"""The model repository API over REST: the stock tritonclient against a real server, control modes, admin scope,
and zero failed requests through a swap, an unload and a failed load."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.service.conftest import EM_LIKE, TINY, digit_image, png_bytes
from tests.service.live_server import running_server

PNG = png_bytes(digit_image())
V2_BODY = {"inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": [0.0] * 784}]}


def repository(root: Path, models: Path) -> Path:
    """tiny as version folder 1 and tiny-em as a model directory."""
    shutil.copytree(models / TINY, root / TINY / "1")
    shutil.copytree(models / EM_LIKE, root / EM_LIKE)
    return root


def add_version(root: Path, models: Path, version: str, broken: bool = False) -> None:
    """A copy of tiny as `tiny/<version>/`; `broken`: its graph altered after export (a checksum mismatch)."""
    target = root / TINY / version
    shutil.copytree(models / TINY, target)
    if broken:
        graph = target / "capsnet.onnx"
        data = bytearray(graph.read_bytes())
        data[-1] ^= 0xFF
        graph.write_bytes(bytes(data))


def add_em_as_tiny(root: Path, models: Path, version: str) -> None:
    """The EM stand-in, its card renamed tiny: a version of another architecture."""
    target = root / TINY / version
    shutil.copytree(models / EM_LIKE, target)
    card = json.loads((target / "model.json").read_text())
    (target / "model.json").write_text(json.dumps({**card, "name": TINY}))


def rows(client: triton.InferenceServerClient) -> list[tuple[str, str, str]]:
    return [(r["name"], r["version"], r["state"]) for r in client.get_model_repository_index()]


def settle(client: triton.InferenceServerClient, expected: list[tuple[str, str, str]]) -> None:
    """Wait for the index to show `expected` (a drained version leaves it shortly after a swap)."""
    deadline = time.monotonic() + 30
    while rows(client) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert rows(client) == expected


def refusal(call: Callable[[], Any]) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.message())


def test_explicit_control_with_the_stock_http_client(model_repository: Path, tmp_path: Path) -> None:
    root = repository(tmp_path, model_repository)
    with running_server(root, CAPSNET_MODEL_CONTROL="explicit", CAPSNET_LOAD_MODELS=TINY) as (base, _):
        client = triton.InferenceServerClient(base.removeprefix("http://"))
        index = client.get_model_repository_index()
        assert index == [
            {"name": TINY, "version": "1", "state": "READY", "reason": ""},
            {"name": EM_LIKE, "version": "", "state": "UNAVAILABLE", "reason": "unloaded"},
        ]
        assert not client.is_model_ready(EM_LIKE)
        client.load_model(EM_LIKE)
        assert client.is_model_ready(EM_LIKE) and client.get_model_metadata(EM_LIKE)["versions"] == ["3"]
        client.unload_model(EM_LIKE)
        assert not client.is_model_ready(EM_LIKE)
        assert rows(client)[1] == (EM_LIKE, "", "UNAVAILABLE")

        add_version(root, model_repository, "2")
        client.load_model(TINY)  # version 2 warms up beside 1, then 1 drains
        settle(client, [(TINY, "2", "READY"), (EM_LIKE, "", "UNAVAILABLE")])
        assert client.get_model_metadata(TINY)["versions"] == ["2"]

        add_version(root, model_repository, "3", broken=True)
        message = refusal(lambda: client.load_model(TINY))
        assert message.startswith("failed to load model 'tiny': version 3: capsnet.onnx sha256 mismatch")
        assert message.endswith("still serving version(s) ['2']")
        failed = client.get_model_repository_index()[0]
        assert (failed["version"], failed["state"]) == ("3", "UNAVAILABLE") and "sha256 mismatch" in failed["reason"]
        assert [r["version"] for r in client.get_model_repository_index(headers=None) if r["state"] == "READY"] == ["2"]
        assert httpx.post(f"{base}/v2/models/{TINY}/infer", json=V2_BODY).json()["model_version"] == "2"

        shutil.rmtree(root / TINY / "3")
        add_em_as_tiny(root, model_repository, "4")
        message = refusal(lambda: client.load_model(TINY))
        assert "version 4: refused: version 4 has architecture 'em' but the serving version 2 has 'dynamic'" in message
        assert client.is_model_ready(TINY, "2")

        assert refusal(lambda: client.load_model("Tiny")).startswith("'Tiny' is not a model name")
        assert refusal(lambda: client.load_model("nope")) == "no model folder 'nope' in the model repository"
        assert refusal(lambda: client.unload_model("nope")).startswith("model 'nope' is neither loaded nor")
        assert refusal(lambda: client.load_model(TINY, config="{}")).startswith("parameter 'config' is not supported")


def test_control_none_keeps_the_repository_api_off(client: Any) -> None:
    for path in ("/v2/repository/index", f"/v2/repository/models/{TINY}/load", f"/v2/repository/models/{TINY}/unload"):
        r = client.post(path)
        assert r.status_code == 403 and r.json() == {
            "error": "the model repository API is off (CAPSNET_MODEL_CONTROL=none); start the server with "
            "--model-control explicit (load and unload by the API) or poll"
        }


def test_repository_api_needs_an_admin_token(make_client: Any, model_repository: Path, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("# serving only, then an admin\nreader-token\nadmin-token admin\n")
    client = make_client(model_repository, model_control="explicit", load_models=[TINY], auth_tokens_file=tokens)

    def index(token: str | None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return client.post("/v2/repository/index", headers=headers)  # type: ignore[no-any-return]

    assert index(None).status_code == 401
    assert index("wrong").status_code == 401
    r = index("reader-token")
    assert r.status_code == 403 and r.json()["error"].startswith("this bearer token lacks the admin scope")
    assert index("admin-token").status_code == 200
    # both tokens still serve
    for token in ("reader-token", "admin-token"):
        r = client.get(f"/v2/models/{TINY}", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200


def test_unknown_scope_in_the_token_file_is_refused(tmp_path: Path) -> None:
    from service.core.auth import TokenStore
    from service.core.config import ConfigError

    tokens = tmp_path / "tokens"
    tokens.write_text("abc\nxyz root\n")
    with pytest.raises(ConfigError, match="line 2 names the unknown scope 'root' \\(known: admin\\)"):
        TokenStore.from_file(tokens)


def test_zero_failed_requests_through_a_swap_an_unload_and_a_failed_load(
    model_repository: Path, tmp_path: Path
) -> None:
    """Four v1 PNG and four v2 clients send requests without pause while version 2 replaces 1, tiny-em is
    unloaded and a broken version 3 fails to load: every request is answered 200."""
    root = repository(tmp_path, model_repository)
    env = {"CAPSNET_MODEL_CONTROL": "explicit", "CAPSNET_LOAD_MODELS": f"{TINY},{EM_LIKE}"}
    with running_server(root, **env) as (base, _):
        statuses: Counter[int] = Counter()
        versions: list[str] = []
        stop = threading.Event()

        def send(v1: bool) -> None:
            with httpx.Client(base_url=base, timeout=30) as http:
                while not stop.is_set():
                    if v1:
                        r = http.post(f"/v1/models/{TINY}/classify", files=[("files", ("7.png", PNG, "image/png"))])
                    else:
                        r = http.post(f"/v2/models/{TINY}/infer", json=V2_BODY)
                    statuses[r.status_code] += 1
                    if r.status_code == 200:
                        versions.append(r.json()["model_version"])

        threads = [threading.Thread(target=send, args=(i % 2 == 0,)) for i in range(8)]
        for thread in threads:
            thread.start()
        admin = httpx.Client(base_url=base, timeout=120)
        try:
            time.sleep(0.5)
            add_version(root, model_repository, "2")
            assert admin.post(f"/v2/repository/models/{TINY}/load").status_code == 200
            time.sleep(0.5)
            assert admin.post(f"/v2/repository/models/{EM_LIKE}/unload").status_code == 200
            add_version(root, model_repository, "3", broken=True)
            assert admin.post(f"/v2/repository/models/{TINY}/load").status_code == 400
            time.sleep(0.5)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            admin.close()
        assert set(statuses) == {200} and statuses[200] > 50, statuses
        assert versions[0] == "1" and versions[-1] == "2" and set(versions) == {"1", "2"}
