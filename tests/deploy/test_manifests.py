"""Every overlay and component combination renders with `kubectl kustomize` and validates offline against the
Kubernetes OpenAPI schemas; custom resources (ServiceMonitor, InferenceService) get the checks their CRDs would."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.deploy.manifests import (
    COMBINATIONS,
    INFERENCE_SERVICE,
    K8S,
    LOADER_POD,
    Obj,
    combination_id,
    find,
    render,
)

# The oldest Kubernetes the manifests support (the preStop `sleep` action is on by default from 1.30) and the
# newest the schemas know: a field removed or renamed in between fails one of the two.
K8S_VERSIONS = ("1.30", kubernetes_validate.latest_version())

# Custom resources have no schema in kubernetes-validate: they are allowed by (apiVersion, kind) only, and
# checked below by what their CRDs require. Any other kind without a schema fails.
CUSTOM_RESOURCES = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("serving.kserve.io/v1beta1", "InferenceService"),
}

# InferenceService predictor fields that are KServe's own (ComponentExtensionSpec); the rest is a core PodSpec.
KSERVE_COMPONENT_FIELDS = {
    "minReplicas",
    "maxReplicas",
    "scaleTarget",
    "scaleMetric",
    "scaleMetricType",
    "containerConcurrency",
    "timeout",
    "canaryTrafficPercent",
    "logger",
    "batcher",
    "labels",
    "annotations",
    "deploymentStrategy",
    "autoScaling",
}


def validate(obj: Obj, version: str) -> None:
    """Strict OpenAPI validation (unknown fields are errors), with the allowance for custom resources."""
    key = (obj["apiVersion"], obj["kind"])
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        assert key in CUSTOM_RESOURCES, f"no Kubernetes schema for {key} and it is not an allowed custom resource"
        CUSTOM_CHECKS[obj["kind"]](obj, version)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {version}: {path}: {e.message}")
    else:
        assert key not in CUSTOM_RESOURCES, f"{key} unexpectedly has a core schema"


def check_servicemonitor(obj: Obj, version: str) -> None:
    validate_metadata(obj, version)
    spec = obj["spec"]
    assert set(spec) <= {"selector", "endpoints", "namespaceSelector", "jobLabel", "podTargetLabels"}, spec
    labels = spec["selector"]["matchLabels"]
    assert labels and all(isinstance(v, str) for v in labels.values())
    assert spec["endpoints"], "a ServiceMonitor needs at least one endpoint"
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "scheme"}, endpoint
        assert isinstance(endpoint["port"], str) and endpoint["path"].startswith("/")


def check_inference_service(obj: Obj, version: str) -> None:
    validate_metadata(obj, version)
    assert set(obj["spec"]) == {"predictor"}, "only a predictor is defined"
    predictor = obj["spec"]["predictor"]
    pod_spec = {k: v for k, v in predictor.items() if k not in KSERVE_COMPONENT_FIELDS}
    # A custom predictor is a core PodSpec inline: validate it as a Pod's spec.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": obj["metadata"]["name"]}, "spec": pod_spec}
    validate(pod, version)
    assert predictor["minReplicas"] <= predictor["maxReplicas"]


def validate_metadata(obj: Obj, version: str) -> None:
    """ObjectMeta of a custom resource, checked by putting it on a ConfigMap."""
    validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj["metadata"]}, version)


CUSTOM_CHECKS = {"ServiceMonitor": check_servicemonitor, "InferenceService": check_inference_service}


@pytest.mark.parametrize("combination", COMBINATIONS, ids=combination_id)
def test_combination_renders_the_expected_objects(combination: tuple[str, tuple[str, ...]]) -> None:
    overlay, components = combination
    kinds = sorted(o["kind"] for o in render(overlay, components))
    expected = [
        "ConfigMap",
        "Deployment",
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ]
    if "model-repository-pvc" in components:
        expected.append("PersistentVolumeClaim")
    if "servicemonitor" in components:
        expected.append("ServiceMonitor")
    assert kinds == sorted(expected)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("combination", COMBINATIONS, ids=combination_id)
def test_rendered_objects_validate_against_the_kubernetes_schemas(
    combination: tuple[str, tuple[str, ...]], version: str
) -> None:
    for obj in render(*combination):
        validate(obj, version)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", [INFERENCE_SERVICE, LOADER_POD], ids=lambda p: p.name)
def test_standalone_manifests_validate(path: Path, version: str) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert docs
    for obj in docs:
        validate(obj, version)


def test_validation_rejects_a_bad_manifest() -> None:
    """The schema check has teeth: a misspelt field and an unknown kind both fail."""
    deployment = next(o for o in render("cpu") if o["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(pytest.fail.Exception, match="readinessProbes"):
        validate(deployment, K8S_VERSIONS[0])
    with pytest.raises(AssertionError, match="not an allowed custom resource"):
        validate({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}, K8S_VERSIONS[0])


def test_kustomizations_use_current_fields() -> None:
    """`labels:` and `patches:`, not the deprecated commonLabels / patchesStrategicMerge / bases / vars."""
    deprecated = {"commonLabels", "patchesStrategicMerge", "patchesJson6902", "bases", "vars", "imageTags"}
    files = sorted(K8S.rglob("kustomization.yaml"))
    assert len(files) >= 5
    for path in files:
        used = set(yaml.safe_load(path.read_text())) & deprecated
        assert not used, f"{path.relative_to(K8S)} uses deprecated {sorted(used)}"


def test_overlays_patch_only_what_differs() -> None:
    """The base is complete; overlays neither repeat it nor add whole new objects."""
    base = render("cpu")
    for overlay in ("cpu", "gpu"):
        kustomization = yaml.safe_load((K8S / "overlays" / overlay / "kustomization.yaml").read_text())
        assert kustomization["resources"] == ["../../base"]
        objects = render(overlay)
        assert sorted((o["kind"], o["metadata"]["name"].split("-config-")[0]) for o in objects) == sorted(
            (o["kind"], o["metadata"]["name"].split("-config-")[0]) for o in base
        )
    for patch in (K8S / "overlays" / "gpu").glob("*-gpu.yaml"):
        text = patch.read_text()
        for field in ("securityContext", "livenessProbe", "readinessProbe", "image:", "ports:"):
            assert field not in text, f"{patch.name} repeats {field} from the base"


def test_custom_resources_are_only_the_allowed_ones() -> None:
    kinds = {o["kind"] for overlay, comps in COMBINATIONS for o in render(overlay, comps)}
    assert {k for _, k in CUSTOM_RESOURCES} & kinds == {"ServiceMonitor"}
    assert find(render("cpu", ("servicemonitor",)), "ServiceMonitor")
