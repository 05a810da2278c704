"""deploy/Dockerfile, read statically (no Docker daemon needed): the runtime stage runs the serving install without
torch as a non-root user, exposes and health-checks the service's port, and the build context leaves data out."""

from __future__ import annotations

import importlib.metadata
import re
import shlex
from pathlib import Path

import pytest
import tomllib
import yaml

from tests.deploy.manifests import (
    K8S,
    REPO_ROOT,
    Dockerfile,
    Instruction,
    assert_served,
    default_port,
    dockerignore_excludes,
    dockerignore_patterns,
    setting_default,
)

VARIANTS = {"cpu": {"VARIANT": "cpu"}, "gpu": {"VARIANT": "gpu"}}


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return Dockerfile.parse()


def runtime_stages(dockerfile: Dockerfile, variant: str) -> list[int]:
    """The final stage and its base stages, for one variant's build arguments."""
    return dockerfile.chain(len(dockerfile.stage_names) - 1, VARIANTS[variant])


def env_of(instructions: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in instructions:
        for pair in shlex.split(instruction.args):
            key, _, value = pair.partition("=")
            env[key] = value
    return env


def pip_installs(dockerfile: Dockerfile) -> list[str]:
    """The arguments of every `pip install` in every RUN."""
    runs = " && ".join(i.args for i in dockerfile.instructions if i.keyword == "RUN")
    return [m.group(1).strip() for m in re.finditer(r"pip3? install\s+([^;&|]*)", runs)]


def test_default_target_is_the_cpu_runtime(dockerfile: Dockerfile) -> None:
    assert dockerfile.global_args["VARIANT"] == "cpu"
    assert dockerfile.stage_names[-1] == "runtime"
    assert dockerfile.base_image(len(dockerfile.stage_names) - 1, VARIANTS["cpu"]).startswith("ubuntu:")
    assert dockerfile.base_image(len(dockerfile.stage_names) - 1, VARIANTS["gpu"]).startswith("nvidia/cuda:")


@pytest.mark.parametrize("variant", VARIANTS)
def test_runtime_runs_as_a_non_root_user(dockerfile: Dockerfile, variant: str) -> None:
    users = dockerfile.in_stages(runtime_stages(dockerfile, variant), "USER")
    assert users, "the runtime stage must set USER"
    uid, _, gid = users[-1].args.partition(":")
    # Numeric, so the kubelet can enforce runAsNonRoot without reading /etc/passwd.
    assert uid.isdigit() and int(uid) != 0
    assert not gid or (gid.isdigit() and int(gid) != 0)
    deployment = yaml.safe_load((K8S / "base" / "deployment.yaml").read_text())
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)


@pytest.mark.parametrize("variant", VARIANTS)
def test_runtime_has_no_torch(dockerfile: Dockerfile, variant: str) -> None:
    stages = runtime_stages(dockerfile, variant)
    for instruction in dockerfile.in_stages(stages):
        assert "torch" not in instruction.args.lower(), f"runtime stage mentions torch: {instruction}"
        assert "[training]" not in instruction.args
    builder = dockerfile.stage_index("builder")
    for copy in dockerfile.in_stages(stages, "COPY"):
        source = re.search(r"--from=(\S+)", copy.args)
        if source:
            assert source.group(1) == "builder" and copy.args.split()[-2] == "/opt/venv", copy
    installs = pip_installs(dockerfile)
    # The variant's requirements (deploy/requirements.py: pyproject's base dependencies), then the project alone.
    assert installs == ["-r /tmp/requirements.txt", "--no-deps ."], f"only the base (serving) install: {installs}"
    (install,) = [i for i in dockerfile.instructions if i.stage == builder and "pip install --no-deps ." in i.args]
    assert 'deploy/requirements.py "$VARIANT" > /tmp/requirements.txt' in install.args


