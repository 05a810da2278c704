"""Bearer-token authentication: the token file, its re-reading, the 401s, what stays open, start-up errors."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from service.core import auth
from service.core.auth import TokenStore, bearer_token
from service.core.config import ConfigError, Settings
from service.main import create_app
from tests.service.conftest import TINY, digit_image, png_bytes, service_settings
from tests.service.live_server import running_server, serve_command

TOKENS = ("alpha-token-1", "beta-token-22")
TOKEN_FILE = "# service tokens\n\nalpha-token-1\n   # indented comment\n  beta-token-22  \r\n"
MISSING = "missing bearer token: send the header 'Authorization: Bearer <token>'"
WRONG_SCHEME = "the Authorization header must be 'Bearer <token>'"
INVALID = "invalid bearer token"

IMAGE_28 = np.random.default_rng(0).random((1, 1, 28, 28), dtype=np.float32)
V2_BODY = {
    "inputs": [{"name": "image", "shape": [1, 1, 28, 28], "datatype": "FP32", "data": IMAGE_28.ravel().tolist()}]
}
PROTECTED: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/v1/models", {}),
    ("GET", f"/v1/models/{TINY}", {}),
    ("POST", "/v1/classify", {"files": [("files", ("d.png", png_bytes(digit_image()), "image/png"))]}),
    ("POST", f"/v1/models/{TINY}/capsules", {"files": [("files", ("d.png", png_bytes(digit_image()), "image/png"))]}),
    ("GET", "/v2", {}),
    ("GET", f"/v2/models/{TINY}", {}),
    ("GET", f"/v2/models/{TINY}/ready", {}),
    ("POST", f"/v2/models/{TINY}/infer", {"json": V2_BODY}),
]
OPEN = ["/health/live", "/health/ready", "/v2/health/live", "/v2/health/ready", "/metrics", "/"]
OPEN += ["/static/app.js", "/docs", "/redoc", "/openapi.json"]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(TOKEN_FILE)
    return path


@pytest.fixture
def authed(make_client: Any, model_repository: Path, token_file: Path) -> TestClient:
    client: TestClient = make_client(model_repository, auth_tokens_file=token_file)
    return client


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def store_with_clock(path: Path) -> tuple[TokenStore, FakeClock]:
    clock = FakeClock()
    tokens, signature = auth.read_tokens(path)
    return TokenStore(path, tokens, signature, clock=clock), clock


def rewrite(path: Path, content: str | bytes) -> None:
    """Write a new version whose mtime moves on, as a real edit a moment later would (whatever the clock's grain)."""
    later = (path.stat().st_mtime_ns if path.exists() else 0) + 10**9
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    os.utime(path, ns=(later, later))


# ---- the token file and TokenStore -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header, token",
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("BEARER  abc ", "abc"),
        (None, None),
        ("", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic YWxhZGRpbjpvcGVuc2VzYW1l", None),
        ("Token abc", None),
        ("Bearer a b", None),
        ("Bearerabc", None),
    ],
)
def test_bearer_token_parses_only_the_bearer_scheme(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_tokens_one_per_line_without_comments_or_blank_lines(token_file: Path) -> None:
    store = TokenStore.from_file(token_file)
    assert len(store) == 2
    assert all(store.check(t) for t in TOKENS)
    for wrong in ("# service tokens", "# indented comment", "", "alpha-token", "alpha-token-1 ", "ALPHA-TOKEN-1", None):
        assert not store.check(wrong), wrong


def test_a_byte_order_mark_is_not_part_of_the_first_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_bytes("\ufeffalpha-token-1\n".encode())
    assert TokenStore.from_file(path).check("alpha-token-1")


def test_check_compares_with_every_token_even_after_a_match(token_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    store = TokenStore.from_file(token_file)
    for token in (*TOKENS, "wrong"):
        calls.clear()
        store.check(token)
        assert len(calls) == len(TOKENS)  # no early exit: the time does not say which token matched
        assert all(len(a) == len(b) == 32 for a, b in calls)  # digests: the length of a token does not show either


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "cannot read the bearer token file {path} (CAPSNET_AUTH_TOKENS_FILE): No such file or directory"),
        ("", "the bearer token file {path} (CAPSNET_AUTH_TOKENS_FILE) holds no token"),
        ("# only a comment\n\n   \n", "the bearer token file {path} (CAPSNET_AUTH_TOKENS_FILE) holds no token"),
        (b"\xff\xfe\x00bad", "cannot read the bearer token file {path} (CAPSNET_AUTH_TOKENS_FILE): 'utf-8' codec"),
    ],
)
def test_an_unreadable_or_empty_file_is_a_config_error(
    tmp_path: Path, content: str | bytes | None, message: str
) -> None:
    path = tmp_path / "tokens"
    if isinstance(content, str):
        path.write_text(content)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    with pytest.raises(ConfigError) as raised:
        TokenStore.from_file(path)
    assert str(raised.value).startswith(message.format(path=path))


