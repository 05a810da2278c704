"""The model-directory module: card round trip, verification naming the file, sessions, and a light import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from service.runtime import model_dir
from service.runtime.model_dir import ModelDirError, load_model_dir, read_card, write_card
from tests.service.conftest import EM_LIKE, write_em_like

REPO_ROOT = Path(__file__).resolve().parents[3]
BUNDLED = REPO_ROOT / "model" / "zoo" / "capsnet-mnist"


@pytest.fixture
def em_dir(tmp_path: Path) -> Path:
    write_em_like(tmp_path)
    return tmp_path / EM_LIKE


def test_card_round_trip(em_dir: Path) -> None:
    raw = read_card(em_dir)
    write_card(em_dir, {**raw, "description": "rewritten"})
    loaded = load_model_dir(em_dir)
    assert loaded.raw_card == {**raw, "description": "rewritten"}
    assert loaded.name == EM_LIKE and loaded.card.scores.output == "activations"
    assert loaded.graph == em_dir / model_dir.GRAPH_FILE and loaded.decoder is None
    assert (em_dir / model_dir.CARD_FILE).read_text().endswith("}\n")


def test_an_invalid_card_is_never_written(em_dir: Path) -> None:
    before = (em_dir / "model.json").read_text()
    with pytest.raises(ModelDirError, match=r"invalid model card: .*no output with role 'poses'"):
        write_card(em_dir, {**json.loads(before), "outputs": json.loads(before)["outputs"][:1]})
    assert (em_dir / "model.json").read_text() == before


def test_a_hash_mismatch_is_refused_naming_the_file(em_dir: Path) -> None:
    card = read_card(em_dir)
    card["files"]["capsnet.onnx"]["sha256"] = "0" * 64
    (em_dir / "model.json").write_text(json.dumps(card))
    with pytest.raises(ModelDirError) as info:
        load_model_dir(em_dir)
    assert str(info.value).startswith("capsnet.onnx sha256 mismatch: file ")
    assert str(info.value).endswith(", card 000000000000…: " + model_dir.ALTERED)


def test_a_size_mismatch_is_refused_naming_the_file(em_dir: Path) -> None:
    graph = em_dir / "capsnet.onnx"
    graph.write_bytes(graph.read_bytes() + b"\0")
    with pytest.raises(ModelDirError, match=r"^capsnet\.onnx has \d+ bytes, the card says \d+: the file was altered"):
        load_model_dir(em_dir)


def test_a_missing_file_and_a_missing_card(em_dir: Path, tmp_path: Path) -> None:
    (em_dir / "capsnet.onnx").unlink()
    with pytest.raises(ModelDirError) as info:
        load_model_dir(em_dir)
    assert str(info.value) == f"capsnet.onnx is listed in the card but missing from {em_dir}"
    with pytest.raises(ModelDirError) as info:
        load_model_dir(tmp_path / "nothing")
    assert str(info.value) == f"model.json not found in {tmp_path / 'nothing'} (is it a model directory?)"


def test_the_bundled_model_loads_and_verifies() -> None:
    loaded = load_model_dir(BUNDLED)
    assert loaded.name == "capsnet-mnist" and loaded.card.decoder is not None
    assert sorted(loaded.card.files) == ["capsnet.onnx", "decoder.onnx"]
    assert loaded.decoder == BUNDLED / "decoder.onnx"


def test_session_options(monkeypatch: pytest.MonkeyPatch) -> None:
    options = model_dir.session_options(3)
    assert options.intra_op_num_threads == 3 and options.inter_op_num_threads == 1
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert model_dir.session_options().intra_op_num_threads == 2
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert model_dir.session_options().intra_op_num_threads == 0  # ONNX Runtime's own choice


def test_sessions_from_a_file_and_from_bytes(em_dir: Path) -> None:
    image = np.zeros((2, 1, 28, 28), dtype=np.float32)
    from_file = model_dir.create_session(em_dir / "capsnet.onnx", "cpu", 1)
    from_bytes = model_dir.create_session((em_dir / "capsnet.onnx").read_bytes())
    assert model_dir.active_provider(from_file) == model_dir.CPU
    (a,) = from_file.run(["activations"], {"image": image})
    (b,) = from_bytes.run(["activations"], {"image": image})
    assert a.shape == (2, 10) and np.array_equal(a, b)
    with pytest.raises(ValueError, match=r"provider 'gpu' is not one of \('auto', 'cuda', 'cpu'\)"):
        model_dir.create_session(em_dir / "capsnet.onnx", "gpu")


def test_a_benchmark_passes_its_own_options_to_the_one_factory(em_dir: Path, tmp_path: Path) -> None:
    """Profiling, a lower optimisation level and spinning threads go through session_options; the rest stays."""
    options = model_dir.session_options(
        1,
        graph_optimization=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        allow_spinning=True,
        profile_prefix=str(tmp_path / "prof"),
    )
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert options.enable_profiling and options.inter_op_num_threads == 1
    session = model_dir.create_session(em_dir / "capsnet.onnx", options=options)
    session.run(None, {"image": np.zeros((1, 1, 28, 28), dtype=np.float32)})
    assert Path(session.end_profiling()).parent == tmp_path
    with pytest.raises(ValueError, match="intra_op_threads or options, not both"):
        model_dir.create_session(em_dir / "capsnet.onnx", "cpu", 1, options=options)


def test_importing_it_loads_neither_fastapi_nor_torch_nor_the_app() -> None:
    probe = (
        "import sys\n"
        "import service.runtime.model_dir\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'fastapi', 'starlette', 'model', "
        "'training') or m in ('service.main', 'service.core.config')))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_card_text_puts_each_list_of_numbers_on_one_line_and_reads_back_the_same() -> None:
    from service.runtime.model_dir import card_text

    card = {"levels": [0.0, 0.5, 1.0], "whitening": [[1.5, -2e-05], [3.0, 4.0]], "names": ["a", "[1,2]"], "none": []}
    text = card_text(card)
    assert json.loads(text) == card
    assert '"levels": [0.0, 0.5, 1.0]' in text and "    [1.5, -2e-05],\n" in text
    assert '"[1,2]"' in text  # a string that looks like a list is left as it is
    assert text.count("\n") == 12 and text.endswith("}\n")
