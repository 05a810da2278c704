"""The KServe InferenceService runs the image as a custom predictor that speaks the Open Inference Protocol (v2)."""

from __future__ import annotations

import pytest
import yaml

from tests.deploy.manifests import INFERENCE_SERVICE, Obj, assert_served, cpu_cores, default_port, intra_op_threads


@pytest.fixture(scope="module")
def predictor() -> Obj:
    (isvc,) = [d for d in yaml.safe_load_all(INFERENCE_SERVICE.read_text()) if d]
    assert (isvc["apiVersion"], isvc["kind"]) == ("serving.kserve.io/v1beta1", "InferenceService")
    return isvc["spec"]["predictor"]


def server(predictor: Obj) -> Obj:
    (ctr,) = predictor["containers"]
    # KServe treats the container named kserve-container as the model server.
    assert ctr["name"] == "kserve-container"
    return ctr


def env(ctr: Obj) -> dict[str, str]:
    return {e["name"]: e["value"] for e in ctr["env"] if "value" in e}


def test_custom_predictor_declares_the_v2_protocol(predictor: Obj) -> None:
    assert "model" not in predictor, "a custom container, not a built-in runtime"
    assert env(server(predictor))["PROTOCOL"] == "v2"


def test_container_port_is_the_service_port(predictor: Obj) -> None:
    ctr = server(predictor)
    (port,) = ctr["ports"]
    assert int(env(ctr)["CAPSNET_PORT"]) == port["containerPort"]
    assert port["containerPort"] == default_port()
    assert env(ctr)["CAPSNET_HOST"] == "0.0.0.0"
    for probe in ("readinessProbe", "livenessProbe"):
        assert ctr[probe]["httpGet"]["port"] == port["containerPort"], "Knative probes the container port only"


def test_probes_use_the_health_endpoints(predictor: Obj) -> None:
    ctr = server(predictor)
    assert ctr["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert ctr["livenessProbe"]["httpGet"]["path"] == "/health/live"


def test_probe_paths_are_served(predictor: Obj) -> None:
    ctr = server(predictor)
    assert_served(*(ctr[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")))


def test_resources_threads_and_security(predictor: Obj) -> None:
    ctr = server(predictor)
    limits = ctr["resources"]["limits"]
    assert {"cpu", "memory"} <= set(ctr["resources"]["requests"]) and {"cpu", "memory"} <= set(limits)
    assert intra_op_threads(ctr, {}) == cpu_cores(limits["cpu"])
    security = ctr["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security["seccompProfile"]["type"] == "RuntimeDefault"
    tmp = next(m for m in ctr["volumeMounts"] if m["mountPath"] == "/tmp")
    assert any(v["name"] == tmp["name"] and "emptyDir" in v for v in predictor["volumes"])
