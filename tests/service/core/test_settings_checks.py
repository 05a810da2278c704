"""Settings a newcomer gets wrong or leaves out: the gRPC port beside the HTTP one, misspelt CAPSNET_* variables."""

from __future__ import annotations

import os

import pytest

from service.core.config import Settings, unknown_variables


@pytest.fixture(autouse=True)
def _no_capsnet_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("CAPSNET_")]:
        monkeypatch.delenv(name)


def test_an_unset_grpc_port_is_the_http_port_plus_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (Settings().port, Settings().grpc_port) == (8000, 8001)
    assert Settings(port=8001).grpc_port == 8002  # `make serve PORT=8001` no longer clashes with the default
    assert Settings(port=8001, grpc_port=9000).grpc_port == 9000 and Settings(port=8001, grpc_port=0).grpc_port == 0
    monkeypatch.setenv("CAPSNET_PORT", "8005")
    assert Settings().grpc_port == 8006
    monkeypatch.setenv("CAPSNET_GRPC_PORT", "8100")
    assert Settings().grpc_port == 8100 and Settings(port=9000).grpc_port == 8100  # an explicit one always wins


def test_ports_without_a_neighbour_keep_the_default() -> None:
    assert Settings(port=0).grpc_port == 8001  # 0: any free port for HTTP (tests)
    assert Settings(port=65535).grpc_port == 8001
    with pytest.raises(ValueError, match="grpc_port and port are both 8001"):
        Settings(port=8001, grpc_port=8001)


def test_unknown_variables_name_the_closest_setting() -> None:
    environ = {
        "CAPSNET_LOGLEVEL": "debug",
        "CAPSNET_GRPCPORT": "1",
        "capsnet_max_batchsize": "4",
        "CAPSNET_NONSENSE": "1",
        "CAPSNET_PORT": "8000",  # a setting
        "CAPSNET_DATA_DIR": "../shared/data/mnist",  # the training commands'
        "CAPSNET_BENCH_BODY": "x",  # the benchmark's
        "PATH": "/usr/bin",
    }
    assert unknown_variables(environ) == [
        ("CAPSNET_GRPCPORT", "CAPSNET_GRPC_PORT"),
        ("CAPSNET_LOGLEVEL", "CAPSNET_LOG_LEVEL"),
        ("CAPSNET_NONSENSE", None),
        ("capsnet_max_batchsize", "CAPSNET_MAX_BATCH_SIZE"),
    ]
