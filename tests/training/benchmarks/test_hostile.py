"""The hostile-input benchmark builds its cases and reads answers without torch (it is a script: no timing here)."""

from __future__ import annotations

import subprocess
import sys

from service.core.config import Settings
from tests.service.live_server import REPO_ROOT
from training.benchmarks import hostile


def test_it_imports_no_torch_and_documents_its_options() -> None:
    code = "import sys, training.benchmarks.hostile; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT).returncode == 0
    assert hostile.parse_args([]).url is None and hostile.parse_args(["--url", "http://h:1"]).url == "http://h:1"


def test_every_case_expects_what_the_service_answers_with_its_defaults() -> None:
    settings = Settings()
    expected = {case.name: case.expected for case in hostile.cases("capsnet-mnist")}
    assert expected["v2 JSON, one pixel 1e30"] == "400"
    assert expected["64 MiB header value"] == "431"
    assert expected["one connection more than the server holds open"] == "503"
    assert expected["half a request line, then silence"] == f"408 after {settings.http_head_timeout_s:g} s"
    assert expected["a connection that sends nothing"] == f"closed after {settings.http_idle_timeout_s:g} s"
    assert expected["v1 multipart, 4 PNGs of 2000×2000 (the default pixel budgets)"] == "200"
    assert settings.max_request_pixels >= 4 * 2000 * 2000 and settings.max_image_pixels >= 2000 * 2000


def test_status_of_reads_a_status_line_or_none_for_a_close() -> None:
    assert hostile.status_of(b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 0\r\n\r\n") == 413
    assert hostile.status_of(b"") is None
