"""Helpers for the deployment tests: render kustomizations, read the Dockerfile, find the app's routes."""

from __future__ import annotations

import functools
import importlib
import itertools
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
K8S = DEPLOY / "k8s"
DOCKERFILE = DEPLOY / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
INFERENCE_SERVICE = DEPLOY / "kserve" / "inferenceservice.yaml"
LOADER_POD = K8S / "components" / "model-repository-pvc" / "loader-pod.yaml"

OVERLAYS = ("cpu", "gpu")
COMPONENTS = ("auth-tokens", "model-repository-pvc", "servicemonitor")
# Every overlay with every subset of the optional components.
COMBINATIONS = [
    (overlay, subset)
    for overlay in OVERLAYS
    for n in range(len(COMPONENTS) + 1)
    for subset in itertools.combinations(COMPONENTS, n)
]

Obj = dict[str, Any]


def combination_id(combination: tuple[str, tuple[str, ...]]) -> str:
    overlay, components = combination
    return "+".join((overlay, *components))


def kubectl() -> str:
    path = shutil.which("kubectl") or ("/usr/bin/kubectl" if Path("/usr/bin/kubectl").exists() else None)
    if path is None:
        pytest.skip("kubectl is not installed: `kubectl kustomize` renders the manifests (install kubectl >= 1.27)")
    return path


