"""Deletion and insertion curves of the served explanation methods, on the served ONNX models (no torch).

    python -m training.report.faithfulness --data-dir ../shared/data/mnist [--n 1000] [--out docs]

For each test digit the model's predicted class is explained by every method; the digit's ink pixels are then
removed (set to 0) in the map's order, hottest first, and the class score is read after each step (deletion);
insertion adds them back in the same order to a blank image (Petsiuk et al. 2018, RISE). Each method is run
against its reverse order and a random order. Writes <out>/faithfulness.json and
<out>/faithfulness.png, the tables into docs/explanations.md and the 10% figures into the
explorer (service/static/app.js).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from service.contract import (
    GRAPH_FILE,
    OCCLUSION_TILE,
    ModelCard,
    cpu_busy_percent,
    cpu_model,
    create_session,
    input_heatmap,
    load_model_dir,
    occluded_copies,
    occlusion_grid,
    occlusion_grid_size,
    occlusion_tiles,
    usable_cpus,
)
from training.data.mnist import IDXError, load_split, to_float
from training.options import add_data_dir, add_threads

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
EXPLORER_SCRIPT = REPO_ROOT / "service" / "static" / "app.js"
EXPLORER_BLOCK = ("// faithfulness:begin", "// faithfulness:end")  # the lines around the explorer's figures
PAGE = REPO_ROOT / "docs" / "explanations.md"
PAGE_BLOCK = ("<!-- faithfulness:begin -->", "<!-- faithfulness:end -->")  # the lines around the page's tables
DEFAULT_MODELS = ("capsnet-mnist", "capsnet-mnist-int8", "capsnet-em-mnist")
FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)  # share of the ink removed (deletion) or shown (insertion)
TABLE_FRACTIONS = (0.1, 0.2, 0.3, 0.5)
CHUNK = 8  # images whose curves are built and run together
RUN_ROWS = 64  # rows per ONNX Runtime run
Scorer = Callable[[np.ndarray], np.ndarray]  # images (B, 1, H, W) -> scores (B, K)


@dataclass(frozen=True)
class Model:
    card: ModelCard
    run: Callable[[np.ndarray], dict[str, np.ndarray]]  # images (B, 1, H, W) -> every output, by name

    def scores(self, images: np.ndarray) -> np.ndarray:
        parts = [self.run(images[i : i + RUN_ROWS])[self.card.scores.output] for i in range(0, len(images), RUN_ROWS)]
        return np.concatenate(parts) if parts else np.zeros((0, len(self.card.classes)), np.float32)


def open_model(path: Path, threads: int | None) -> Model:
    model_dir = load_model_dir(path)
    card = model_dir.card
    session = create_session(path / GRAPH_FILE, "cpu", threads)
    names = [o.name for o in card.outputs]

    def run(images: np.ndarray) -> dict[str, np.ndarray]:
        return dict(zip(names, session.run(names, {card.input.name: images}), strict=True))

    return Model(card, run)


def occlusion_maps(
    model: Model, images: np.ndarray, classes: np.ndarray, base: np.ndarray, tile: int = OCCLUSION_TILE
) -> np.ndarray:
    """The served occlusion heatmap of each image (N, 1, H, W) for its class: (N, H, W), from one batched run."""
    height, width = images.shape[-2:]
    tiles = [occlusion_tiles(image[0], tile) for image in images]
    copies = np.concatenate(
        [occluded_copies(image[0], t, tile)[:, None] for image, t in zip(images, tiles, strict=True)]
    )
    scores = model.scores(copies.astype(np.float32))
    maps, offset = [], 0
    for i, t in enumerate(tiles):
        occluded = scores[offset : offset + len(t), classes[i]]
        offset += len(t)
        grid = occlusion_grid(float(base[i]), occluded, t, occlusion_grid_size((height, width), tile))
        maps.append(input_heatmap(grid, tile, tile, (height, width)))
    return np.stack(maps)


def routing_maps(model: Model, outputs: dict[str, np.ndarray], classes: np.ndarray) -> np.ndarray:
    """The served routing heatmap of each image for its class: (N, H, W)."""
    card = model.card
    assert card.explanation is not None
    grids = outputs[card.explanation.name][np.arange(len(classes)), classes]  # (N, rows, columns)
    field = card.receptive_field
    return np.stack([input_heatmap(g, field.size, field.stride, card.image_size) for g in grids])


def ink_order(heat: np.ndarray, ink: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The flat indices of the ink pixels, hottest first; equal heat in random order."""
    where = np.flatnonzero(ink)
    return where[np.lexsort((rng.random(len(where)), -heat.reshape(-1)[where]))]


