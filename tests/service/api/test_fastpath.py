"""The fast path (service.api.fastpath): the same answers as the FastAPI routes, which still answer the rest."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

import service.api.fastpath as fastpath
from service.api.fastpath import address
from service.main import create_app, http_server, listening_socket
from service.runtime.batcher import DynamicBatcher
from service.runtime.model import ServedModel
from tests.service.api.test_explain_ood import CALIBRATED, calibrated_repository  # noqa: F401 (a fixture)
from tests.service.conftest import NO_DECODER, TINY, digit_image, png_bytes, service_settings

TOKEN = "fast-path-token"
PNG = png_bytes(digit_image())
DARK_PNG = png_bytes(digit_image(dark_on_light=True))
# Headers that say something about the body; `date` and `server` differ by time and are not the app's.
COMPARED_HEADERS = ("content-type", "content-length", "www-authenticate", "retry-after")


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths whose images the fast path read (`FastPath.read`): it answers them itself, client errors too."""
    answered: list[str] = []
    original = fastpath.FastPath.read

    async def spy(self: fastpath.FastPath, scope: Any, *args: Any) -> Any:
        answered.append(scope["path"])
        return await original(self, scope, *args)

    monkeypatch.setattr(fastpath.FastPath, "read", spy)
    return answered


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture
def pair(make_client: Callable[..., TestClient], model_repository: Path) -> Iterator[tuple[TestClient, TestClient]]:
    """(fast path on, fast path off) over the same repository."""
    yield (
        make_client(model_repository, default_model=TINY),
        make_client(model_repository, default_model=TINY, fast_path=False),
    )


def answer(client: TestClient, path: str, **kwargs: Any) -> tuple[int, Any, dict[str, str]]:
    response = client.post(path, **kwargs)
    try:
        body: Any = response.json()
    except json.JSONDecodeError:
        body = response.text
    return response.status_code, body, {k: response.headers[k] for k in COMPARED_HEADERS if k in response.headers}


@pytest.mark.parametrize(
    "path",
    ["/v1/classify", f"/v1/models/{TINY}/classify", "/v1/capsules", f"/v1/models/{NO_DECODER}/capsules"],
)
def test_the_fast_path_answers_plain_requests_exactly_as_the_route(
    pair: tuple[TestClient, TestClient], served: list[str], path: str
) -> None:
    fast, routed = pair
    files = [("files", ("a.png", PNG, "image/png")), ("files", ("b.png", DARK_PNG, "image/png"))]
    got = answer(fast, path, files=files)
    assert served == [path]
    expected = answer(routed, path, files=files)
    assert served == [path]  # the app without the fast path never reaches it
    assert got == expected
    assert got[0] == 200 and got[2]["content-type"] == "application/json"
    results = got[1]["predictions"] if "classify" in path else got[1]["capsules"]
    assert [r["preprocessing"]["inverted"] for r in results] == [False, True]


@pytest.mark.parametrize("operation", ["classify", "capsules"])
def test_the_not_a_digit_fields_are_the_routes_too(
    make_client: Callable[..., TestClient],
    calibrated_repository: Path,  # noqa: F811 (the imported fixture)
    served: list[str],
    operation: str,
) -> None:
    fast = make_client(calibrated_repository, default_model=CALIBRATED)
    routed = make_client(calibrated_repository, default_model=CALIBRATED, fast_path=False)
    files = [("files", ("a.png", PNG, "image/png")), ("files", ("b.png", DARK_PNG, "image/png"))]
    path = f"/v1/models/{CALIBRATED}/{operation}"
    got = answer(fast, path, files=files)
    assert served == [path] and got == answer(routed, path, files=files)
    results = got[1]["predictions" if operation == "classify" else "capsules"]
    assert all(r["ood_score"] is not None and isinstance(r["in_distribution"], bool) for r in results)


def test_json_bodies_take_the_fast_path_too(pair: tuple[TestClient, TestClient], served: list[str]) -> None:
    fast, routed = pair
    body = {"images": [{"array": (digit_image() / 255.0).tolist()}]}
    got = answer(fast, "/v1/classify", json=body)
    assert served == ["/v1/classify"]
    assert got == answer(routed, "/v1/classify", json=body) and got[0] == 200


