"""The explorer's pose-space view: each class capsule's poses of MNIST test digits, projected to 2-D by PCA.

    capsnet-predict ../shared/data/mnist/t10k-images-idx3-ubyte.gz --model model/zoo/capsnet-mnist \
        --all-poses --out runs/predict/capsnet-mnist-t10k
    python -m training.predict.pose_space runs/predict/capsnet-mnist-t10k \
        --images ../shared/data/mnist/t10k-images-idx3-ubyte.gz --out-dir service/static/pose-space

Takes the first `--per-class` test digits of each label and every digit the model flags as not a digit (at most
`--max-flagged`), and writes `<model>.json` (points, and per class the PCA of that class's capsule poses over all
the points) and `<model>.png` (the digits, a sprite sheet) into `--out-dir`, where the explorer fetches them, and
lists the models there in `index.json`.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from PIL import Image

from training.predict.sources import IdxSource

SPRITE_COLUMNS = 20
INDEX = "index.json"
DECIMALS = 4


def select_rows(labels: np.ndarray, flagged: np.ndarray, per_class: int, max_flagged: int) -> np.ndarray:
    """Row positions: the first `per_class` of each label, then flagged rows not yet chosen (at most `max_flagged`),
    in increasing order."""
    chosen: set[int] = set()
    for label in np.unique(labels):
        chosen.update(np.flatnonzero(labels == label)[:per_class].tolist())
    extra = [i for i in np.flatnonzero(flagged).tolist() if i not in chosen][:max_flagged]
    return np.array(sorted(chosen | set(extra)), dtype=np.int64)


def pca_2d(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(N, D) -> coordinates (N, 2) on the two leading principal components, and their share of the variance.

    Each component's sign is fixed so that its largest loading is positive (SVD's sign is arbitrary).
    """
    centred = x.astype(np.float64) - x.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    components = vt[:2] * np.sign(vt[:2, np.argmax(np.abs(vt[:2]), axis=1)].diagonal())[:, None]
    variance = s**2
    return centred @ components.T, variance[:2] / variance.sum()


def sprite_png(pixels: np.ndarray, columns: int = SPRITE_COLUMNS) -> bytes:
    """uint8 digits (N, H, W) tiled `columns` to a row into one grayscale PNG."""
    n, height, width = pixels.shape
    rows = math.ceil(n / columns)
    sheet = np.zeros((rows * height, columns * width), np.uint8)
    for i, digit in enumerate(pixels):
        r, c = divmod(i, columns)
        sheet[r * height : (r + 1) * height, c * width : (c + 1) * width] = digit
    buffer = io.BytesIO()
    Image.fromarray(sheet).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def source_index(source: str) -> int:
    """The image's position in its IDX file, from a source named `file#i`."""
    found = re.fullmatch(r".*#(\d+)", source)
    if found is None:
        raise ValueError(f"source {source!r} does not name an IDX image (file#index)")
    return int(found.group(1))


def build(predictions: Path, images: Path, per_class: int, max_flagged: int) -> tuple[dict[str, Any], bytes]:
    """The view's JSON document and sprite sheet from a capsnet-predict output written with --all-poses."""
    table = pq.read_table(predictions)
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    if "poses" not in table.column_names:
        raise ValueError(f"{predictions} has no 'poses' column: run capsnet-predict with --all-poses")
    classes = json.loads(meta["capsnet.classes"])
    table = table.filter(table.column("error").is_null())
    labels = np.array(table.column("label").to_pylist())
    in_distribution = table.column("in_distribution").to_pylist()
    flagged = np.array([v is False for v in in_distribution])
    rows = select_rows(labels, flagged, per_class, max_flagged)
    indices = [source_index(s) for s in np.array(table.column("source").to_pylist())[rows]]
    poses = np.stack(table.column("poses").to_numpy(zero_copy_only=False)[rows]).reshape(len(rows), len(classes), -1)
    pixels = idx_pixels(images, indices)
    projections = []
    for c in range(len(classes)):
        coordinates, explained = pca_2d(poses[:, c])
        projections.append(
            {
                "class": c,
                "explained_variance": np.round(explained, 3).tolist(),
                "x": np.round(coordinates[:, 0], DECIMALS).tolist(),
                "y": np.round(coordinates[:, 1], DECIMALS).tolist(),
            }
        )
    predicted = np.array(table.column("predicted_class").to_pylist())[rows]
    document = {
        "model": meta["capsnet.model"],
        "model_version": meta["capsnet.model_version"],
        "graph_sha256": meta["capsnet.graph_sha256"],
        "classes": classes,
        "pose_shape": json.loads(meta["capsnet.pose_shape"]),
        "images": images.name,
        "sprite": {"tile": list(pixels.shape[1:]), "columns": SPRITE_COLUMNS},
        "points": {
            "index": indices,
            "label": labels[rows].tolist(),
            "predicted_class": predicted.tolist(),
            "in_distribution": [in_distribution[i] for i in rows],
        },
        "projections": projections,
    }
    return document, sprite_png(pixels)


def idx_pixels(images: Path, indices: list[int]) -> np.ndarray:
    wanted = set(indices)
    found = {}
    for position, item in enumerate(IdxSource(images, None).items()):
        if position in wanted:
            found[position] = np.asarray(item.pixels, np.uint8)
        if len(found) == len(wanted):
            break
    return np.stack([found[i] for i in indices])


def write_index(out_dir: Path) -> None:
    """`index.json`: the models with a projection in `out_dir`, which the explorer asks before fetching one."""
    models = sorted(p.stem for p in out_dir.glob("*.json") if p.name != INDEX)
    (out_dir / INDEX).write_text(json.dumps({"models": models}) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.predict.pose_space", description=__doc__.splitlines()[0])
    p.add_argument("predictions", type=Path, help="a capsnet-predict output directory written with --all-poses")
    p.add_argument("--images", type=Path, required=True, help="the IDX image file the predictions were made from")
    p.add_argument(
        "--out-dir",
        type=Path,
        default=Path("service/static/pose-space"),
        help="where <model>.json and <model>.png go (default: service/static/pose-space)",
    )
    p.add_argument("--per-class", type=int, default=30, help="digits per label (default: 30)")
    p.add_argument(
        "--max-flagged",
        type=int,
        default=50,
        help="at most this many more digits the model flags as not a digit (default: 50)",
    )
    args = p.parse_args(argv)
    document, sprite = build(args.predictions, args.images, args.per_class, args.max_flagged)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    name = document["model"]
    (args.out_dir / f"{name}.json").write_text(json.dumps(document, separators=(",", ":")) + "\n")
    (args.out_dir / f"{name}.png").write_bytes(sprite)
    write_index(args.out_dir)
    points = len(document["points"]["index"])
    print(f"wrote {args.out_dir / name}.json and .png: {points} digits, {len(document['classes'])} projections")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
