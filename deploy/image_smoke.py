"""The image's release check: build the CPU image, run it, check it as a user and a cluster would, remove it.

    make image-smoke            # or: python3 deploy/image_smoke.py --help

Builds deploy/Dockerfile (VARIANT=cpu) with Docker (when its daemon answers) or Podman (installed with apt-get
when neither is there and this runs as root), on the registry's Ubuntu base or, when that cannot be pulled, on a
Debian base bootstrapped locally with mmdebstrap. Then it runs the image and checks: readiness, v1 classify and
v2 infer on real MNIST test digits, the non-root user, no torch and plain onnxruntime (not the GPU package), the
exposed HTTP and gRPC ports, the HEALTHCHECK, and SIGTERM while requests are in flight (every one answered, exit
status 0). It removes every container and image it made, and prints `image capsnet-serve:cpu NNN MB` last.

Standard library only (it runs before anything is installed). Exit status 0 when every check passed, 1 on the
first failed check, 2 when the tools it needs are missing and cannot be installed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shlex
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO_ROOT / "deploy" / "Dockerfile"
IMAGE_NAME = "capsnet-serve:cpu"
# Every image a run builds carries this label (Podman puts it on each stage's image too), so all are removed.
SMOKE_LABEL = "org.capsnet.image-smoke"
MAX_SIZE_MB = 450
# The bundled model's input (its card: image, FP32, [N, 1, 28, 28]); MNIST's files hold 28x28 digits too.
SIDE = 28
# Where the build-only pip settings appear inside the builder (deploy/Dockerfile mounts them as secrets).
PIP_CA_IN_BUILD = "/run/secrets/pip-ca"
PIP_KEYS = ("index-url", "extra-index-url", "trusted-host", "timeout", "retries")
# pip config keys that reach the build only as what they mean there, e.g. the CA bundle as a mounted secret.
PIP_KEY_ALIASES = {"default-timeout": "timeout"}


class SmokeFailure(Exception):
    """A check failed: the message says which and what was seen."""


class MissingTool(Exception):
    """A tool the smoke needs is absent and could not be installed."""


def log(message: str) -> None:
    print(f"[image-smoke] {message}", flush=True)


def run(cmd: Sequence[str], *, check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output; on failure raise SmokeFailure with the command and its stderr."""
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as e:
        raise SmokeFailure(f"`{shlex.join(cmd)}` did not finish in {timeout:.0f} s") from e
    if check and out.returncode != 0:
        tail = "\n".join((out.stderr or out.stdout).strip().splitlines()[-25:])
        raise SmokeFailure(f"`{shlex.join(cmd)}` exited {out.returncode}:\n{tail}")
    return out


def apt_install(*packages: str) -> None:
    """Install Debian packages, or raise MissingTool saying what to install by hand."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise MissingTool(f"install {' '.join(packages)} (apt-get as root is not available here)")
    log(f"installing {' '.join(packages)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *packages]):
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if out.returncode != 0:
            raise MissingTool(f"`{shlex.join(cmd)}` failed:\n{out.stderr.strip()[-2000:]}")


# ---- the container engine ----


@dataclass
class Engine:
    """Docker or Podman, with the flags this host needs (all of them harmless on an ordinary host)."""

    name: str
    global_flags: list[str] = field(default_factory=list)
    run_flags: list[str] = field(default_factory=list)

    def cmd(self, *args: str) -> list[str]:
        return [self.name, *self.global_flags, *args]

    def __call__(
        self, *args: str, check: bool = True, timeout: float | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run(self.cmd(*args), check=check, timeout=timeout)

    def build_flags(self) -> list[str]:
        if self.name == "docker":
            return []
        # Podman (buildah): HEALTHCHECK exists only in the docker format; buildah 1.28 drops the stage that
        # `FROM base-${VARIANT}` names unless it builds every stage; host networking reaches the package
        # registries exactly as the host does.
        flags = ["--format", "docker", "--network", "host", *self.run_flags]
        help_text = self("build", "--help").stdout
        if "--skip-unused-stages" in help_text:
            flags.append("--skip-unused-stages=false")
        return flags


def docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False).returncode == 0


def find_engine(requested: str) -> Engine:
    """Docker when its daemon answers (or when asked for), else Podman, installed with apt-get if need be."""
    if requested == "docker" or (requested == "auto" and docker_answers()):
        if not docker_answers():
            raise MissingTool("docker is not installed or its daemon does not answer (`docker info` fails)")
        return Engine("docker")
    if shutil.which("podman") is None:
        apt_install("podman", "buildah", "runc", "uidmap")
    return Engine("podman")


def own_ulimits(nproc_cap: int | None = None) -> list[str]:
    """This process's open-file and process limits as --ulimit flags (the process limit capped at `nproc_cap`)."""
    import resource

    flags = []
    for name, limit in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft, hard = resource.getrlimit(limit)
        if soft == resource.RLIM_INFINITY or hard == resource.RLIM_INFINITY:
            continue  # unlimited: the engine's default is no worse
        if name == "nproc" and nproc_cap is not None:
            soft, hard = min(soft, nproc_cap), min(hard, nproc_cap)
        flags += ["--ulimit", f"{name}={soft}:{hard}"]
    return flags


