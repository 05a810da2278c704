"""The pose-space projection: its selection, PCA and document; the committed projections match the bundled models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from service.runtime.model_dir import load_model_dir
from tests.conftest import REPO_ROOT
from training.predict.main import main as predict_main
from training.predict.pose_space import main, pca_2d, select_rows

STATIC = REPO_ROOT / "service" / "static" / "pose-space"


def test_select_rows_takes_the_first_of_each_label_and_the_flagged() -> None:
    labels = np.array(["1", "0", "1", "0", "1", "2"])
    flagged = np.array([False, False, False, False, True, True])
    assert select_rows(labels, flagged, per_class=1, max_flagged=5).tolist() == [0, 1, 4, 5]
    assert select_rows(labels, flagged, per_class=2, max_flagged=0).tolist() == [0, 1, 2, 3, 5]


def test_pca_finds_the_direction_of_largest_variance() -> None:
    rng = np.random.default_rng(0)
    t = rng.normal(size=200)
    x = np.outer(t, [0.0, 3.0, 0.0]) + rng.normal(scale=0.1, size=(200, 3))
    coordinates, explained = pca_2d(x)
    assert explained[0] > 0.99 and coordinates.shape == (200, 2)
    assert np.corrcoef(coordinates[:, 0], t)[0, 1] > 0.99  # the sign is fixed: the largest loading is positive


@pytest.mark.slow
def test_the_command_writes_the_view_s_files(
    idx_file: Path, dynamic_model: Path, tmp_path: Path, digits: tuple[np.ndarray, np.ndarray]
) -> None:
    predictions = tmp_path / "predictions"
    assert (
        predict_main(
            [
                str(idx_file),
                "--model",
                str(dynamic_model),
                "--out",
                str(predictions),
                "--all-poses",
                "--threads",
                "1",
                "--no-progress",
            ]
        )
        == 0
    )
    assert main([str(predictions), "--images", str(idx_file), "--out-dir", str(tmp_path), "--per-class", "1"]) == 0
    assert json.loads((tmp_path / "index.json").read_text()) == {"models": ["capsnet-mnist"]}
    document = json.loads((tmp_path / "capsnet-mnist.json").read_text())
    n = len(document["points"]["index"])
    assert document["classes"] == [str(c) for c in range(10)] and len(document["projections"]) == 10
    assert all(len(p["x"]) == len(p["y"]) == n for p in document["projections"])
    labels = digits[1]
    assert document["points"]["label"] == [str(labels[i]) for i in document["points"]["index"]]
    sprite = Image.open(tmp_path / "capsnet-mnist.png")
    assert sprite.size[0] == 28 * document["sprite"]["columns"] and sprite.size[1] >= 28 * (n // 20)
    without_poses = tmp_path / "narrow"
    assert (
        predict_main(
            [
                str(idx_file),
                "--model",
                str(dynamic_model),
                "--out",
                str(without_poses),
                "--threads",
                "1",
                "--limit",
                "2",
                "--no-progress",
            ]
        )
        == 0
    )
    with pytest.raises(ValueError, match="no 'poses' column: run capsnet-predict with --all-poses"):
        main([str(without_poses), "--images", str(idx_file), "--out-dir", str(tmp_path)])


def test_the_index_lists_the_committed_projections() -> None:
    listed = json.loads((STATIC / "index.json").read_text())["models"]
    assert listed == sorted(p.stem for p in STATIC.glob("*.json") if p.name != "index.json") != []


@pytest.mark.parametrize(
    "document", sorted(p for p in STATIC.glob("*.json") if p.name != "index.json"), ids=lambda p: p.stem
)
def test_committed_projections_match_the_bundled_models(document: Path) -> None:
    view = json.loads(document.read_text())
    model = load_model_dir(REPO_ROOT / "model" / "zoo" / view["model"])
    assert view["model_version"] == model.card.version
    assert view["graph_sha256"] == model.card.files["capsnet.onnx"].sha256, "re-run the pose_space command"
    sprite = Image.open(document.with_suffix(".png"))
    assert sprite.size[1] >= 28 * ((len(view["points"]["index"]) - 1) // view["sprite"]["columns"] + 1)
    assert document.stat().st_size + document.with_suffix(".png").stat().st_size < 200_000