ONE_PNG = {"files": [("files", ("a.png", PNG, "image/png"))]}
MULTIPART = "multipart/form-data"
NO_PART = {"content": b"--x--\r\n", "headers": {"content-type": f"{MULTIPART}; boundary=x"}}
FALL_THROUGH: list[tuple[str, str, dict[str, Any], int, str]] = [
    ("bad image", "/v1/classify", {"files": [("files", ("x.png", b"not an image", "image/png"))]}, 400, "file 0"),
    ("wrong content type", "/v1/classify", {"content": b"abc", "headers": {"content-type": "text/plain"}}, 415, ""),
    ("too many images", "/v1/classify", {"files": [("files", ("a.png", PNG, "image/png"))] * 3}, 413, "too many"),
    ("no images", "/v1/capsules", {"files": [("f", (None, b"1"))]}, 400, "unexpected form field"),
    ("unknown model", "/v1/models/absent/classify", ONE_PNG, 404, ""),
    ("query option", "/v1/classify?top_k=0", ONE_PNG, 400, "top_k"),
    ("reject_ood", "/v1/classify?reject_ood=true", ONE_PNG, 409, "calibration"),
    ("no boundary", "/v1/classify", {"content": b"--x\r\n", "headers": {"content-type": MULTIPART}}, 400, "boundary"),
    ("no part", "/v1/capsules", NO_PART, 400, "no images"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "path", "kwargs", "status", "message"), FALL_THROUGH, ids=[c[0] for c in FALL_THROUGH]
)
def test_what_the_fast_path_does_not_answer_gets_the_routes_answer(
    make_client: Callable[..., TestClient],
    model_repository: Path,
    case: str,
    path: str,
    kwargs: dict[str, Any],
    status: int,
    message: str,
) -> None:
    fast = make_client(model_repository, default_model=TINY, max_images_per_request=2)
    routed = make_client(model_repository, default_model=TINY, max_images_per_request=2, fast_path=False)
    got = answer(fast, path, **kwargs)
    assert got == answer(routed, path, **kwargs)
    assert got[0] == status and message in got[1]["error"], got


def test_a_missing_or_wrong_token_gets_the_routes_401_and_a_good_one_the_fast_path(
    make_client: Callable[..., TestClient], model_repository: Path, token_file: Path, served: list[str]
) -> None:
    fast = make_client(model_repository, default_model=TINY, auth_tokens_file=token_file)
    routed = make_client(model_repository, default_model=TINY, auth_tokens_file=token_file, fast_path=False)
    files = [("files", ("a.png", PNG, "image/png"))]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic abc"}):
        got = answer(fast, "/v1/classify", files=files, headers=headers)
        assert got == answer(routed, "/v1/classify", files=files, headers=headers)
        assert got[0] == 401 and "www-authenticate" in got[2]
    assert served == []
    good = {"Authorization": f"Bearer {TOKEN}"}
    got = answer(fast, "/v1/classify", files=files, headers=good)
    assert served == ["/v1/classify"]
    assert got == answer(routed, "/v1/classify", files=files, headers=good) and got[0] == 200


def test_answers_of_the_fast_path_are_counted_under_the_route_template(
    make_client: Callable[..., TestClient], model_repository: Path, served: list[str]
) -> None:
    client = make_client(model_repository, default_model=TINY)
    files = [("files", ("a.png", PNG, "image/png"))]
    for path in ("/v1/classify", "/v1/classify", f"/v1/models/{TINY}/classify", "/v1/models/absent/classify"):
        client.post(path, files=files)
    assert len(served) == 3
    metrics = client.get("/metrics").text
    for route, status, count in (
        ("/v1/classify", 200, 2),
        ("/v1/models/{name}/classify", 200, 1),
        ("/v1/models/{name}/classify", 404, 1),
    ):
        assert (
            f'capsnet_http_requests_total{{method="POST",protocol="http",route="{route}",status="{status}"}} {count}.0'
        ) in metrics
        assert (
            f'capsnet_http_request_duration_seconds_count{{method="POST",protocol="http",route="{route}"}}' in metrics
        )


