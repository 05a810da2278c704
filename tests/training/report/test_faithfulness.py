"""The faithfulness command: orders, curves and areas on a model whose answer is known; the committed results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO_ROOT, write_mnist_dir
from tests.service.api.test_explain_methods import (
    ATTENDING,
    DISTRACTOR,
    REGION,
    WEIGHT,
    attending_weights,
    digit_with_distractor,
    sigmoid,
)
from tests.service.conftest import write_em_like
from training.report import faithfulness as f

RESULTS = REPO_ROOT / "docs" / "results" / "explanations" / "faithfulness.json"
PAGE = REPO_ROOT / "docs" / "explanations.md"
MODELS = ("capsnet-mnist", "capsnet-mnist-int8", "capsnet-em-mnist")


@pytest.fixture(scope="module")
def attending(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("faithfulness")
    write_em_like(root, ATTENDING, attending_weights())
    return root


def test_ink_order_is_the_ink_hottest_first() -> None:
    image = np.zeros((4, 4), np.float32)
    image[0, :3] = 1.0  # ink at flat indices 0, 1, 2
    heat = np.zeros((4, 4))
    heat[0, 2], heat[0, 0], heat[3, 3] = 3.0, 2.0, 9.0  # the hottest pixel has no ink: never in the order
    order = f.ink_order(heat, image != 0, np.random.default_rng(0))
    assert order.tolist() == [2, 0, 1]


def test_equal_heat_is_ordered_at_random() -> None:
    ink = np.ones((8, 8), bool)
    orders = {tuple(f.ink_order(np.zeros((8, 8)), ink, np.random.default_rng(s))) for s in range(5)}
    assert len(orders) == 5 and all(sorted(o) == list(range(64)) for o in orders)


def test_curve_images_remove_and_show_the_ink_in_order() -> None:
    image = np.arange(1, 11, dtype=np.float32).reshape(2, 5)
    order = np.arange(10)[::-1]  # the last pixel first
    deletion, insertion = f.curve_images(image, order)
    assert deletion.shape == insertion.shape == (len(f.FRACTIONS) - 2, 2, 5)
    k = f.FRACTIONS.index(0.3) - 1  # 30% of 10 pixels: the last three
    assert deletion[k].reshape(-1).tolist() == [1, 2, 3, 4, 5, 6, 7, 0, 0, 0]
    assert insertion[k].reshape(-1).tolist() == [0, 0, 0, 0, 0, 0, 0, 8, 9, 10]


def test_occlusion_order_deletes_what_the_class_looks_at_first(attending: Path) -> None:
    """80 ink pixels: the 64 of the square the class weighs, then the 16 of the distractor it ignores."""
    model = f.open_model(attending / ATTENDING, 1)
    images = digit_with_distractor()[None, None]
    result = f.measure_model(model, images, seed=0)
    full = 64 * WEIGHT
    assert result["base_score"] == pytest.approx(sigmoid(full), abs=1e-4)
    # 20% of the ink is 16 pixels: occlusion takes them from the square, its reverse takes the distractor
    assert f.at(result, "occlusion", 0.2) == pytest.approx(sigmoid(full - 16 * WEIGHT), abs=1e-4)
    assert f.at(result, "occlusion reversed", 0.2) == pytest.approx(sigmoid(full), abs=1e-4)
    assert f.at(result, "occlusion", 0.2, "insertion") == pytest.approx(sigmoid(16 * WEIGHT), abs=1e-4)
    assert f.at(result, "occlusion reversed", 0.2, "insertion") == pytest.approx(0.5, abs=1e-4)
    o = result["orderings"]
    assert o["occlusion"]["deletion_area"] < o["random"]["deletion_area"] < o["occlusion reversed"]["deletion_area"]
    assert o["occlusion"]["insertion_area"] > o["occlusion reversed"]["insertion_area"]
    assert "routing" not in o  # the model has no routing map
    assert image_unchanged(images)


def image_unchanged(images: np.ndarray) -> bool:
    return bool(images[0, 0][REGION].all() and images[0, 0][DISTRACTOR].all())


def test_targets_compare_the_drop_with_randoms() -> None:
    def curve(at_10: float, at_30: float) -> dict[str, object]:
        values = [0.9, at_10, 0.5, at_30, 0.3, 0.2, 0.1, 0.0]
        return {"deletion": values, "insertion": values}

    result = {
        "base_score": 0.9,
        "orderings": {
            "occlusion": curve(0.6, 0.4),
            "occlusion reversed": curve(0.89, 0.85),
            "random": curve(0.88, 0.8),
        },
    }
    assert f.targets(result) == {"drop_at_10_vs_random": 15.0, "score_at_30": 0.4, "reversed_score_at_30": 0.85}


def test_the_command_writes_the_table_figure_and_explorer_figures(attending: Path, tmp_path: Path) -> None:
    data = write_mnist_dir(tmp_path / "mnist", n_test=16)
    script, page = tmp_path / "app.js", tmp_path / "page.md"
    script.write_text("const F = {\n    // faithfulness:begin\n    old\n    // faithfulness:end\n};\n")
    page.write_text("# Page\n\n<!-- faithfulness:begin -->\nold\n<!-- faithfulness:end -->\n\nAfter.\n")
    argv = ["--data-dir", str(data), "--model-repository", str(attending), "--models", ATTENDING, "--n", "16"]
    assert f.main([*argv, "--out", str(tmp_path / "docs"), "--explorer", str(script), "--page", str(page)]) == 0
    saved = json.loads((tmp_path / "docs" / "faithfulness.json").read_text())
    (result,) = saved["models"]
    assert result["n"] == 16 and result["command"].endswith(f"--models {ATTENDING}")
    assert (tmp_path / "docs" / "faithfulness.png").stat().st_size > 1000
    figures = f.explorer_figures(result)
    assert f'    "{ATTENDING}": {{ base: {figures["base"]}, occlusion: {figures["occlusion"]}' in script.read_text()
    assert "old" not in script.read_text() and "old" not in page.read_text()
    assert f.table(result) in page.read_text() and page.read_text().endswith("<!-- faithfulness:end -->\n\nAfter.\n")


def test_the_command_needs_no_torch() -> None:
    code = "import sys; sys.modules['torch'] = None; import training.report.faithfulness"  # None: import fails
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


def test_a_missing_data_directory_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert f.main(["--data-dir", str(tmp_path / "nowhere"), "--dry-run"]) == 2
    assert "nowhere" in capsys.readouterr().err


# --- the committed results ---------------------------------------------------------------------------------------


def committed() -> dict[str, dict[str, object]]:
    if not RESULTS.is_file():
        pytest.fail("docs/results/explanations/faithfulness.json is missing: python -m training.report.faithfulness")
    return {r["model"]: r for r in json.loads(RESULTS.read_text())["models"]}


def test_the_committed_results_cover_the_bundled_models_and_meet_the_targets() -> None:
    results = committed()
    for name in MODELS:
        result = results[name]
        assert result["n"] >= 1000
        assert f.at(result, "occlusion", 0.3) <= 0.45 and f.at(result, "occlusion reversed", 0.3) >= 0.80, name


INT8_SHORT = (
    "a known miss, documented in docs/explanations.md: the int8 model of card version 5 (outlier exposure) drops "
    "9.8x as much as random at 10%, short of 10x; its parent reaches 10.2x"
)


@pytest.mark.parametrize(
    "name", [pytest.param(m, marks=pytest.mark.xfail(strict=True, reason=INT8_SHORT)) if m.endswith("int8") else m
             for m in MODELS],
)  # fmt: skip
def test_removing_the_top_tenth_of_ink_drops_the_score_ten_times_as_much_as_random(name: str) -> None:
    result = committed()[name]
    drop = result["base_score"] - f.at(result, "occlusion", 0.1)
    random_drop = result["base_score"] - f.at(result, "random", 0.1)
    assert drop >= 10 * random_drop


def test_the_page_and_the_explorer_show_the_committed_figures() -> None:
    results = committed()
    page = PAGE.read_text()
    for result in results.values():
        assert f.table(result) in page, f"docs/explanations.md's table of {result['model']} differs from the JSON"
    assert f.page_block(page, list(results.values())) == page
    script = (REPO_ROOT / "service" / "static" / "app.js").read_text()
    assert f.explorer_block(script, list(results.values())) == script