def test_a_directory_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"cannot read the bearer token file {tmp_path} .*Is a directory"):
        TokenStore.from_file(tmp_path)


def test_a_rewritten_file_is_read_again_after_the_interval(token_file: Path) -> None:
    store, clock = store_with_clock(token_file)
    rewrite(token_file, "gamma-token-333\n")
    assert store.check("alpha-token-1") and not store.check("gamma-token-333")  # within the interval: no stat
    clock.now += auth.RELOAD_INTERVAL_S
    assert store.check("gamma-token-333")
    assert not store.check("alpha-token-1") and not store.check("beta-token-22")


def test_a_secret_volume_update_is_picked_up(tmp_path: Path) -> None:
    """Kubernetes updates a Secret volume by pointing the `..data` symlink at a new directory."""
    for version, token in (("v1", "first-token"), ("v2", "second-token")):
        (tmp_path / version).mkdir()
        (tmp_path / version / "tokens").write_text(token + "\n")
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "tokens").symlink_to("..data/tokens")
    store, clock = store_with_clock(tmp_path / "tokens")
    assert store.check("first-token")
    (tmp_path / "..data_tmp").symlink_to("v2")
    os.replace(tmp_path / "..data_tmp", tmp_path / "..data")
    clock.now += auth.RELOAD_INTERVAL_S
    assert store.check("second-token") and not store.check("first-token")


@pytest.mark.parametrize("change", ["empty", "comments only", "deleted", "unreadable"])
def test_a_file_that_goes_bad_keeps_the_last_tokens(
    token_file: Path, change: str, caplog: pytest.LogCaptureFixture
) -> None:
    store, clock = store_with_clock(token_file)
    if change == "deleted":
        token_file.unlink()
    else:
        versions: dict[str, str | bytes] = {"empty": "", "comments only": "# rotated out\n", "unreadable": b"\xff\xfe"}
        rewrite(token_file, versions[change])
    clock.now += auth.RELOAD_INTERVAL_S
    with caplog.at_level(logging.WARNING, logger="service.core.auth"):
        assert all(store.check(t) for t in TOKENS)
        clock.now += auth.RELOAD_INTERVAL_S
        assert store.check(TOKENS[0])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, "a bad version is reported once, not at every look"
    assert str(token_file) in warnings[0].getMessage() and "keeping the last" in warnings[0].getMessage()
    rewrite(token_file, "fixed-token\n")
    clock.now += auth.RELOAD_INTERVAL_S
    assert store.check("fixed-token") and not store.check(TOKENS[0])


def test_tokens_never_reach_the_log(token_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        assert TokenStore.from_file(token_file).check(TOKENS[0])
        store, clock = store_with_clock(token_file)
        rewrite(token_file, "gamma-token-333\n")
        clock.now += auth.RELOAD_INTERVAL_S
        store.check("gamma-token-333")
        rewrite(token_file, "")
        clock.now += auth.RELOAD_INTERVAL_S
        store.check("wrong-token-4444")
    assert "2 token(s) from" in caplog.text and "1 token(s) now" in caplog.text
    for secret in (*TOKENS, "gamma-token-333", "wrong-token-4444"):
        assert secret not in caplog.text


# ---- settings and start-up ---------------------------------------------------------------------------------------


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, token_file: Path) -> None:
    monkeypatch.setenv("CAPSNET_AUTH_TOKENS_FILE", str(token_file))
    monkeypatch.setenv("CAPSNET_AUTH_METRICS", "true")
    settings = Settings()
    assert settings.auth_tokens_file == token_file and settings.auth_metrics is True
    assert (
        Settings.model_fields["auth_tokens_file"].default is None
        and Settings.model_fields["auth_metrics"].default is False
    )


def test_an_empty_path_or_metrics_auth_without_tokens_is_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CAPSNET_AUTH_TOKENS_FILE", "")
    with pytest.raises(ValidationError, match="empty path; unset the variable to turn authentication off"):
        Settings()
    monkeypatch.delenv("CAPSNET_AUTH_TOKENS_FILE")
    monkeypatch.setenv("CAPSNET_AUTH_METRICS", "1")
    with pytest.raises(ValidationError, match=r"auth_metrics needs auth_tokens_file \(CAPSNET_AUTH_TOKENS_FILE\)"):
        Settings()


