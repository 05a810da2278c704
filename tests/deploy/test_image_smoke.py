"""deploy/image_smoke.py without a container engine: its digits, PNGs and multipart bodies, the build-only pip
settings it derives from the host's, what it reads from the Dockerfile, and its errors when tools or data are
missing. The whole smoke (build, run, checks) is `make image-smoke`, the release check."""

from __future__ import annotations

import gzip
import io
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from deploy import image_smoke
from tests.deploy.manifests import DOCKERFILE, REPO_ROOT, Dockerfile, default_port, setting_default


def write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


@pytest.fixture
def mnist_dir(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", rng.integers(0, 256, (5, 28, 28)))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.array([7, 2, 1, 0, 4]))
    return tmp_path


def test_reads_the_first_test_digits_with_their_labels(mnist_dir: Path) -> None:
    digits = image_smoke.mnist_test_digits(mnist_dir, 3)
    assert [label for _, label in digits] == [7, 2, 1]
    images = np.frombuffer(gzip.decompress((mnist_dir / "t10k-images-idx3-ubyte.gz").read_bytes())[16:], np.uint8)
    assert digits[1][0] == images.reshape(5, 784)[1].tobytes()


def test_missing_or_foreign_mnist_files_fail_clearly(tmp_path: Path, mnist_dir: Path) -> None:
    with pytest.raises(image_smoke.SmokeFailure, match=r"t10k-images-idx3-ubyte\(\.gz\) not found in .*--data-dir"):
        image_smoke.mnist_test_digits(tmp_path / "nowhere", 1)
    (mnist_dir / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\x00\x00\x0d\x01" + b"\x00" * 8))
    with pytest.raises(image_smoke.SmokeFailure, match="not an unsigned-byte IDX file"):
        image_smoke.mnist_test_digits(mnist_dir, 1)


def test_png_decodes_to_the_same_pixels() -> None:
    pixels = np.arange(28 * 28, dtype=np.uint32).reshape(28, 28) % 256
    decoded = Image.open(io.BytesIO(image_smoke.png(pixels.astype(np.uint8).tobytes(), 28, 28)))
    assert decoded.mode == "L" and decoded.size == (28, 28)
    np.testing.assert_array_equal(np.asarray(decoded), pixels)


def test_multipart_body_holds_every_file() -> None:
    body, content_type = image_smoke.multipart([("a.png", b"AAA"), ("b.png", b"BBB")])
    boundary = content_type.split("boundary=")[1]
    parts = body.split(f"--{boundary}".encode())
    assert len(parts) == 4 and parts[-1] == b"--\r\n"
    assert b'filename="b.png"' in parts[2] and parts[2].endswith(b"\r\n\r\nBBB\r\n")


HOST_PIP = """\
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
user.find-links='/opt/wheels'
user.extra-index-url='file:///opt/pypi/simple https://mirror.example/simple'
:env:.default-timeout='180'
:env:.index-url='https://proxy.example/pypi/simple'
"""


def test_build_pip_conf_carries_what_works_in_a_container(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    config = image_smoke.parse_pip_config_list(HOST_PIP.replace("/etc/ssl/certs/ca-certificates.crt", str(ca)))
    text, mounted = image_smoke.build_pip_conf(config)
    assert mounted == ca
    assert text.splitlines() == [
        "[global]",
        "index-url = https://proxy.example/pypi/simple",
        "extra-index-url = https://mirror.example/simple",
        "timeout = 180",
        f"cert = {image_smoke.PIP_CA_IN_BUILD}",
    ]
    assert "/opt/wheels" not in text and "file://" not in text and "constraint" not in text


def test_build_pip_conf_without_host_settings_is_empty_and_a_missing_ca_fails(tmp_path: Path) -> None:
    assert image_smoke.build_pip_conf({}) == ("[global]\n", None)
    with pytest.raises(image_smoke.SmokeFailure, match=r"CA bundle .*missing\.crt does not exist"):
        image_smoke.build_pip_conf({"cert": str(tmp_path / "missing.crt")})


def test_pip_secrets_are_mounted_where_the_dockerfile_expects_them() -> None:
    """The secrets' ids and targets agree between the smoke and the Dockerfile; no pip setting is baked in."""
    dockerfile = Dockerfile.parse()
    (install,) = [i for i in dockerfile.instructions if "pip install -r" in i.args]
    assert "--mount=type=secret,id=pip.conf,target=/etc/pip.conf" in install.args
    # A secret mounted without a target appears at /run/secrets/<id>.
    assert "--mount=type=secret,id=pip-ca " in install.args
    assert image_smoke.PIP_CA_IN_BUILD == "/run/secrets/pip-ca"
    for instruction in dockerfile.instructions:
        if instruction.keyword in ("ENV", "ARG", "COPY"):
            assert "pip" not in instruction.args.lower() or "PIP_DISABLE_PIP_VERSION_CHECK" in instruction.args


def test_reads_base_image_and_ports_from_the_dockerfile() -> None:
    assert image_smoke.dockerfile_arg("UBUNTU_IMAGE") == Dockerfile.parse().global_args["UBUNTU_IMAGE"]
    assert image_smoke.dockerfile_port("CAPSNET_PORT") == default_port()
    assert image_smoke.dockerfile_exposed() == [default_port(), setting_default("grpc_port")]
    with pytest.raises(image_smoke.SmokeFailure, match="has no `ARG NOPE=…`"):
        image_smoke.dockerfile_arg("NOPE", DOCKERFILE)


@pytest.mark.parametrize(
    ("os_release", "suite"),
    [('ID=debian\nVERSION_CODENAME="trixie"\n', "trixie"), ("ID=ubuntu\nVERSION_CODENAME=noble\n", "bookworm")],
)
def test_bootstrapped_suite_follows_a_debian_host(tmp_path: Path, os_release: str, suite: str) -> None:
    (tmp_path / "os-release").write_text(os_release)
    assert image_smoke.host_codename(tmp_path / "os-release") == suite
    assert image_smoke.host_codename(tmp_path / "absent") == "bookworm"


def test_podman_fallbacks_start_with_the_defaults_and_lower_only_the_process_limit() -> None:
    import resource

    candidates = list(image_smoke.podman_candidates())
    assert candidates[0] == ([], [])
    nofile = "{}:{}".format(*resource.getrlimit(resource.RLIMIT_NOFILE))
    for runtime in {tuple(flags) for flags, _ in candidates[1:]}:
        ulimits = [" ".join(run) for flags, run in candidates[1:] if tuple(flags) == runtime]
        assert all(f"nofile={nofile}" in u for u in ulimits), "the open-file limit stays this process's own"
        nproc = [int(m.group(1)) for u in ulimits if (m := re.search(r"nproc=(\d+):", u))]
        assert nproc == sorted(nproc, reverse=True) and nproc[-1] >= 4096


@pytest.mark.parametrize(
    "inspected",
    [
        {"Config": {"Healthcheck": {"Test": ["CMD", "true"]}}},  # docker image inspect
        {"Config": {"ExposedPorts": {}}, "Healthcheck": {"Test": ["CMD", "true"]}},  # podman image inspect
    ],
)
def test_healthcheck_is_found_where_each_engine_keeps_it(inspected: dict[str, object]) -> None:
    assert image_smoke.healthcheck_of(inspected) == {"Test": ["CMD", "true"]}
    assert image_smoke.healthcheck_of({"Config": {}}) is None


def test_docker_without_a_daemon_is_a_missing_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_smoke, "docker_answers", lambda: False)
    with pytest.raises(image_smoke.MissingTool, match=r"docker is not installed or its daemon does not answer"):
        image_smoke.find_engine("docker")


def test_missing_data_fails_before_any_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert image_smoke.main(["--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("image-smoke: FAILED: MNIST file t10k-images-idx3-ubyte(.gz) not found")


def test_make_target_runs_the_smoke() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    recipe = re.search(r"^image-smoke:.*\n\t(.+)$", makefile, re.MULTILINE)
    assert recipe, "Makefile has no image-smoke target"
    assert "deploy/image_smoke.py" in recipe.group(1)
    assert "image-smoke" in re.search(r"^\.PHONY:(.*)$", makefile, re.MULTILINE).group(1)  # type: ignore[union-attr]