def podman_candidates() -> Iterator[tuple[list[str], list[str]]]:
    """(global flags, run flags) to try, the plain default first. Some hosts refuse Podman's default OCI runtime
    (crun on cgroup v1/hybrid) or its default ulimits (more than the runtime may set without CAP_SYS_RESOURCE):
    then runc, and this process's own limits, with the process limit halved until the runtime accepts it."""
    runtimes: list[list[str]] = [[]] + ([["--runtime", "runc"]] if shutil.which("runc") else [])
    caps: list[int | None] = [None, *(2**k for k in range(17, 11, -1))]
    yield [], []
    for runtime in runtimes:
        for cap in caps:
            yield runtime, own_ulimits(cap)


def choose_podman_flags(engine: Engine, image: str) -> None:
    """Find the runtime and ulimit flags with which this host's Podman runs a container."""
    if engine.name != "podman":
        return
    first_error = ""
    for global_flags, run_flags in podman_candidates():
        engine.global_flags, engine.run_flags = global_flags, run_flags
        out = engine("run", "--rm", "--network", "host", *run_flags, image, "true", check=False, timeout=120)
        if out.returncode == 0:
            if global_flags or run_flags:
                log(f"podman's defaults fail here ({first_error}); using {shlex.join(global_flags + run_flags)}")
            return
        first_error = first_error or (out.stderr.strip().splitlines() or [""])[-1][-300:]
    raise SmokeFailure(f"podman cannot run a container here with any runtime or ulimits tried: {first_error}")


# ---- the base image ----


def dockerfile_arg(name: str, dockerfile: Path = DOCKERFILE) -> str:
    """The default of a global `ARG name=value` in the Dockerfile."""
    match = re.search(rf"^ARG {re.escape(name)}=(\S+)", dockerfile.read_text(), re.MULTILINE)
    if match is None:
        raise SmokeFailure(f"{dockerfile} has no `ARG {name}=…`")
    return match.group(1)


def host_codename(os_release: Path = Path("/etc/os-release")) -> str:
    """The host's Debian suite, or bookworm when the host is not Debian."""
    try:
        fields = dict(
            line.split("=", 1) for line in os_release.read_text().splitlines() if "=" in line and line[0] != "#"
        )
    except OSError:
        return "bookworm"
    if fields.get("ID", "").strip('"') != "debian":
        return "bookworm"
    return fields.get("VERSION_CODENAME", "bookworm").strip('"') or "bookworm"


def bootstrap_base(engine: Engine, work: Path, suite: str, tag: str) -> None:
    """A minimal Debian (essential packages, apt, passwd) from Debian's packages, imported as `tag` with the PATH an
    image needs."""
    if shutil.which("mmdebstrap") is None:
        apt_install("mmdebstrap")
    tarball = work / "base.tar"
    cmd = [
        "mmdebstrap",
        # Essential packages, apt, and passwd (the Dockerfile adds a user); no documentation.
        "--variant=apt",
        "--include=passwd",
        "--dpkgopt=path-exclude=/usr/share/man/*",
        "--dpkgopt=path-exclude=/usr/share/locale/*",
        "--dpkgopt=path-exclude=/usr/share/doc/*",
        "--dpkgopt=path-include=/usr/share/doc/*/copyright",
        suite,
        str(tarball),
    ]
    merged_usr = Path("/usr/share/mmdebstrap/hooks/merged-usr")
    if merged_usr.is_dir():
        cmd.insert(1, f"--hook-dir={merged_usr}")  # merges /usr itself: no usrmerge package, so no perl
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if host_codename() == suite and sources.is_file():
        cmd.append(str(sources))  # the host's own Debian mirror
    log(f"bootstrapping a Debian {suite} base with mmdebstrap")
    run(cmd, timeout=900)
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    engine("import", "--change", f"ENV PATH={path}", "--change", 'CMD ["/bin/bash"]', str(tarball), tag)
    tarball.unlink()


