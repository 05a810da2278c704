"""Policy checks on the rendered manifests: probes on real routes, resources and threads, the restricted security
context, the drain budget, GPU requests, scraping, and that every reference between objects resolves."""

from __future__ import annotations

import pytest

from tests.deploy.manifests import (
    COMBINATIONS,
    Obj,
    assert_served,
    combination_id,
    container,
    cpu_cores,
    find,
    intra_op_threads,
    only,
    render,
    settings_class,
)

# Seconds between the end of the service's drain and SIGKILL, for the last responses and the process exit.
DRAIN_MARGIN_S = 5

all_combinations = pytest.mark.parametrize("combination", COMBINATIONS, ids=combination_id)


def config_of(objects: list[Obj]) -> dict[str, str]:
    return only(objects, "ConfigMap")["data"]


def pod_spec(objects: list[Obj]) -> Obj:
    return only(objects, "Deployment")["spec"]["template"]["spec"]


def port_of(ctr: Obj, port: int | str) -> int:
    """A probe or Service port, by number or by the container port's name."""
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in ctr["ports"] if p["name"] == port)


@all_combinations
def test_probes_use_the_health_endpoints(combination: tuple[str, tuple[str, ...]]) -> None:
    objects = render(*combination)
    ctr = container(pod_spec(objects))
    port = int(config_of(objects)["CAPSNET_PORT"])
    expected = {
        "startupProbe": "/health/live",
        "livenessProbe": "/health/live",
        "readinessProbe": "/health/ready",
    }
    for probe, path in expected.items():
        assert ctr[probe]["httpGet"]["path"] == path, probe
        assert port_of(ctr, ctr[probe]["httpGet"]["port"]) == port, f"{probe} does not probe the service's port"
    # The start-up budget covers loading and warming up; liveness only starts after it.
    startup = ctr["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 60


def test_probe_and_scrape_paths_are_routes_the_app_serves() -> None:
    objects = render("cpu")
    ctr = container(pod_spec(objects))
    annotations = only(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    monitor = only(render("cpu", ("servicemonitor",)), "ServiceMonitor")
    assert_served(
        *(ctr[probe]["httpGet"]["path"] for probe in ("startupProbe", "livenessProbe", "readinessProbe")),
        annotations["prometheus.io/path"],
        *(endpoint["path"] for endpoint in monitor["spec"]["endpoints"]),
    )


@all_combinations
def test_resources_are_set_and_threads_follow_the_cpu_limit(combination: tuple[str, tuple[str, ...]]) -> None:
    objects = render(*combination)
    ctr = container(pod_spec(objects))
    requests, limits = ctr["resources"]["requests"], ctr["resources"]["limits"]
    for resource in ("cpu", "memory"):
        assert resource in requests and resource in limits, f"{resource} request and limit must both be set"
    cpu_limit = cpu_cores(limits["cpu"])
    assert cpu_cores(requests["cpu"]) <= cpu_limit
    assert cpu_limit == int(cpu_limit) >= 1, "a whole-core CPU limit, so the thread count matches it exactly"
    assert intra_op_threads(ctr, config_of(objects)) == cpu_limit
    assert "CAPSNET_INTRA_OP_THREADS" not in config_of(objects), "one source for the thread count"


def test_thread_count_follows_a_changed_cpu_limit() -> None:
    """The tie is a reference, not a copy: with another limit the container sees another thread count."""
    objects = render("cpu")
    ctr = container(pod_spec(objects))
    ctr["resources"]["limits"]["cpu"] = "3"
    assert intra_op_threads(ctr, config_of(objects)) == 3
    ctr["resources"]["limits"]["cpu"] = "1500m"
    assert intra_op_threads(ctr, config_of(objects)) == 2


@all_combinations
def test_security_context_is_restricted(combination: tuple[str, tuple[str, ...]]) -> None:
    objects = render(*combination)
    spec = pod_spec(objects)
    pod_security = spec["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] != 0
    assert pod_security["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is False
    assert only(objects, "ServiceAccount")["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False, "service links inject CAPSNET_*-like variables"
    for ctr in spec["containers"]:
        security = ctr["securityContext"]
        assert security["runAsNonRoot"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["readOnlyRootFilesystem"] is True
        assert security["capabilities"]["drop"] == ["ALL"]
        assert "add" not in security["capabilities"]
        assert security["seccompProfile"]["type"] == "RuntimeDefault"
        assert "privileged" not in security or security["privileged"] is False
    # The read-only root needs a writable /tmp (multipart uploads spill there).
    volumes = {v["name"]: v for v in spec["volumes"]}
    tmp = next(m for m in container(spec)["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in volumes[tmp["name"]]


@all_combinations
def test_grace_period_covers_the_prestop_sleep_and_the_drain(combination: tuple[str, tuple[str, ...]]) -> None:
    objects = render(*combination)
    spec = pod_spec(objects)
    pre_stop = container(spec)["lifecycle"]["preStop"]["sleep"]["seconds"]
    config = config_of(objects)
    if "CAPSNET_SHUTDOWN_TIMEOUT_S" in config:
        drain = float(config["CAPSNET_SHUTDOWN_TIMEOUT_S"])
    else:
        drain = float(settings_class().model_fields["shutdown_timeout_s"].default)
    drain += float(settings_class().model_fields["shutdown_read_grace_s"].default)  # read on before draining
    assert pre_stop >= 3, "endpoint removal needs a few seconds to reach every proxy"
    assert spec["terminationGracePeriodSeconds"] >= pre_stop + drain + DRAIN_MARGIN_S


@pytest.mark.parametrize("components", [(), ("model-repository-pvc", "servicemonitor")], ids=["plain", "all"])
def test_gpu_overlay_asks_for_exactly_one_gpu(components: tuple[str, ...]) -> None:
    objects = render("gpu", components)
    spec = pod_spec(objects)
    ctr = container(spec)
    assert ctr["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert ctr["resources"]["requests"].get("nvidia.com/gpu", "1") == "1"
    gpus = [c for c in spec["containers"] if "nvidia.com/gpu" in c["resources"].get("limits", {})]
    assert gpus == [ctr], "only the server container holds a GPU"
    assert spec["nodeSelector"], "GPU pods are pinned to GPU nodes"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert config_of(objects)["CAPSNET_PROVIDER"] == "cuda"
    assert only(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":gpu")


@pytest.mark.parametrize("components", [(), ("model-repository-pvc", "servicemonitor")], ids=["plain", "all"])
def test_cpu_overlay_asks_for_no_gpu(components: tuple[str, ...]) -> None:
    objects = render("cpu", components)
    spec = pod_spec(objects)
    for ctr in spec["containers"]:
        for section in ("requests", "limits"):
            assert "nvidia.com/gpu" not in ctr["resources"].get(section, {})
    assert "nodeSelector" not in spec and "tolerations" not in spec
    assert config_of(objects)["CAPSNET_PROVIDER"] == "cpu"
    assert container(spec)["image"].endswith(":cpu")


def test_overlays_have_their_own_autoscaling_bounds() -> None:
    cpu, gpu = (only(render(o), "HorizontalPodAutoscaler")["spec"] for o in ("cpu", "gpu"))
    for spec in (cpu, gpu):
        assert 1 <= spec["minReplicas"] <= spec["maxReplicas"]
    assert (cpu["minReplicas"], cpu["maxReplicas"]) != (gpu["minReplicas"], gpu["maxReplicas"])
    assert gpu["maxReplicas"] < cpu["maxReplicas"], "GPUs are scarcer than cores"


@all_combinations
def test_references_between_objects_resolve(combination: tuple[str, tuple[str, ...]]) -> None:
    objects = render(*combination)
    deployment = only(objects, "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    assert selector.items() <= pod_labels.items()

    def selects_pods(labels: dict[str, str]) -> bool:
        return bool(labels) and labels.items() <= pod_labels.items()

    service = only(objects, "Service")
    assert selects_pods(service["spec"]["selector"])
    assert selects_pods(only(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"])
    assert selects_pods(only(objects, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"])
    target = only(objects, "HorizontalPodAutoscaler")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert spec["serviceAccountName"] == only(objects, "ServiceAccount")["metadata"]["name"]

    ctr = container(spec)
    config = only(objects, "ConfigMap")
    assert [e["configMapRef"]["name"] for e in ctr["envFrom"]] == [config["metadata"]["name"]]
    port = int(config["data"]["CAPSNET_PORT"])
    (http,) = [p for p in service["spec"]["ports"] if p["name"] == "http"]
    assert port_of(ctr, http["targetPort"]) == port
    allowed = [p["port"] for rule in only(objects, "NetworkPolicy")["spec"]["ingress"] for p in rule["ports"]]
    assert any(port_of(ctr, p) == port for p in allowed), "the NetworkPolicy must let clients reach the port"
    for claim in (v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v):
        assert claim in {o["metadata"]["name"] for o in find(objects, "PersistentVolumeClaim")}
    mounted = {v["name"] for v in spec["volumes"]}
    assert {m["name"] for m in ctr["volumeMounts"]} <= mounted


@all_combinations
def test_metrics_are_scraped_exactly_one_way(combination: tuple[str, tuple[str, ...]]) -> None:
    objects = render(*combination)
    annotations = only(objects, "Deployment")["spec"]["template"]["metadata"].get("annotations", {})
    monitors = find(objects, "ServiceMonitor")
    port = int(config_of(objects)["CAPSNET_PORT"])
    if "servicemonitor" in combination[1]:
        assert not any(k.startswith("prometheus.io/") for k in annotations), "scraped twice"
        (monitor,) = monitors
        service = only(objects, "Service")
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        service_ports = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in service_ports
            assert endpoint["path"] == "/metrics"
    else:
        assert not monitors
        assert annotations["prometheus.io/scrape"] == "true"
        assert int(annotations["prometheus.io/port"]) == port
        assert annotations["prometheus.io/path"] == "/metrics"


@all_combinations
def test_model_repository_comes_from_the_image_or_the_claim(combination: tuple[str, tuple[str, ...]]) -> None:
    objects = render(*combination)
    ctr = container(pod_spec(objects))
    repository = config_of(objects)["CAPSNET_MODEL_REPOSITORY"]
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    if "model-repository-pvc" in combination[1]:
        assert repository in mounts, "CAPSNET_MODEL_REPOSITORY must point at the mounted claim"
        assert mounts[repository]["readOnly"] is True
    else:
        assert repository == "/opt/capsnet/models", "the image's bundled models (deploy/Dockerfile)"
        assert repository not in mounts


@all_combinations
def test_configmap_holds_valid_service_settings(combination: tuple[str, tuple[str, ...]]) -> None:
    config = config_of(render(*combination))
    assert all(key.startswith("CAPSNET_") for key in config)
    assert config["CAPSNET_HOST"] == "0.0.0.0", "inside a pod the server must listen on all interfaces"
    settings = settings_class()
    fields = {f"CAPSNET_{name.upper()}": name for name in settings.model_fields}
    unknown = set(config) - set(fields)
    assert not unknown, f"not service settings: {sorted(unknown)}"
    # The values parse as the service would parse them.
    settings.model_validate({fields[key]: value for key, value in config.items()})
