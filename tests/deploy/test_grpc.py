"""The gRPC port through every overlay and component: the container port named `grpc` on the service's
CAPSNET_GRPC_PORT, the Service port with `appProtocol: grpc`, the NetworkPolicy opening it, the probes still HTTP."""

from __future__ import annotations

import pytest

from tests.deploy.manifests import COMBINATIONS, Obj, combination_id, container, only, render, setting_default
from tests.deploy.test_policy import config_of, pod_spec, port_of

all_combinations = pytest.mark.parametrize("combination", COMBINATIONS, ids=combination_id)


def grpc_port(objects: list[Obj]) -> int:
    """The port the service listens on for gRPC: the ConfigMap's CAPSNET_GRPC_PORT, else the setting's default."""
    config = config_of(objects)
    if "CAPSNET_GRPC_PORT" in config:
        return int(config["CAPSNET_GRPC_PORT"])
    return int(setting_default("grpc_port"))


@all_combinations
def test_container_has_a_grpc_port_beside_http(combination: tuple[str, tuple[str, ...]]) -> None:
    objects = render(*combination)
    ctr = container(pod_spec(objects))
    (port,) = [p for p in ctr["ports"] if p["name"] == "grpc"]
    assert port["protocol"] == "TCP"
    assert port["containerPort"] != int(config_of(objects)["CAPSNET_PORT"])


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_container_grpc_port_is_where_the_service_listens(overlay: str) -> None:
    objects = render(overlay)
    assert port_of(container(pod_spec(objects)), "grpc") == grpc_port(objects)


@all_combinations
def test_service_carries_grpc_with_its_app_protocol(combination: tuple[str, tuple[str, ...]]) -> None:
    objects = render(*combination)
    ctr = container(pod_spec(objects))
    ports = {p["name"]: p for p in only(objects, "Service")["spec"]["ports"]}
    assert set(ports) == {"http", "grpc"}
    assert ports["grpc"]["appProtocol"] == "grpc", "meshes and gateways balance gRPC per call with it"
    assert ports["http"]["appProtocol"] == "http"
    assert port_of(ctr, ports["grpc"]["targetPort"]) == port_of(ctr, "grpc")
    assert ports["grpc"]["port"] == port_of(ctr, "grpc")


@all_combinations
def test_network_policy_admits_http_and_grpc_only(combination: tuple[str, tuple[str, ...]]) -> None:
    objects = render(*combination)
    ctr = container(pod_spec(objects))
    policy = only(objects, "NetworkPolicy")["spec"]
    allowed = sorted(port_of(ctr, p["port"]) for rule in policy["ingress"] for p in rule["ports"])
    assert allowed == sorted([port_of(ctr, "http"), port_of(ctr, "grpc")])
    assert all("from" not in rule for rule in policy["ingress"]), "clients from anywhere, on these ports only"
    assert policy["egress"] == []


@all_combinations
def test_probes_stay_on_http(combination: tuple[str, tuple[str, ...]]) -> None:
    ctr = container(pod_spec(render(*combination)))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert set(ctr[probe]) & {"httpGet", "grpc", "tcpSocket", "exec"} == {"httpGet"}, probe
        assert ctr[probe]["httpGet"]["port"] == "http"