def curve_images(image: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An (H, W) image and its ink in removal order -> deletion and insertion images at the inner FRACTIONS,
    (F-2, H, W) each."""
    flat = image.reshape(-1)
    deletion, insertion = [], []
    for fraction in FRACTIONS[1:-1]:
        k = round(fraction * len(order))
        removed = flat.copy()
        removed[order[:k]] = 0
        shown = np.zeros_like(flat)
        shown[order[:k]] = flat[order[:k]]
        deletion.append(removed.reshape(image.shape))
        insertion.append(shown.reshape(image.shape))
    return np.stack(deletion), np.stack(insertion)


def measure_chunk(
    model: Model, images: np.ndarray, rng: np.random.Generator, tile: int = OCCLUSION_TILE
) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Base scores (N,) and, per ordering, deletion and insertion curves (N, F) of the predicted class."""
    outputs = model.run(images)
    scores = outputs[model.card.scores.output]
    classes = scores.argmax(axis=1)
    base = scores[np.arange(len(images)), classes]
    blank = model.scores(np.zeros_like(images[:1]))[0]
    maps = {"occlusion": occlusion_maps(model, images, classes, base, tile)}
    if model.card.explanation is not None:
        maps["routing"] = routing_maps(model, outputs, classes)
    orders: dict[str, list[np.ndarray]] = {name: [] for name in [*maps, *(f"{m} reversed" for m in maps), "random"]}
    for i, image in enumerate(images[:, 0]):
        ink = image != 0
        for name, heat in maps.items():
            orders[name].append(ink_order(heat[i], ink, rng))
            orders[f"{name} reversed"].append(ink_order(-heat[i], ink, rng))
        orders["random"].append(ink_order(np.zeros_like(image), ink, rng))
    inner = len(FRACTIONS) - 2
    batch = np.concatenate(
        [
            np.concatenate(curve_images(image, order[i]))
            for order in orders.values()
            for i, image in enumerate(images[:, 0])
        ]
    )[:, None]  # (orderings * N * 2 * inner, 1, H, W)
    all_scores = model.scores(batch.astype(np.float32)).reshape(len(orders), len(images), 2, inner, -1)
    curves = {}
    for o, name in enumerate(orders):
        picked = all_scores[o, np.arange(len(images)), :, :, classes]  # (N, 2, inner)
        ends = np.stack([base, blank[classes]], axis=1)  # deletion starts intact and ends blank
        deletion = np.column_stack([ends[:, 0], picked[:, 0], ends[:, 1]])
        insertion = np.column_stack([ends[:, 1], picked[:, 1], ends[:, 0]])
        curves[name] = (deletion, insertion)
    return base, curves


def area(curve: np.ndarray) -> float:
    """Area under a mean curve over FRACTIONS (trapezoids): 1.0 for a score of 1 throughout."""
    return float(np.trapezoid(curve, FRACTIONS))


def measure_model(model: Model, images: np.ndarray, seed: int, tile: int = OCCLUSION_TILE) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    bases, parts = [], []
    start = time.perf_counter()
    for i in range(0, len(images), CHUNK):
        base, curves = measure_chunk(model, images[i : i + CHUNK], rng, tile)
        bases.append(base)
        parts.append(curves)
        if (i // CHUNK) % 25 == 0:
            log.info(
                "%s: %d/%d images, %.0f s", model.card.name, i + len(base), len(images), time.perf_counter() - start
            )
    orderings: dict[str, Any] = {}
    for name in parts[0]:
        deletion = np.concatenate([p[name][0] for p in parts]).mean(axis=0)
        insertion = np.concatenate([p[name][1] for p in parts]).mean(axis=0)
        orderings[name] = {
            "deletion": [round(float(x), 4) for x in deletion],
            "insertion": [round(float(x), 4) for x in insertion],
            "deletion_area": round(area(deletion), 4),
            "insertion_area": round(area(insertion), 4),
        }
    return {
        "model": model.card.name,
        "model_version": model.card.version,
        "n": len(images),
        "base_score": round(float(np.concatenate(bases).mean()), 4),
        "orderings": orderings,
        "seconds": round(time.perf_counter() - start, 1),
    }


def at(result: dict[str, Any], ordering: str, fraction: float, curve: str = "deletion") -> float:
    return float(result["orderings"][ordering][curve][FRACTIONS.index(fraction)])


def targets(result: dict[str, Any], method: str = "occlusion") -> dict[str, Any]:
    """The faithfulness targets of the default method: its drop at 10% vs random's, its score at 30% vs reverse's."""
    base = result["base_score"]
    drop, random_drop = base - at(result, method, 0.1), base - at(result, "random", 0.1)
    return {
        "drop_at_10_vs_random": round(drop / random_drop, 1) if random_drop > 0 else None,
        "score_at_30": at(result, method, 0.3),
        "reversed_score_at_30": at(result, f"{method} reversed", 0.3),
    }


def table(result: dict[str, Any]) -> str:
    """One model's deletion table in Markdown."""
    head = " | ".join(f"{f:.0%}" for f in TABLE_FRACTIONS)
    lines = [
        f"| {result['model']} (score {result['base_score']:.3f} intact, n = {result['n']}) | {head} "
        "| deletion area ↓ | insertion area ↑ |",
        "|---|" + "---|" * (len(TABLE_FRACTIONS) + 2),
    ]
    for name, o in result["orderings"].items():
        cells = " | ".join(f"{at(result, name, f):.3f}" for f in TABLE_FRACTIONS)
        lines.append(f"| {name} | {cells} | {o['deletion_area']:.3f} | {o['insertion_area']:.3f} |")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(4.2 * len(results), 7), squeeze=False, sharey=True)
    for col, result in enumerate(results):
        for row, curve in enumerate(("deletion", "insertion")):
            ax = axes[row][col]
            for name, o in result["orderings"].items():
                style = "--" if "reversed" in name else (":" if name == "random" else "-")
                ax.plot(FRACTIONS, o[curve], style, marker=".", label=f"{name} ({o[f'{curve}_area']:.2f})")
            ax.set_title(f"{result['model']}: {curve}")
            ax.set_xlabel("share of the ink " + ("removed" if curve == "deletion" else "shown"))
            ax.set_ylabel("class score")
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_report(out: Path, results: list[dict[str, Any]], args: argparse.Namespace, busy: float | None) -> None:
    """Write the JSON and the figure; models measured before (in <out>/faithfulness.json) and not now stay."""
    path = out / "faithfulness.json"
    before = json.loads(path.read_text())["models"] if path.is_file() else []
    measured = {r["model"] for r in results}
    kept = [r for r in before if r["model"] not in measured]
    order = {name: i for i, name in enumerate(DEFAULT_MODELS)}
    models = sorted(kept + results, key=lambda r: (order.get(r["model"], len(order)), r["model"]))
    command = f"python -m training.report.faithfulness --n {args.n} --tile {args.tile} --seed {args.seed}"
    machine = {"processor": cpu_model(), "usable_cpus": usable_cpus(), "cpu_busy_percent_before": busy}
    date = time.strftime("%Y-%m-%d", time.gmtime())
    for result in results:
        result.update(command=f"{command} --models {result['model']}", machine=machine, date=date)
    report = {"fractions": list(FRACTIONS), "occlusion_tile": args.tile, "models": models}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")


def render(out: Path, explorer: Path | None, page: Path | None) -> None:
    """Draw the figure from <out>/faithfulness.json, write its tables into the docs page and its 10%
    figures into the explorer's script."""
    models = json.loads((out / "faithfulness.json").read_text())["models"]
    plot(models, out / "faithfulness.png")
    if explorer is not None:
        explorer.write_text(explorer_block(explorer.read_text(), models))
    if page is not None:
        page.write_text(page_block(page.read_text(), models))


def explorer_figures(result: dict[str, Any]) -> dict[str, float]:
    """A model's mean score intact and with 10% of the ink removed by each method and at random, to 2 decimals."""
    methods = [name for name in result["orderings"] if name != "random" and not name.endswith(" reversed")]
    figures = {"base": result["base_score"], **{m: at(result, m, 0.1) for m in [*methods, "random"]}}
    return {k: round(v, 2) for k, v in figures.items()}


def js_object(figures: dict[str, float]) -> str:
    """{"base": 0.94, "routing": 0.92} -> '{ base: 0.94, routing: 0.92 }' (names quoted where they must be)."""
    items = [f"{k if k.isidentifier() else json.dumps(k)}: {v}" for k, v in figures.items()]
    return "{ " + ", ".join(items) + " }"


def explorer_block(script: str, models: list[dict[str, Any]]) -> str:
    """`script` with the lines between EXPLORER_BLOCK's markers replaced by each model's `explorer_figures`."""
    lines = [f"{json.dumps(r['model'])}: {js_object(explorer_figures(r))}," for r in models]
    return replace_block(script, EXPLORER_BLOCK, lines)


def page_block(page: str, models: list[dict[str, Any]]) -> str:
    """`page` with the lines between PAGE_BLOCK's markers replaced by each model's table and target figures."""
    lines = []
    for r in models:
        t = targets(r)
        lines += [
            table(r),
            "",
            f"Occlusion's 10% drop is {t['drop_at_10_vs_random']}× random's; at 30% it leaves "
            f"{t['score_at_30']:.3f}, its reverse order {t['reversed_score_at_30']:.3f}.",
            "",
        ]
    return replace_block(page, PAGE_BLOCK, lines[:-1])


def replace_block(text: str, markers: tuple[str, str], lines: list[str]) -> str:
    """`text` with the lines between the two marker lines replaced by `lines`, indented as the first marker."""
    begin, end = markers
    head, rest = text.split(begin, 1)
    indent = head[head.rfind("\n") + 1 :]
    _, tail = rest.split(end, 1)
    body = "".join(f"{indent}{line}\n" if line else "\n" for line in lines)
    return head + begin + "\n" + body + indent + end + tail


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_dir(parser)
    parser.add_argument("--model-repository", default=str(REPO_ROOT / "model" / "zoo"), help="(default: model/zoo)")
    parser.add_argument(
        "--models", nargs="+", default=list(DEFAULT_MODELS), help=f"(default: {' '.join(DEFAULT_MODELS)})"
    )
    parser.add_argument("--n", type=int, default=1000, help="test digits, the first n of the split (default: 1000)")
    parser.add_argument(
        "--out",
        default=str(REPO_ROOT / "docs" / "results" / "explanations"),
        help="writes faithfulness.json and faithfulness.png here (default: docs/results/explanations)",
    )
    add_threads(parser, "ONNX Runtime intra-op threads", default_text="ONNX Runtime's own")
    parser.add_argument(
        "--tile",
        type=int,
        default=OCCLUSION_TILE,
        help=f"occlusion tile side in pixels (default: {OCCLUSION_TILE}, the service's)",
    )
    parser.add_argument("--seed", type=int, default=0, help="for random orders and tie-breaking (default: 0)")
    parser.add_argument(
        "--explorer",
        default=str(EXPLORER_SCRIPT),
        help="the explorer script whose figures to update; '' for none (default: service/static/app.js)",
    )
    parser.add_argument(
        "--page",
        default=str(PAGE),
        help="the docs page whose tables to update; '' for none (default: docs/explanations.md)",
    )
    parser.add_argument("--render-only", action="store_true", help="measure nothing: redraw from the saved JSON")
    parser.add_argument("--dry-run", action="store_true", help="8 digits, nothing written")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args(argv)
    explorer = Path(args.explorer) if args.explorer else None
    page = Path(args.page) if args.page else None
    if args.render_only:
        render(Path(args.out), explorer, page)
        return 0
    n = CHUNK if args.dry_run else args.n
    try:
        images = to_float(load_split(args.data_dir, "test").images[:n])
    except IDXError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    busy = cpu_busy_percent()
    results = []
    for name in args.models:
        model = open_model(Path(args.model_repository) / name, args.threads)
        result = measure_model(model, images, args.seed, args.tile)
        result["targets"] = targets(result)
        results.append(result)
        print(table(result), "\n", json.dumps(result["targets"]), "\n", flush=True)
    if args.dry_run:
        return 0
    write_report(Path(args.out), results, args, busy)
    render(Path(args.out), explorer, page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