def test_inference_errors_are_answered_as_the_error_handlers_would(
    pair: tuple[TestClient, TestClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.core.errors import Overloaded
    from service.runtime.model import ServedModel

    async def overloaded(self: ServedModel, images: Any, alone: bool = False) -> Any:
        raise Overloaded("model 'tiny' has 9 requests queued; retry later")

    monkeypatch.setattr(ServedModel, "infer", overloaded)
    fast, routed = pair
    files = [("files", ("a.png", PNG, "image/png"))]
    got = answer(fast, "/v1/classify", files=files)
    assert got == answer(routed, "/v1/classify", files=files)
    assert got[0] == 503 and got[2]["retry-after"] == "1" and got[1]["type"] == "overloaded"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v1/classify", ("classify", None)),
        ("/v1/capsules", ("capsules", None)),
        ("/v1/models/m/classify", ("classify", "m")),
        ("/v1/models/m/capsules", ("capsules", "m")),
        ("/v1/reconstruct", None),
        ("/v1/models/m/reconstruct", None),
        ("/v1/models//classify", None),
        ("/v1/models/m/classify/", None),
        ("/v1/classify/", None),
        ("/v2/classify", None),
    ],
)
def test_address_recognises_only_the_operations_it_serves(path: str, expected: tuple[str, str | None] | None) -> None:
    assert address(path) == expected


def test_a_body_that_cannot_carry_images_is_left_to_the_route_unread(
    make_client: Callable[..., TestClient], model_repository: Path, served: list[str]
) -> None:
    client = make_client(model_repository, default_model=TINY)
    r = client.post("/v1/classify", content=b"abc", headers={"content-type": "text/plain"})
    assert r.status_code == 415 and "text/plain" in r.json()["error"]
    assert served == []  # the route answered, without the fast path reading the body first


@pytest.mark.parametrize(("tasks", "alone"), [(None, False), (1, True), (2, False)])
def test_a_request_is_alone_when_uvicorn_has_read_no_other(
    make_client: Callable[..., TestClient],
    model_repository: Path,
    monkeypatch: pytest.MonkeyPatch,
    tasks: int | None,
    alone: bool,
) -> None:
    """`alone` goes to the model when uvicorn's request tasks (`state.http_tasks`) hold only this request; without
    that set (not run by `serve`) no request counts as alone."""
    told: list[bool] = []
    original = ServedModel.infer

    async def spy(self: ServedModel, images: Any, alone: bool = False) -> Any:
        told.append(alone)
        return await original(self, images, alone)

    monkeypatch.setattr(ServedModel, "infer", spy)
    client = make_client(model_repository, default_model=TINY)
    if tasks is not None:
        client.app.state.http_tasks = {object() for _ in range(tasks)}  # type: ignore[attr-defined]
    assert client.post("/v1/classify", files=[("files", ("a.png", PNG, "image/png"))]).status_code == 200
    assert told == [alone]


@pytest.mark.slow
def test_under_uvicorn_a_lone_request_runs_on_the_event_loop_and_a_burst_on_the_workers(
    model_repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real server (`http_server`, uvicorn's request tasks wired in): requests one at a time are run
    by the event loop's own thread; a concurrent burst goes to the batcher's workers and is batched. (The burst's
    clients send together and its runs are slowed, so that its requests overlap: the tiny model's runs are faster
    than clients in this same process send, and one at a time they would rightly each be alone.)"""
    runs: list[tuple[str, int]] = []
    execute, slow = DynamicBatcher._execute, threading.Event()

    def spy(self: DynamicBatcher, live: list[Any]) -> Any:
        runs.append((threading.current_thread().name, len(live)))
        if slow.is_set():
            time.sleep(0.03)
        return execute(self, live)

    monkeypatch.setattr(DynamicBatcher, "_execute", spy)
    settings = service_settings(model_repository, default_model=TINY, host="127.0.0.1", port=0)
    app = create_app(settings)
    server = http_server(settings, app)
    sock = listening_socket("127.0.0.1", 0)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn-loop", daemon=True)
    thread.start()
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (
                server.started and client.get("/health/ready").status_code == 200
            ):
                time.sleep(0.05)
            files = [("files", ("a.png", PNG, "image/png"))]
            for _ in range(3):
                assert client.post("/v1/classify", files=files).status_code == 200
            assert runs == [("uvicorn-loop", 1)] * 3
            runs.clear()

            together = threading.Barrier(16, timeout=30)

            def call(_: int) -> int:
                with httpx.Client(base_url=base, timeout=30) as c:
                    together.wait()
                    return c.post("/v1/classify", files=files).status_code

            slow.set()
            with ThreadPoolExecutor(16) as pool:
                assert set(pool.map(call, range(64))) == {200}
        assert any(name.startswith("batcher-") for name, _ in runs), runs
        assert max(n for _, n in runs) > 1, runs  # batched
    finally:
        server.should_exit = True
        thread.join(30)
