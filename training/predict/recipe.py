"""The analysis recipe of docs/batch-predict.md: which pose dimension tracks stroke thickness, found with pandas.

    python -m training.predict.recipe runs/predict/capsnet-mnist-t10k --model model/zoo/capsnet-mnist \
        --out docs/batch-predict-thickness.png

For each class, the Pearson correlation between each dimension of the winning capsule's pose and the image's ink
(the sum of the model input: thicker strokes, more ink) over the digits predicted as that class. The figure shows the
correlations, the strongest dimension's scatter, and the decoder redrawing a digit as that dimension moves.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

DELTAS = np.linspace(-0.25, 0.25, 7, dtype=np.float32)  # the paper's Figure 4 range


def load(predictions: Path) -> Any:
    """The predictions as a pandas DataFrame: one row per readable image, one column per pose dimension."""
    import pandas as pd

    df = pd.read_parquet(predictions)
    df = df[df["error"].isna()].reset_index(drop=True)
    poses = pd.DataFrame(np.stack(df["pose"].to_numpy()), columns=[f"d{i}" for i in range(len(df["pose"][0]))])
    return pd.concat([df.drop(columns=["pose"]), poses], axis=1)


def ink_correlations(df: Any, min_images: int = 2) -> Any:
    """(classes × pose dimensions) Pearson r between each pose dimension and ink, per predicted class with at least
    `min_images` images (a ValueError when none has)."""
    dims = [c for c in df.columns if c.startswith("d") and c[1:].isdigit()]
    counts = df["predicted_label"].value_counts()
    df = df[df["predicted_label"].isin(counts[counts >= min_images].index)]
    if df.empty:
        raise ValueError(f"no predicted class has {min_images} images")
    r = df.groupby("predicted_label")[[*dims, "ink"]].corr()["ink"].unstack()[dims]
    return r.fillna(0.0)  # a dimension constant within a class: no correlation


def decoder_sweep(model: Path, row: Any, dim: int, klass: int) -> np.ndarray:
    """The decoder's images (len(DELTAS), H, W) of `row`'s poses with DELTAS added to dimension `dim` of `klass`."""
    from service.contract import create_session, load_model_dir

    model_dir = load_model_dir(model)
    if model_dir.decoder is None:
        raise ValueError(f"model {model_dir.name} has no decoder")
    k = len(model_dir.card.classes)
    poses = np.repeat(np.float32(row["poses"]).reshape(1, k, -1), len(DELTAS), axis=0)
    poses[:, klass, dim] += DELTAS
    mask = np.zeros((len(DELTAS), k), np.float32)
    mask[:, klass] = 1.0
    session = create_session(model_dir.decoder, "cpu", 1)
    (images,) = session.run(None, {"poses": poses.reshape(len(DELTAS), k, *model_dir.card.pose_shape), "mask": mask})
    return np.asarray(images).reshape(len(DELTAS), *model_dir.card.image_size)


def figure(df: Any, r: Any, model: Path, out: Path) -> tuple[str, int, float]:
    """Draw the figure; (class, dimension, r) of the strongest correlation over all classes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label, column = r.abs().stack().idxmax()
    dim, value = int(column[1:]), float(r.loc[label, column])
    fig = plt.figure(figsize=(11, 6.2), layout="constrained")
    grid = fig.add_gridspec(2, 2, height_ratios=[3, 1.2])
    ax = fig.add_subplot(grid[0, 0])
    image = ax.imshow(r.to_numpy(), cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
    ax.set(xlabel="pose dimension", ylabel="predicted class", title="correlation of pose dimension with ink")
    ax.set_xticks(range(r.shape[1]), [c[1:] for c in r.columns])
    ax.set_yticks(range(r.shape[0]), list(r.index))
    fig.colorbar(image, ax=ax, shrink=0.8)
    ax = fig.add_subplot(grid[0, 1])
    chosen = df[df["predicted_label"] == label]
    ax.scatter(chosen[column], chosen["ink"], s=6, alpha=0.6)
    ax.set(
        xlabel=f"pose dimension {dim}",
        ylabel="ink (sum of the 28×28 input)",
        title=f"class {label}: dimension {dim} against ink, r = {value:.2f}",
    )
    klass = int(chosen["predicted_class"].iloc[0])
    median = chosen.iloc[int(np.argsort(chosen["ink"].to_numpy())[len(chosen) // 2])]
    if "poses" in df.columns:
        sweep = decoder_sweep(model, median, dim, klass)
        strip = fig.add_subplot(grid[1, :])
        strip.imshow(np.concatenate(list(sweep), axis=1), cmap="gray", vmin=0, vmax=1)
        strip.set_xticks([(i + 0.5) * sweep.shape[2] for i in range(len(DELTAS))], [f"{d:+.2f}" for d in DELTAS])
        strip.set_yticks([])
        strip.set_title(f"the decoder redraws a median-ink {label} ({median['source']}) as dimension {dim} moves")
    fig.savefig(out, dpi=110)
    return str(label), dim, value


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.predict.recipe", description=__doc__.splitlines()[0])
    p.add_argument("predictions", type=Path, help="a capsnet-predict output directory (with --all-poses for the strip)")
    p.add_argument(
        "--model",
        type=Path,
        default=Path("model/zoo/capsnet-mnist"),
        help="the model the predictions came from, for its decoder (default: model/zoo/capsnet-mnist)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("docs/batch-predict-thickness.png"),
        help="the figure (default: docs/batch-predict-thickness.png)",
    )
    p.add_argument("--min-images", type=int, default=20, help="classes with fewer images are left out (default: 20)")
    args = p.parse_args(argv)
    df = load(args.predictions)
    r = ink_correlations(df, args.min_images)
    strongest = r.abs().idxmax(axis=1)
    for label in r.index:
        column = strongest[label]
        print(f"class {label}: dimension {column[1:]:>2} r = {r.loc[label, column]:+.2f}")
    label, dim, value = figure(df, r, args.model, args.out)
    print(json.dumps({"class": label, "dimension": dim, "r": round(value, 3), "images": len(df)}))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