@functools.cache
def _render(overlay: str, components: tuple[str, ...]) -> tuple[str, ...]:
    """The overlay plus components rendered by `kubectl kustomize`, as JSON strings (hashable for the cache)."""
    with tempfile.TemporaryDirectory() as tmp:
        # kustomize only accepts paths relative to the kustomization that names them.
        rel = os.path.relpath(K8S, tmp)
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [f"{rel}/overlays/{overlay}"],
            "components": [f"{rel}/components/{c}" for c in components],
        }
        (Path(tmp) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        out = subprocess.run([kubectl(), "kustomize", tmp], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kubectl kustomize {overlay} + {components} failed:\n{out.stderr}"
    return tuple(json.dumps(doc) for doc in yaml.safe_load_all(out.stdout) if doc)


def render(overlay: str, components: tuple[str, ...] = ()) -> list[Obj]:
    return [json.loads(doc) for doc in _render(overlay, components)]


def only(objects: list[Obj], kind: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def find(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def container(pod_spec: Obj, name: str = "capsnet-serve") -> Obj:
    matches = [c for c in pod_spec["containers"] if c["name"] == name]
    assert len(matches) == 1, f"no container {name!r} in {[c['name'] for c in pod_spec['containers']]}"
    return matches[0]


def cpu_cores(quantity: str | int | float) -> float:
    """A Kubernetes CPU quantity ("2", "500m", 1.5) in cores."""
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def intra_op_threads(ctr: Obj, config: dict[str, str]) -> int:
    """The CAPSNET_INTRA_OP_THREADS the container will see (container env wins over envFrom)."""
    for env in ctr.get("env", []):
        if env["name"] != "CAPSNET_INTRA_OP_THREADS":
            continue
        if "value" in env:
            return int(env["value"])
        ref = env["valueFrom"]["resourceFieldRef"]
        assert ref["resource"] == "limits.cpu", f"threads follow {ref['resource']}, not limits.cpu"
        assert ref.get("containerName", ctr["name"]) == ctr["name"], "threads follow another container's limit"
        # The kubelet rounds the quantity divided by the divisor up to an integer.
        return math.ceil(cpu_cores(ctr["resources"]["limits"]["cpu"]) / cpu_cores(ref.get("divisor", "1")))
    assert "CAPSNET_INTRA_OP_THREADS" in config, "CAPSNET_INTRA_OP_THREADS is set neither in env nor the ConfigMap"
    return int(config["CAPSNET_INTRA_OP_THREADS"])


def settings_class() -> Any:
    """service.core.config.Settings. The manifests are checked against it, so a service whose settings cannot be
    imported fails these tests rather than skipping them (a skip would hide a broken service)."""
    try:
        return importlib.import_module("service.core.config").Settings
    except Exception as e:
        pytest.fail(f"service.core.config cannot be imported, so the manifests cannot be checked: {e!r}")


def setting_default(name: str) -> Any:
    """The default of a service setting, or a skip while the setting has not landed in the service."""
    fields = settings_class().model_fields
    if name not in fields:
        pytest.skip(f"the service has no `{name}` setting yet (CAPSNET_{name.upper()})")
    return fields[name].default


def default_port() -> int:
    return int(settings_class().model_fields["port"].default)


@functools.lru_cache(maxsize=1)
def _app_client() -> Any:
    """A test client on the real app (its lifespan not started: no models load), or why it could not be built."""
    try:
        from fastapi.testclient import TestClient

        module = importlib.import_module("service.main")
        app = getattr(module, "app", None) or module.create_app()
    except Exception as e:  # any failure to build the app fails the caller: a broken service must not pass
        return f"{type(e).__name__}: {e}"
    return TestClient(app, raise_server_exceptions=False)


def assert_served(*paths: str) -> None:
    """Each path is a GET route of the real app (any answer but 404/405: readiness is 503 while loading).

    Fails when `service.main` cannot be imported: the paths cannot be checked against a broken service."""
    client = _app_client()
    if isinstance(client, str):
        pytest.fail(f"service.main cannot be imported, so paths cannot be checked against its routes ({client[:500]})")
    for path in paths:
        status = client.get(path).status_code
        assert status not in (404, 405), f"GET {path} is not a route of service.main (status {status})"


@dataclass(frozen=True)
class Instruction:
    stage: int
    keyword: str
    args: str

    def exec_form(self) -> list[str] | None:
        """The JSON (exec) form of CMD/ENTRYPOINT/HEALTHCHECK arguments, or None for the shell form."""
        text = self.args
        if self.keyword == "HEALTHCHECK":
            text = re.sub(r"^(--\S+\s+)*CMD\s+", "", text)
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, list) else None


@dataclass(frozen=True)
class Dockerfile:
    instructions: tuple[Instruction, ...]
    stage_names: tuple[str, ...]
    stage_bases: tuple[str, ...]
    global_args: dict[str, str]

    @classmethod
    def parse(cls, path: Path = DOCKERFILE) -> Dockerfile:
        lines: list[str] = []
        pending = ""
        for raw in path.read_text().splitlines():
            stripped = raw.strip()
            if stripped.startswith("#") or (not stripped and pending):
                continue  # comments (even inside a continuation) and blank continuation lines
            if stripped.endswith("\\"):
                pending += stripped[:-1] + " "
                continue
            lines.append((pending + stripped).strip())
            pending = ""
        instructions, names, bases, global_args = [], [], [], {}
        stage = -1
        for line in filter(None, lines):
            keyword, _, args = line.partition(" ")
            keyword, args = keyword.upper(), args.strip()
            if keyword == "FROM":
                stage += 1
                parts = args.split()
                bases.append(parts[0])
                names.append(parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else str(stage))
            elif keyword == "ARG" and stage < 0:
                name, _, default = args.partition("=")
                global_args[name] = default
            instructions.append(Instruction(stage, keyword, args))
        return cls(tuple(instructions), tuple(names), tuple(bases), global_args)

    def stage_index(self, name: str) -> int:
        return self.stage_names.index(name)

    def expand(self, text: str, overrides: dict[str, str] | None = None) -> str:
        values = {**self.global_args, **(overrides or {})}
        return re.sub(r"\$\{?(\w+)\}?", lambda m: values.get(m.group(1), m.group(0)), text)

    def chain(self, stage: int, build_args: dict[str, str] | None = None) -> list[int]:
        """The stage and the stages it is built FROM, base first (external images end the chain)."""
        base = self.expand(self.stage_bases[stage], build_args)
        if base in self.stage_names:
            return [*self.chain(self.stage_index(base), build_args), stage]
        return [stage]

    def base_image(self, stage: int, build_args: dict[str, str] | None = None) -> str:
        first = self.chain(stage, build_args)[0]
        return self.expand(self.stage_bases[first], build_args)

    def in_stages(self, stages: list[int], keyword: str | None = None) -> list[Instruction]:
        return [i for i in self.instructions if i.stage in stages and (keyword is None or i.keyword == keyword)]


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves `path` out of the build context (last matching pattern wins; a pattern
    that matches a parent directory matches everything under it; `!` re-includes)."""
    excluded = False
    parts = path.split("/")
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _dockerignore_regex(pattern.lstrip("!"))
        if any(regex.fullmatch("/".join(parts[:n])) for n in range(1, len(parts) + 1)):
            excluded = not negate
    return excluded


def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    pattern = pattern.strip("/")
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out += pattern[i : end + 1]
            i = end + 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out)


def dockerignore_patterns() -> list[str]:
    lines = (line.strip() for line in DOCKERIGNORE.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]