def pull(engine: Engine, image: str) -> bool:
    return engine("pull", image, check=False, timeout=300).returncode == 0


# ---- pip settings for the build ----


def host_pip_config(python: str = sys.executable) -> dict[str, str]:
    """The host's effective pip settings (`pip config list`: files and PIP_* variables), keyed without scope."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {}
    return parse_pip_config_list(out.stdout)


def parse_pip_config_list(text: str) -> dict[str, str]:
    """`global.cert='/x'` / `:env:.default-timeout='60'` lines as {key: value}; later lines win, like pip."""
    config: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        name = key.rsplit(".", 1)[-1]
        config[PIP_KEY_ALIASES.get(name, name)] = value.strip().strip("'\"")
    return config


def build_pip_conf(config: dict[str, str]) -> tuple[str, Path | None]:
    """The pip.conf the build mounts, and the CA bundle to mount beside it (None: pip's own certificates).

    Only what works inside a container is carried over: remote indexes, trusted hosts, timeouts, the CA bundle.
    Local paths (find-links directories, file:// indexes) stay on the host."""
    lines = ["[global]"]
    for key in PIP_KEYS:
        value = config.get(key)
        if value is None:
            continue
        if key in ("index-url", "extra-index-url"):
            value = " ".join(url for url in value.split() if url.startswith(("http://", "https://")))
            if not value:
                continue
        lines.append(f"{key} = {value}")
    ca = Path(config["cert"]) if config.get("cert") else None
    if ca is not None:
        if not ca.is_file():
            raise SmokeFailure(f"pip's configured CA bundle {ca} does not exist")
        lines.append(f"cert = {PIP_CA_IN_BUILD}")
    return "\n".join(lines) + "\n", ca


def pip_secret_flags(work: Path) -> list[str]:
    text, ca = build_pip_conf(host_pip_config())
    conf = work / "pip.conf"
    conf.write_text(text)
    flags = ["--secret", f"id=pip.conf,src={conf}"]
    if ca is not None:
        flags += ["--secret", f"id=pip-ca,src={ca}"]
    return flags


# ---- MNIST digits and HTTP ----


def read_idx(path: Path) -> tuple[tuple[int, ...], bytes]:
    """An IDX file (gzipped or not) as (shape, unsigned-byte data)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise SmokeFailure(f"{path} is not an unsigned-byte IDX file")
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    return shape, data[4 + 4 * ndim :]


def idx_file(data_dir: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (data_dir / name).is_file():
            return data_dir / name
    raise SmokeFailure(f"MNIST file {stem}(.gz) not found in {data_dir} (give --data-dir or CAPSNET_DATA_DIR)")


def mnist_test_digits(data_dir: Path, count: int) -> list[tuple[bytes, int]]:
    """The first `count` MNIST test images as (28*28 raw pixels, label)."""
    (n, h, w), pixels = read_idx(idx_file(data_dir, "t10k-images-idx3-ubyte"))
    (_,), labels = read_idx(idx_file(data_dir, "t10k-labels-idx1-ubyte"))
    if (h, w) != (SIDE, SIDE) or n < count:
        raise SmokeFailure(f"unexpected MNIST test images: shape {(n, h, w)}")
    return [(pixels[i * h * w : (i + 1) * h * w], labels[i]) for i in range(count)]


def png(pixels: bytes, width: int, height: int) -> bytes:
    """8-bit grayscale pixels (row-major) as a PNG file."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + pixels[y * width : (y + 1) * width] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def multipart(files: list[tuple[str, bytes]]) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = []
    for name, content in files:
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n'
            "Content-Type: image/png\r\n\r\n"
        )
        parts.append(head.encode() + content + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def http(
    url: str, body: bytes | None = None, content_type: str | None = None, timeout: float = 60
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    if content_type:
        request.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---- the checks ----


@dataclass
class Smoke:
    engine: Engine
    image: str
    container: str
    base_url: str
    digits: list[tuple[bytes, int]]
    timings: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def timed(self, step: str) -> Iterator[None]:
        start = time.monotonic()
        yield
        self.timings[step] = time.monotonic() - start
        log(f"{step}: ok ({self.timings[step]:.1f} s)")

    def inspect(self, template: str, target: str | None = None) -> str:
        return self.engine("inspect", "--format", template, target or self.image).stdout.strip()

    def exec_python(self, code: str) -> str:
        return self.engine("exec", self.container, "python3", "-c", code, timeout=60).stdout.strip()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if http(f"{self.base_url}/health/ready", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            if self.inspect("{{.State.Running}}", self.container) != "true":
                logs = self.engine("logs", self.container, check=False)
                raise SmokeFailure(f"the container exited before it was ready:\n{(logs.stdout + logs.stderr)[-3000:]}")
            time.sleep(0.2)
        raise SmokeFailure(f"/health/ready did not answer 200 within {timeout:.0f} s")

    def check_user_and_packages(self) -> None:
        user = self.inspect("{{.Config.User}}")
        uid = self.engine("exec", self.container, "id", "-u").stdout.strip()
        if not user or uid == "0" or user.split(":")[0] != uid:
            raise SmokeFailure(f"the server must run as the image's non-root USER: USER {user!r}, id -u {uid}")
        report = json.loads(
            self.exec_python(
                "import importlib.metadata as m, importlib.util as u, json; "
                "v = lambda d: next((x.version for x in m.distributions() if x.metadata['Name'] == d), None); "
                "print(json.dumps({'torch': u.find_spec('torch') is not None, "
                "'onnxruntime': v('onnxruntime'), 'onnxruntime-gpu': v('onnxruntime-gpu')}))"
            )
        )
        if report["torch"]:
            raise SmokeFailure("torch is importable in the serving image")
        if not report["onnxruntime"] or report["onnxruntime-gpu"]:
            raise SmokeFailure(f"the CPU image must hold plain onnxruntime and not onnxruntime-gpu: {report}")

    def check_exposed_ports(self) -> None:
        """The image exposes what the Dockerfile's EXPOSE says: HTTP and gRPC (CAPSNET_PORT, CAPSNET_GRPC_PORT)."""
        exposed = json.loads(self.inspect("{{json .Config.ExposedPorts}}") or "{}")
        expected = dockerfile_exposed()
        if len(expected) < 2 or dockerfile_port("CAPSNET_PORT") not in expected:
            raise SmokeFailure(f"the Dockerfile must EXPOSE the HTTP and the gRPC port, not only {expected}")
        for port in expected:
            if f"{port}/tcp" not in exposed:
                raise SmokeFailure(f"port {port}/tcp is not exposed by the image: {sorted(exposed)}")

    def check_healthcheck(self, timeout: float) -> None:
        (image,) = json.loads(self.engine("image", "inspect", self.image).stdout)
        health = healthcheck_of(image)
        if not health or not health.get("Test"):
            raise SmokeFailure("the image has no HEALTHCHECK (Podman keeps it only with --format docker)")
        if self.engine.name == "podman":
            result = self.engine("healthcheck", "run", self.container, check=False, timeout=60)
            if result.returncode != 0:
                raise SmokeFailure(f"`podman healthcheck run` failed: {result.stdout}{result.stderr}")
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.inspect("{{.State.Health.Status}}", self.container)
            if status == "healthy":
                return
            if status == "unhealthy":
                raise SmokeFailure("docker reports the container unhealthy")
            time.sleep(1)
        raise SmokeFailure(f"the container was not healthy within {timeout:.0f} s")

    def check_classify(self) -> str:
        files = [(f"digit{i}.png", png(pixels, SIDE, SIDE)) for i, (pixels, _) in enumerate(self.digits)]
        status, body = http(f"{self.base_url}/v1/classify", *multipart(files))
        if status != 200:
            raise SmokeFailure(f"POST /v1/classify answered {status}: {body[:500]!r}")
        answer = json.loads(body)
        predicted = [p["predicted_class"] for p in answer["predictions"]]
        labels = [label for _, label in self.digits]
        if predicted != labels:
            raise SmokeFailure(f"v1 classify predicted {predicted} for MNIST test digits labelled {labels}")
        return str(answer["model"])

    def check_infer(self, model: str) -> None:
        status, body = http(f"{self.base_url}/v2/models/{model}")
        if status != 200:
            raise SmokeFailure(f"GET /v2/models/{model} answered {status}: {body[:500]!r}")
        metadata = json.loads(body)
        (tensor,) = metadata["inputs"]
        n = len(json.loads(http(f"{self.base_url}/v1/models/{model}")[1])["classes"])
        classes = [o for o in metadata["outputs"] if o["shape"][1:] == [n]]
        if not classes:
            raise SmokeFailure(f"no per-class output ([-1, {n}]) in the model's metadata: {metadata['outputs']}")
        data = [value / 255 for pixels, _ in self.digits for value in pixels]
        request = {
            "inputs": [
                {"name": tensor["name"], "shape": [len(self.digits), 1, SIDE, SIDE], "datatype": "FP32", "data": data}
            ],
            "outputs": [{"name": classes[0]["name"]}],
        }
        status, body = http(
            f"{self.base_url}/v2/models/{model}/infer", json.dumps(request).encode(), "application/json"
        )
        if status != 200:
            raise SmokeFailure(f"POST /v2/models/{model}/infer answered {status}: {body[:500]!r}")
        (output,) = json.loads(body)["outputs"]
        scores: list[float] = output["data"]
        rows = [scores[n * i : n * (i + 1)] for i in range(len(self.digits))]
        predicted = [row.index(max(row)) for row in rows]
        labels = [label for _, label in self.digits]
        if predicted != labels:
            raise SmokeFailure(f"v2 infer ({output['name']}) predicted {predicted} for digits labelled {labels}")

    def check_sigterm_drains(self, requests: int, images: int, stop_timeout: int) -> int:
        """Send `requests` concurrent classify requests, SIGTERM the container while they run: every one must be
        answered 200 with all its predictions, some after the signal, and the server must exit 0."""
        files = [(f"d{i}.png", png(self.digits[i % len(self.digits)][0], SIDE, SIDE)) for i in range(images)]
        body, content_type = multipart(files)
        results: list[tuple[int, int, float] | str] = [""] * requests

        def send(i: int) -> None:
            try:
                status, answer = http(f"{self.base_url}/v1/classify", body, content_type, timeout=120)
                count = len(json.loads(answer).get("predictions", [])) if status == 200 else 0
                results[i] = (status, count, time.monotonic())
            except Exception as e:  # a refused or reset connection is the failure this check looks for
                results[i] = f"{type(e).__name__}: {e}"

        threads = [threading.Thread(target=send, args=(i,)) for i in range(requests)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)  # every request sent and queued
        signalled = time.monotonic()
        self.engine("stop", "--time", str(stop_timeout), self.container, timeout=stop_timeout + 60)
        for thread in threads:
            thread.join(timeout=180)
        lost = [r for r in results if not isinstance(r, tuple) or r[0] != 200 or r[1] != images]
        if lost:
            raise SmokeFailure(f"{len(lost)} of {requests} in-flight requests lost at SIGTERM: {lost[:3]}")
        after = sum(1 for r in results if isinstance(r, tuple) and r[2] > signalled)
        if after == 0:
            raise SmokeFailure("every request finished before SIGTERM: nothing was in flight (raise --images)")
        code = self.inspect("{{.State.ExitCode}}", self.container)
        if code != "0":
            logs = self.engine("logs", self.container, check=False)
            raise SmokeFailure(f"the server exited {code} after SIGTERM:\n{(logs.stdout + logs.stderr)[-2000:]}")
        return after


def healthcheck_of(inspected: dict[str, Any]) -> dict[str, Any] | None:
    """The HEALTHCHECK of `image inspect` output: Docker keeps it in Config, Podman at the top."""
    health = inspected.get("Config", {}).get("Healthcheck") or inspected.get("Healthcheck")
    return health if isinstance(health, dict) else None


def dockerfile_exposed() -> list[int]:
    """The ports of the Dockerfile's EXPOSE instruction."""
    match = re.search(r"^EXPOSE\s+(.+)$", DOCKERFILE.read_text(), re.MULTILINE)
    if match is None:
        raise SmokeFailure(f"{DOCKERFILE} has no EXPOSE")
    return [int(port.split("/")[0]) for port in match.group(1).split()]


def dockerfile_port(variable: str) -> int:
    """The port the image's HEALTHCHECK defaults to for `variable` (the service's HTTP port)."""
    match = re.search(rf"{variable}', '(\d+)'", DOCKERFILE.read_text())
    if match is None:
        raise SmokeFailure(f"the Dockerfile's HEALTHCHECK names no default for {variable}")
    return int(match.group(1))


# ---- the whole run ----


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Build, run and check the CPU image; remove what it made.")
    parser.add_argument(
        "--engine", choices=("auto", "docker", "podman"), default="auto",
        help="container engine; auto: docker if its daemon answers, else podman (default: auto)",
    )  # fmt: skip
    parser.add_argument(
        "--base", choices=("auto", "registry", "debian"), default="auto",
        help="runtime base: the Dockerfile's registry image, a Debian base bootstrapped with mmdebstrap, "
        "or auto: the registry's if it can be pulled, else Debian (default: auto)",
    )  # fmt: skip
    parser.add_argument(
        "--debian-suite", default=host_codename(),
        help=f"Debian suite of a bootstrapped base (default: the host's, else bookworm: {host_codename()})",
    )  # fmt: skip
    default_data = os.environ.get("CAPSNET_DATA_DIR", str(REPO_ROOT.parent / "shared" / "data" / "mnist"))
    parser.add_argument(
        "--data-dir", type=Path, default=Path(default_data),
        help=f"MNIST files, for real test digits (default: $CAPSNET_DATA_DIR or {default_data})",
    )  # fmt: skip
    parser.add_argument("--digits", type=int, default=8, help="MNIST test digits to classify (default: 8)")
    parser.add_argument("--requests", type=int, default=12, help="requests in flight at SIGTERM (default: 12)")
    parser.add_argument("--images", type=int, default=64, help="images per in-flight request (default: 64)")
    parser.add_argument("--ready-timeout", type=float, default=120, help="seconds to get ready (default: 120)")
    parser.add_argument("--max-size-mb", type=int, default=MAX_SIZE_MB, help=f"size limit (default: {MAX_SIZE_MB})")
    parser.add_argument("--keep-image", action="store_true", help=f"keep the image, tagged {IMAGE_NAME}")
    return parser.parse_args(argv)


def image_size_mb(engine: Engine, image: str) -> int:
    size = engine("image", "inspect", "--format", "{{.Size}}", image).stdout.strip()
    return round(int(size) / 1e6)


def start_container(engine: Engine, image: str, name: str, http_port: int, grpc_port: int) -> None:
    # Host networking: the server listens on free loopback-reachable ports of this machine, no bridge needed.
    engine(
        "run", "--detach", "--name", name, "--network", "host", *engine.run_flags,
        "-e", f"CAPSNET_PORT={http_port}", "-e", f"CAPSNET_GRPC_PORT={grpc_port}", image,
    )  # fmt: skip


def build_image(engine: Engine, args: argparse.Namespace, work: Path, tag: str, made: list[str]) -> str | None:
    """Build the CPU image as `tag`; returns the local base image it bootstrapped, if any."""
    build_args: list[str] = []
    base = None
    registry_base = dockerfile_arg("UBUNTU_IMAGE")
    if args.base == "registry" or (args.base == "auto" and pull(engine, registry_base)):
        if args.base == "registry" and not pull(engine, registry_base):
            raise SmokeFailure(f"cannot pull {registry_base}")
    else:
        log(f"{registry_base} cannot be pulled: bootstrapping the base from Debian's packages")
        base = f"localhost/capsnet-smoke-base:{args.debian_suite}-{uuid.uuid4().hex[:8]}"
        bootstrap_base(engine, work, args.debian_suite, base)
        made.append(base)
        # Both bases point at the local image: Podman builds every stage (see Engine.build_flags).
        build_args = ["--build-arg", f"UBUNTU_IMAGE={base}", "--build-arg", f"CUDA_IMAGE={base}"]
    choose_podman_flags(engine, base or registry_base)
    flags = [*build_args, *engine.build_flags(), *pip_secret_flags(work), "--label", f"{SMOKE_LABEL}={tag}"]
    made.append(tag)
    engine(
        "build", "-f", str(DOCKERFILE), "-t", tag, "--build-arg", "VARIANT=cpu", *flags, str(REPO_ROOT), timeout=1800
    )  # fmt: skip
    return base


@dataclass
class Made:
    """What a run created, so that it can be removed whatever happens."""

    engine: Engine | None = None
    images: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)

    def remove(self) -> None:
        """Containers, then the tagged images, then their untagged layers (Podman keeps each step's image)."""
        if self.engine is None:
            return
        layers: list[str] = []
        for image in self.images:
            history = self.engine("history", "--quiet", image, check=False, timeout=120).stdout.split()
            layers += [layer for layer in history if layer != "<missing>"]  # newest first
            labelled = ("images", "--all", "--quiet", "--filter", f"label={SMOKE_LABEL}={image}")
            layers += self.engine(*labelled, check=False, timeout=120).stdout.split()
        for name in self.containers:
            self.engine("rm", "--force", name, check=False, timeout=120)
        for image in reversed(self.images):
            self.engine("rmi", "--force", image, check=False, timeout=120)
        # Not forced: a layer another image still uses stays. Twice, as chains that share layers interleave.
        for layer in [*dict.fromkeys(layers), *dict.fromkeys(layers)]:
            self.engine("rmi", layer, check=False, timeout=120)


def smoke(args: argparse.Namespace, work: Path, made: Made) -> int:
    started = time.monotonic()
    digits = mnist_test_digits(args.data_dir, args.digits)
    engine = made.engine = find_engine(args.engine)
    log(f"engine: {engine.name}")
    tag = f"localhost/capsnet-serve-smoke:cpu-{uuid.uuid4().hex[:8]}"
    step = time.monotonic()
    build_image(engine, args, work, tag, made.images)
    log(f"build: ok ({time.monotonic() - step:.1f} s)")
    size = image_size_mb(engine, tag)
    if size > args.max_size_mb:
        layers = engine("history", "--format", "{{.Size}}\t{{.CreatedBy}}", tag).stdout
        raise SmokeFailure(f"the image is {size} MB, over the {args.max_size_mb} MB limit; its layers:\n{layers}")
    http_port, grpc_port = free_port(), free_port()
    name = f"capsnet-smoke-{uuid.uuid4().hex[:8]}"
    check = Smoke(engine, tag, name, f"http://127.0.0.1:{http_port}", digits)
    made.containers.append(name)
    start_container(engine, tag, name, http_port, grpc_port)
    with check.timed("ready"):
        check.wait_ready(args.ready_timeout)
    with check.timed("non-root user, no torch, plain onnxruntime"):
        check.check_user_and_packages()
    with check.timed("exposed ports (HTTP, gRPC)"):
        check.check_exposed_ports()
    with check.timed(f"v1 classify on {len(digits)} MNIST test digits"):
        model = check.check_classify()
    with check.timed("v2 infer"):
        check.check_infer(model)
    with check.timed("HEALTHCHECK"):
        check.check_healthcheck(timeout=90)
    with check.timed(f"SIGTERM during {args.requests} in-flight requests of {args.images} images"):
        after = check.check_sigterm_drains(args.requests, args.images, stop_timeout=30)
    log(f"{after} of {args.requests} requests were answered after SIGTERM; exit status 0")
    if args.keep_image:
        engine("tag", tag, IMAGE_NAME)
    log(f"all checks passed in {time.monotonic() - started:.0f} s")
    print(f"image {IMAGE_NAME} {size} MB")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    made = Made()
    with tempfile.TemporaryDirectory(prefix="capsnet-image-smoke-") as tmp:
        try:
            return smoke(args, Path(tmp), made)
        except MissingTool as e:
            print(f"image-smoke: missing tool: {e}", file=sys.stderr)
            return 2
        except SmokeFailure as e:
            print(f"image-smoke: FAILED: {e}", file=sys.stderr)
            return 1
        finally:
            made.remove()


if __name__ == "__main__":
    sys.exit(main())
