"""The KubeRay RayJob runs capsnet-predict's Ray engine: valid pods, a command the CLI accepts, shared data paths."""

from __future__ import annotations

import shlex

import pytest
import yaml

from tests.deploy.manifests import DEPLOY, Obj
from tests.deploy.test_manifests import K8S_VERSIONS, validate, validate_metadata

RAYJOB = DEPLOY / "kuberay" / "rayjob-predict.yaml"


@pytest.fixture(scope="module")
def rayjob() -> Obj:
    (job,) = [d for d in yaml.safe_load_all(RAYJOB.read_text()) if d]
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    return job


def pod_templates(job: Obj) -> list[Obj]:
    cluster = job["spec"]["rayClusterSpec"]
    return [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_metadata_and_pod_templates_are_valid(rayjob: Obj, version: str) -> None:
    validate_metadata(rayjob, version)
    for i, template in enumerate(pod_templates(rayjob)):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"template-{i}"}, "spec": template["spec"]}
        validate(pod, version)


def test_rayjob_fields_are_kuberay_s(rayjob: Obj) -> None:
    spec = rayjob["spec"]
    assert set(spec) <= {
        "entrypoint",
        "shutdownAfterJobFinishes",
        "ttlSecondsAfterFinished",
        "activeDeadlineSeconds",
        "rayClusterSpec",
        "runtimeEnvYAML",
        "submissionMode",
    }
    cluster = spec["rayClusterSpec"]
    assert set(cluster) <= {"rayVersion", "headGroupSpec", "workerGroupSpecs", "enableInTreeAutoscaling"}
    for group in cluster["workerGroupSpecs"]:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())


def test_the_entrypoint_is_a_valid_ray_engine_command(rayjob: Obj) -> None:
    from training.predict.main import build_parser

    program, *argv = shlex.split(rayjob["spec"]["entrypoint"])
    assert program == "capsnet-predict"
    args = build_parser().parse_args(argv)
    assert args.engine == "ray" and args.threads == 1
    mounts = {m["mountPath"] for t in pod_templates(rayjob) for c in t["spec"]["containers"] for m in c["volumeMounts"]}
    assert mounts == {"/data"}, "every pod mounts the data at the same path"
    assert str(args.input).startswith("/data/") and str(args.out).startswith("/data/")
    assert str(args.model).startswith("/opt/capsnet/models/"), "the models the batch image bundles"
    dockerfile = (DEPLOY / "kuberay" / "Dockerfile").read_text()
    assert "COPY --chown=ray:users model/zoo/ /opt/capsnet/models/" in dockerfile and "'.[ray]'" in dockerfile


def test_workers_get_one_actor_per_cpu(rayjob: Obj) -> None:
    head = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0", "no actor on the head"
    for group in rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        (ctr,) = group["template"]["spec"]["containers"]
        assert ctr["resources"]["requests"] == ctr["resources"]["limits"]
