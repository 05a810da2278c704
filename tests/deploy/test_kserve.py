"""The KServe InferenceService runs the image as a custom predictor that speaks the Open Inference Protocol (v2)."""

from __future__ import annotations

import copy

import pytest
import yaml

from tests.deploy.manifests import (
    INFERENCE_SERVICE,
    Obj,
    assert_served,
    container,
    cpu_cores,
    default_port,
    intra_op_threads,
    render,
    setting_default,
)
from tests.deploy.test_manifests import K8S_VERSIONS, validate
from tests.deploy.test_policy import pod_spec


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


def example(name: str) -> Obj:
    """The commented-out `[example: name]` block of the InferenceService, parsed as YAML."""
    lines = INFERENCE_SERVICE.read_text().splitlines()
    (start,) = [i for i, line in enumerate(lines) if f"[example: {name}]" in line]
    indent = lines[start].index("#")
    block = []
    for line in lines[start + 1 :]:
        if not line.startswith(" " * indent + "#   "):
            break
        block.append(line[indent + 4 :])
    assert block, f"example {name!r} is empty"
    return yaml.safe_load("\n".join(block))


def with_examples(predictor: Obj, *names: str) -> Obj:
    """The predictor with the examples applied as their comments say: lists appended, grpc replacing."""
    predictor = copy.deepcopy(predictor)
    ctr = server(predictor)
    for name in names:
        for key, value in example(f"{name} container").items():
            ctr[key] = [*ctr.get(key, []), *value] if name == "auth-tokens" else value
        if name == "auth-tokens":
            predictor["volumes"] = [*predictor["volumes"], *example(f"{name} predictor")["volumes"]]
    return predictor


@pytest.mark.parametrize("names", [("grpc",), ("auth-tokens",), ("grpc", "auth-tokens")], ids="+".join)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_examples_give_a_valid_predictor(predictor: Obj, names: tuple[str, ...], version: str) -> None:
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "capsnet"},
        "spec": {"predictor": with_examples(predictor, *names)},
    }
    validate(isvc, version)


def test_grpc_example_serves_h2c_on_the_grpc_port(predictor: Obj) -> None:
    ctr = server(with_examples(predictor, "grpc"))
    (port,) = ctr["ports"]
    assert port["name"] == "h2c", "Knative picks HTTP/2 for a port named h2c"
    assert port["containerPort"] == setting_default("grpc_port")
    for probe in ("readinessProbe", "livenessProbe"):
        assert ctr[probe] == {**ctr[probe], "tcpSocket": {"port": port["containerPort"]}}
        assert "httpGet" not in ctr[probe] and "grpc" not in ctr[probe], "Knative accepts neither on an h2c port"


def test_auth_tokens_example_matches_the_kustomize_component(predictor: Obj) -> None:
    patched = with_examples(predictor, "auth-tokens")
    ctr = server(patched)
    component = container(pod_spec(render("cpu", ("auth-tokens",))))
    tokens = next(e for e in ctr["env"] if e["name"] == "CAPSNET_AUTH_TOKENS_FILE")
    assert tokens in component["env"]
    mount = next(m for m in ctr["volumeMounts"] if m["name"] == "auth-tokens")
    assert mount in component["volumeMounts"] and "subPath" not in mount
    (volume,) = [v for v in patched["volumes"] if v["name"] == "auth-tokens"]
    assert volume["secret"]["secretName"] == "capsnet-auth-tokens"
    assert volume["secret"]["items"] == [{"key": "tokens", "path": "tokens"}]
    assert tokens["value"] == f"{mount['mountPath']}/tokens"
    # No pod fsGroup under Knative: the non-root user reads the file through the "other" bits.
    assert "securityContext" not in patched
    assert volume["secret"]["defaultMode"] & 0o004
    # The probes do not change: health stays open.
    assert ctr["readinessProbe"] == server(predictor)["readinessProbe"]
