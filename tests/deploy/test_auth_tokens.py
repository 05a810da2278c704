"""The optional auth-tokens component: the tokens Secret mounted read-only as a directory (so rotation
reaches the pod), CAPSNET_AUTH_TOKENS_FILE pointing at its `tokens` key, and nothing else changed: the probes and
the NetworkPolicy are those of the same overlay without it."""

from __future__ import annotations

import pytest

from tests.deploy.manifests import COMBINATIONS, K8S, Obj, combination_id, container, only, render, settings_class
from tests.deploy.test_policy import pod_spec

COMPONENT = "auth-tokens"
with_auth = [c for c in COMBINATIONS if COMPONENT in c[1]]
without_auth = [c for c in COMBINATIONS if COMPONENT not in c[1]]


def tokens_env(ctr: Obj) -> Obj:
    (env,) = [e for e in ctr.get("env", []) if e["name"] == "CAPSNET_AUTH_TOKENS_FILE"]
    return env


@pytest.mark.parametrize("combination", with_auth, ids=combination_id)
def test_tokens_file_is_the_mounted_secret_key(combination: tuple[str, tuple[str, ...]]) -> None:
    spec = pod_spec(render(*combination))
    ctr = container(spec)
    path = tokens_env(ctr)["value"]
    (mount,) = [m for m in ctr["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert mount["readOnly"] is True
    assert "subPath" not in mount, "a subPath mount never sees the Secret's updates"
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    assert secret["secretName"] == "capsnet-auth-tokens"
    assert secret.get("optional", False) is False, "no Secret must not mean an open service"
    file_name = path[len(mount["mountPath"].rstrip("/")) + 1 :]
    assert {"key": "tokens", "path": file_name} in secret["items"]
    # Readable by the pod's group only (fsGroup), not by every user.
    assert secret["defaultMode"] & 0o040 and not secret["defaultMode"] & 0o007
    assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]


@pytest.mark.parametrize("combination", with_auth, ids=combination_id)
def test_component_changes_nothing_but_the_tokens(combination: tuple[str, tuple[str, ...]]) -> None:
    overlay, components = combination
    plain = render(overlay, tuple(c for c in components if c != COMPONENT))
    objects = render(*combination)
    assert sorted(o["kind"] for o in objects) == sorted(o["kind"] for o in plain), "no Secret in the repository"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container(pod_spec(objects))[probe] == container(pod_spec(plain))[probe], f"{probe} must stay open"
    assert only(objects, "NetworkPolicy") == only(plain, "NetworkPolicy")
    assert only(objects, "Service") == only(plain, "Service")


@pytest.mark.parametrize("combination", without_auth, ids=combination_id)
def test_without_the_component_the_service_is_open(combination: tuple[str, tuple[str, ...]]) -> None:
    objects = render(*combination)
    assert not [e for e in container(pod_spec(objects)).get("env", []) if e["name"] == "CAPSNET_AUTH_TOKENS_FILE"]
    assert "CAPSNET_AUTH_TOKENS_FILE" not in only(objects, "ConfigMap")["data"]


def test_tokens_variable_is_a_service_setting() -> None:
    name = tokens_env(container(pod_spec(render("cpu", (COMPONENT,)))))["name"]
    field = name.removeprefix("CAPSNET_").lower()
    if field not in settings_class().model_fields:
        pytest.skip(f"the service has no `{field}` setting yet ({name})")


def test_component_tells_how_to_create_the_secret() -> None:
    text = (K8S / "components" / COMPONENT / "kustomization.yaml").read_text()
    assert "kubectl -n capsnet create secret generic capsnet-auth-tokens --from-file=tokens=" in text