def test_training_extra_holds_torch_and_the_base_does_not() -> None:
    """What `pip install .` pulls: torch only through the training extra."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert not any(re.match(r"torch\b", dep) for dep in project["dependencies"])
    assert any(re.match(r"torch\b", dep) for dep in project["optional-dependencies"]["training"])


@pytest.mark.parametrize("variant", VARIANTS)
def test_exposes_and_health_checks_the_service_port(dockerfile: Dockerfile, variant: str) -> None:
    stages = runtime_stages(dockerfile, variant)
    port = default_port()
    (expose,) = dockerfile.in_stages(stages, "EXPOSE")
    assert str(port) in [p.split("/")[0] for p in expose.args.split()]
    (healthcheck,) = dockerfile.in_stages(stages, "HEALTHCHECK")
    command = healthcheck.exec_form()
    assert command is not None, "exec-form HEALTHCHECK (no shell needed)"
    script = " ".join(command)
    assert "/health/live" in script
    assert f"'{port}'" in script or f":{port}/" in script, "the health check must default to the service port"
    assert command[0] in {"python3", "python", "curl"}, "a tool the runtime image really has"


@pytest.mark.parametrize("variant", VARIANTS)
def test_exposes_the_grpc_port(dockerfile: Dockerfile, variant: str) -> None:
    (expose,) = dockerfile.in_stages(runtime_stages(dockerfile, variant), "EXPOSE")
    assert str(setting_default("grpc_port")) in [p.split("/")[0] for p in expose.args.split()]


def test_health_check_path_is_a_route_the_app_serves(dockerfile: Dockerfile) -> None:
    (healthcheck,) = dockerfile.in_stages(runtime_stages(dockerfile, "cpu"), "HEALTHCHECK")
    path = re.search(r"'(/[\w/]+)'", " ".join(healthcheck.exec_form() or []))
    assert path
    assert_served(path.group(1))


def test_entrypoint_starts_the_service(dockerfile: Dockerfile) -> None:
    stages = runtime_stages(dockerfile, "cpu")
    (entrypoint,) = dockerfile.in_stages(stages, "ENTRYPOINT")
    command = entrypoint.exec_form()
    assert command is not None, "exec form, so the server is PID 1 and receives SIGTERM"
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert command[0] in scripts and scripts[command[0]] == "service.main:main"
    assert not dockerfile.in_stages(stages, "STOPSIGNAL"), "the service drains on SIGTERM, the default"


def test_runtime_environment_serves_the_bundled_models_on_all_interfaces(dockerfile: Dockerfile) -> None:
    stages = runtime_stages(dockerfile, "cpu")
    env = env_of(dockerfile.in_stages(stages, "ENV"))
    assert env["CAPSNET_HOST"] == "0.0.0.0"
    copies = [c.args.split() for c in dockerfile.in_stages(stages, "COPY") if "--from" not in c.args]
    (models,) = [c for c in copies if c[0].rstrip("/") == "model/zoo"]
    assert env["CAPSNET_MODEL_REPOSITORY"] == models[1].rstrip("/")
    config = dict(line.split("=", 1) for line in (K8S / "base" / "config.env").read_text().split())
    assert config["CAPSNET_MODEL_REPOSITORY"] == env["CAPSNET_MODEL_REPOSITORY"]


def test_builder_and_runtime_share_the_python(dockerfile: Dockerfile) -> None:
    """The virtual environment is copied across stages: every base must be the same Ubuntu release."""
    builder = dockerfile.expand(dockerfile.stage_bases[dockerfile.stage_index("builder")])
    release = re.fullmatch(r"ubuntu:(\d+\.\d+)", builder)
    assert release, builder
    for variant in VARIANTS:
        base = dockerfile.base_image(len(dockerfile.stage_names) - 1, VARIANTS[variant])
        assert base == builder or base.endswith(f"-ubuntu{release.group(1)}"), base


def test_cuda_base_matches_the_onnxruntime_gpu_wheel(dockerfile: Dockerfile) -> None:
    """onnxruntime-gpu links one CUDA major (1.31 on PyPI: CUDA 13); the GPU base must carry that major."""
    try:
        files = importlib.metadata.files("onnxruntime-gpu") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("onnxruntime-gpu is not installed here: its CUDA major cannot be read")
    provider = next((f for f in files if f.name == "libonnxruntime_providers_cuda.so"), None)
    if provider is None:
        pytest.skip("this onnxruntime-gpu build has no CUDA provider library")
    linked = re.search(rb"libcudart\.so\.(\d+)", Path(str(provider.locate())).read_bytes())
    assert linked, "the CUDA provider names no libcudart"
    cuda_image = dockerfile.base_image(len(dockerfile.stage_names) - 1, VARIANTS["gpu"])
    tag = re.fullmatch(r"nvidia/cuda:(\d+)\.\d+(?:\.\d+)?-cudnn-runtime-ubuntu[\d.]+", cuda_image)
    assert tag, f"a CUDA + cuDNN runtime image: {cuda_image}"
    assert tag.group(1) == linked.group(1).decode(), f"{cuda_image} vs libcudart.so.{linked.group(1).decode()}"


@pytest.mark.parametrize(
    "path",
    [
        "data/mnist/train-images-idx3-ubyte.gz",
        "runs/dynamic/checkpoint.pt",
        "runs/dynamic/metrics.jsonl",
        ".venv/bin/python",
        ".git/HEAD",
        "model/zoo/capsnet-dynamic/best.pt",
        "model/zoo/capsnet-dynamic/capsnet.ts",
        "model/capsnet.py",
        "training/fitting/train.py",
        "tests/service/test_api.py",
        "test-artifacts/report.xml",
        "service/__pycache__/main.cpython-312.pyc",
        "checkpoints/epoch-10.ckpt",
        "deploy/Dockerfile",
    ],
)
def test_dockerignore_keeps_data_checkpoints_and_environments_out(path: str) -> None:
    assert dockerignore_excludes(path, dockerignore_patterns())


@pytest.mark.parametrize(
    "path",
    [
        "pyproject.toml",
        "README.md",
        "service/main.py",
        "service/static/index.html",
        "model/zoo/capsnet-dynamic/model.json",
        "model/zoo/capsnet-dynamic/capsnet.onnx",
        "model/zoo/capsnet-dynamic/decoder.onnx",
    ],
)
def test_dockerignore_keeps_what_the_build_copies(path: str) -> None:
    assert not dockerignore_excludes(path, dockerignore_patterns())


def test_every_copied_source_is_in_the_build_context(dockerfile: Dockerfile) -> None:
    patterns = dockerignore_patterns()
    sources = [
        source
        for copy in dockerfile.in_stages(list(range(len(dockerfile.stage_names))), "COPY")
        if "--from" not in copy.args
        for source in copy.args.split()[:-1]
    ]
    assert {"pyproject.toml", "service/", "model/zoo/"} <= set(sources)
    for source in sources:
        assert not dockerignore_excludes(source.rstrip("/"), patterns), f"{source} is excluded by .dockerignore"
    missing = [s for s in sources if not (REPO_ROOT / s).exists()]
    if missing:
        pytest.skip(f"not in the repository yet, so `docker build` would fail until they land: {missing}")


def test_no_benchmark_reaches_the_image() -> None:
    """The benchmarks, load generators and probes live in training/benchmarks/, which the build context leaves out:
    the only Python files the context holds are the server's and the build's requirements script."""
    patterns = dockerignore_patterns()
    tracked = [
        p for top in ("model", "service", "training", "tests", "deploy") for p in (REPO_ROOT / top).rglob("*.py")
    ]
    in_context = sorted(
        path for p in tracked if not dockerignore_excludes(path := p.relative_to(REPO_ROOT).as_posix(), patterns)
    )
    benchmarks = [p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "training" / "benchmarks").glob("*.py")]
    assert benchmarks and "service/main.py" in in_context
    assert [p for p in in_context if not p.startswith("service/") and p != "deploy/requirements.py"] == []