def test_create_app_refuses_a_missing_token_file(model_repository: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"cannot read the bearer token file {tmp_path / 'absent'}"):
        create_app(service_settings(model_repository, auth_tokens_file=tmp_path / "absent"))


@pytest.mark.parametrize("content", [None, "", "# no token yet\n"])
def test_capsnet_serve_exits_with_one_line_for_a_bad_token_file(
    model_repository: Path, tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "tokens"
    if content is not None:
        path.write_text(content)
    result = subprocess.run(
        [*serve_command(), "--model-repository", str(model_repository), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CAPSNET_AUTH_TOKENS_FILE": str(path)},
        check=False,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    reason = (
        "cannot read the bearer token file {} (CAPSNET_AUTH_TOKENS_FILE): No such file or directory"
        if content is None
        else "the bearer token file {} (CAPSNET_AUTH_TOKENS_FILE) holds no token: "
        "write one token per line (blank lines and # comments are ignored)"
    )
    assert result.stderr == f"capsnet-serve: {reason.format(path)}\n"  # one line, no traceback


# ---- the HTTP surface ------------------------------------------------------------------------------------------


def request(client: TestClient, method: str, path: str, kwargs: dict[str, Any], **headers: str) -> Any:
    return client.request(method, path, headers=headers, **kwargs)


@pytest.mark.parametrize(("method", "path", "kwargs"), PROTECTED, ids=[f"{m} {p}" for m, p, _ in PROTECTED])
def test_protected_routes_answer_401_without_a_valid_token(
    authed: TestClient, method: str, path: str, kwargs: dict[str, Any]
) -> None:
    cases = [({}, MISSING, "Bearer"), ({"Authorization": "Basic YWxhZGRpbjpvcGVuc2VzYW1l"}, WRONG_SCHEME, "Bearer")]
    cases += [({"Authorization": "Bearer"}, WRONG_SCHEME, "Bearer")]
    cases += [(bearer("not-a-token"), INVALID, 'Bearer error="invalid_token"')]
    cases += [(bearer(TOKENS[0] + "x"), INVALID, 'Bearer error="invalid_token"')]
    for headers, message, challenge in cases:
        r = request(authed, method, path, kwargs, **headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["www-authenticate"] == challenge
        v2 = path.startswith("/v2")
        assert r.json() == ({"error": message} if v2 else {"error": message, "type": "unauthorized"})
        assert "not-a-token" not in r.text and "YWxh" not in r.text and TOKENS[0] not in r.text


@pytest.mark.parametrize(("method", "path", "kwargs"), PROTECTED, ids=[f"{m} {p}" for m, p, _ in PROTECTED])
def test_protected_routes_answer_with_a_valid_token(
    authed: TestClient, method: str, path: str, kwargs: dict[str, Any]
) -> None:
    for token in TOKENS:
        r = request(authed, method, path, kwargs, Authorization=f"bearer {token}")
        assert r.status_code == 200, r.text


def test_an_unknown_model_is_401_not_404_without_a_token(authed: TestClient) -> None:
    """Without a token a client cannot learn which model names exist."""
    assert authed.get("/v1/models/nope").status_code == 401
    assert authed.get("/v2/models/nope").status_code == 401
    assert authed.get("/v1/models/nope", headers=bearer(TOKENS[0])).status_code == 404


@pytest.mark.parametrize("path", OPEN)
def test_health_metrics_explorer_and_docs_stay_open(authed: TestClient, path: str) -> None:
    assert authed.get(path).status_code == 200


def test_metrics_can_be_closed(make_client: Any, model_repository: Path, token_file: Path) -> None:
    client = make_client(model_repository, auth_tokens_file=token_file, auth_metrics=True)
    r = client.get("/metrics")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json() == {"error": MISSING, "type": "unauthorized"}
    assert client.get("/metrics", headers=bearer(TOKENS[1])).status_code == 200
    assert client.get("/health/ready").status_code == 200 and client.get("/v2/health/live").status_code == 200


def test_401s_are_counted_in_the_metrics(authed: TestClient) -> None:
    for _ in range(3):
        authed.get("/v1/models")
    authed.get("/v2", headers=bearer("nope"))
    metrics = authed.get("/metrics").text
    assert 'capsnet_http_requests_total{method="GET",protocol="http",route="/v1/models",status="401"} 3.0' in metrics
    assert 'capsnet_http_requests_total{method="GET",protocol="http",route="/v2",status="401"} 1.0' in metrics


def test_a_rotated_token_file_applies_without_a_restart(authed: TestClient, token_file: Path) -> None:
    tokens: TokenStore = authed.app.state.tokens  # type: ignore[attr-defined]
    tokens.reload_interval_s = 0.0  # look at every request instead of once a second
    assert authed.get("/v2", headers=bearer(TOKENS[0])).status_code == 200
    rewrite(token_file, "# rotated\nrotated-token-5\n")
    assert authed.get("/v2", headers=bearer("rotated-token-5")).status_code == 200
    assert authed.get("/v2", headers=bearer(TOKENS[0])).status_code == 401
    rewrite(token_file, "")  # a bad rotation keeps the last good tokens: the service never opens
    assert authed.get("/v2").status_code == 401
    assert authed.get("/v2", headers=bearer("rotated-token-5")).status_code == 200


def test_no_token_file_leaves_every_route_open(client: TestClient) -> None:
    assert client.get("/v1/models").status_code == 200 and client.get("/v2").status_code == 200
    assert "securitySchemes" not in client.get("/openapi.json").json().get("components", {})


def test_openapi_declares_the_bearer_scheme_on_the_protected_routes(authed: TestClient) -> None:
    schema = authed.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "A token from the service's CAPSNET_AUTH_TOKENS_FILE.",
    }
    paths = schema["paths"]
    for path, method in [("/v1/models", "get"), ("/v1/classify", "post"), ("/v2", "get"), ("/v2/models/{name}", "get")]:
        assert paths[path][method]["security"] == [{"bearer": []}], path
        assert "401" in paths[path][method]["responses"]
    for path in ("/health/live", "/v2/health/live", "/metrics"):
        assert "security" not in paths[path]["get"], path


def test_tokens_never_reach_the_service_log(authed: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        authed.get("/v1/models", headers=bearer("guessed-token-77"))
        authed.get("/v1/models", headers=bearer(TOKENS[0]))
        authed.get("/v1/models", headers={"Authorization": "Basic c2VjcmV0OnNlY3JldA=="})
    for secret in ("guessed-token-77", TOKENS[0], "c2VjcmV0OnNlY3JldA=="):
        assert secret not in caplog.text


# ---- a real process and a stock Open Inference Protocol client --------------------------------------------------


@pytest.fixture(scope="module")
def authed_server(model_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    path = tmp_path_factory.mktemp("auth") / "tokens"
    path.write_text(TOKEN_FILE)
    env = {"CAPSNET_AUTH_TOKENS_FILE": str(path), "CAPSNET_LOG_LEVEL": "debug", "CAPSNET_ACCESS_LOG": "true"}
    with running_server(model_repository, **env) as running:
        yield running


@pytest.mark.slow
def test_stock_triton_client_with_an_authorization_header(authed_server: tuple[str, Any]) -> None:
    httpclient = pytest.importorskip("tritonclient.http", reason="tritonclient[http] is not installed")
    from tritonclient.utils import InferenceServerException

    base, process = authed_server
    client = httpclient.InferenceServerClient(url=base.removeprefix("http://"))
    headers = bearer(TOKENS[1])
    assert client.is_server_live() and client.is_server_ready()  # health stays open for probes
    with pytest.raises(InferenceServerException, match=MISSING.replace("(", r"\(")) as raised:
        client.get_server_metadata()
    assert raised.value.status() == "401"
    with pytest.raises(InferenceServerException, match=INVALID):
        client.get_model_metadata(TINY, headers=bearer("stolen-token-9"))
    assert client.get_server_metadata(headers=headers)["name"] == "capsnet-serve"
    assert client.is_model_ready(TINY, headers=headers)
    assert [o["name"] for o in client.get_model_metadata(TINY, headers=headers)["outputs"]][:2] == ["lengths", "poses"]
    tensor = httpclient.InferInput("image", list(IMAGE_28.shape), "FP32")
    tensor.set_data_from_numpy(IMAGE_28, binary_data=True)
    result = client.infer(TINY, inputs=[tensor], headers=headers)
    assert result.as_numpy("lengths").shape == (1, 10)
    client.close()
    process.terminate()
    assert process.wait(60) == 0
    log = process.stdout.read()
    assert "bearer token authentication on: 2 token(s) from" in log
    for secret in (*TOKENS, "stolen-token-9"):
        assert secret not in log
