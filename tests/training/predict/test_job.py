"""capsnet-predict on one machine: every input kind, the row contract, error rows, fail-fast, shards and resume."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from training.predict import job as job_module
from training.predict.job import JobConfig, JobError, run_job
from training.predict.main import main
from training.predict.predictor import PredictOptions, Predictor
from training.predict.sources import Item, SourceError, open_source

from .conftest import EM, png

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def predictor(dynamic_model: Path) -> Predictor:
    return Predictor(dynamic_model, PredictOptions(batch_size=4, threads=1, all_poses=True))


def predict_all(path: Path, predictor: Predictor, out: Path, **config: object) -> pa.Table:
    source = open_source(path)
    run_job(source, predictor, JobConfig(out=out, workers=2, progress=False, **config), {"path": str(path)})  # type: ignore[arg-type]
    return pq.read_table(out)


def test_folder_rows_labels_and_metadata(image_folder: Path, predictor: Predictor, tmp_path: Path) -> None:
    table = predict_all(image_folder, predictor, tmp_path / "out")
    rows = table.to_pylist()
    calibration = predictor.card.ood_calibration
    assert calibration is not None
    assert [r["source"] for r in rows] == sorted(
        p.relative_to(image_folder).as_posix() for p in image_folder.rglob("*.*")
    )
    for row in rows:
        assert row["label"] == (None if row["source"] == "top.png" else row["source"].split("/")[0])
        assert row["error"] is None and row["predicted_label"] == str(row["predicted_class"])
        assert row["predicted_class"] == int(np.argmax(row["scores"]))
        assert row["pose"] == row["poses"][16 * row["predicted_class"] : 16 * (row["predicted_class"] + 1)]
        assert row["ood_score"] is not None and row["in_distribution"] == (row["ood_score"] <= calibration.threshold)
    assert [r["inverted"] for r in rows if r["source"].endswith(".jpg")] == [True]
    meta = table.schema.metadata
    assert meta[b"capsnet.model"] == b"capsnet-mnist" and meta[b"capsnet.pose_shape"] == b"[16]"


def test_tar_and_parquet_bytes_give_the_folder_s_rows(
    image_folder: Path, tar_file: Path, predictor: Predictor, tmp_path: Path
) -> None:
    folder = predict_all(image_folder, predictor, tmp_path / "folder")
    tarred = predict_all(tar_file, predictor, tmp_path / "tar")
    assert tarred.column("source").to_pylist() == [f"digits.tar.gz:{s}" for s in folder.column("source").to_pylist()]
    files = sorted(image_folder.rglob("*.*"))
    parquet = tmp_path / "images.parquet"
    pq.write_table(
        pa.table({"image": [f.read_bytes() for f in files], "label": [f.parent.name for f in files]}), parquet
    )
    from_parquet = predict_all(parquet, predictor, tmp_path / "pq")
    assert from_parquet.column("source").to_pylist()[:2] == ["images.parquet#0", "images.parquet#1"]
    structs = tmp_path / "structs.parquet"  # Hugging Face's image feature: {bytes, path}
    relative = [f.relative_to(image_folder).as_posix() for f in files]
    cells = [{"bytes": f.read_bytes(), "path": r} for f, r in zip(files, relative, strict=True)]
    pq.write_table(pa.table({"image": cells}), structs)
    from_structs = predict_all(structs, predictor, tmp_path / "structs")
    assert from_structs.column("source").to_pylist() == relative
    for other in (tarred, from_parquet, from_structs):
        for name in ("scores", "poses", "ood_score", "predicted_class", "inverted"):
            assert other.column(name).equals(folder.column(name)), name  # bit for bit
    assert tarred.column("label").equals(folder.column("label"))
    assert from_parquet.column("label").to_pylist() == [f.parent.name for f in files]


def test_idx_and_parquet_pixels_agree(idx_file: Path, predictor: Predictor, tmp_path: Path, digits: tuple) -> None:
    images, labels = digits
    idx = predict_all(idx_file, predictor, tmp_path / "idx")
    assert idx.column("label").to_pylist() == [str(v) for v in labels]
    assert idx.column("source").to_pylist()[3] == "t10k-images-idx3-ubyte#3"
    parquet = tmp_path / "pixels.parquet"
    pq.write_table(pa.table({"pixels": [im.reshape(-1).tolist() for im in images]}), parquet)
    rows = open_source(parquet, image_column="pixels")
    out = tmp_path / "pq"
    run_job(rows, predictor, JobConfig(out=out, progress=False), {"path": "pixels"})
    from_parquet = pq.read_table(out)
    for name in ("scores", "poses", "ood_score", "ink"):
        assert from_parquet.column(name).equals(idx.column(name)), name
    # an IDX image is the service's JSON `array`: pixel / 255, no normalization
    expected = predictor.infer((images[:, None] / 255.0).astype(np.float32))
    assert np.array_equal(np.stack(idx.column("scores").to_numpy(zero_copy_only=False)), expected["lengths"])


def test_a_lone_image_gets_the_batched_bits(image_folder: Path, predictor: Predictor) -> None:
    items = list(open_source(image_folder).items())[:3]
    alone = predictor.predict(items[:1]).column("pose").to_pylist()[0]
    batched = predictor.predict(items).column("pose").to_pylist()[0]
    assert alone == batched


def test_a_model_limited_to_one_image_per_run(idx_file: Path) -> None:
    if not (EM / "model.json").is_file():
        pytest.skip("the bundled EM model is absent")
    em = Predictor(EM, PredictOptions(batch_size=64, threads=2, parallel_runs=2))
    assert em.run_batch == 1
    items = list(open_source(idx_file).items())[:4]
    batch = em.predict(items)
    session = em.sessions.get()
    one = session.run(None, {"image": (items[2].pixels[None, None] / 255.0).astype(np.float32)})
    assert batch.column("scores").to_pylist()[2] == one[0][0].tolist()
    assert batch.column("pose").null_count == 0 and len(batch.column("pose").to_pylist()[0]) == 16


@pytest.fixture
def broken_folder(tmp_path: Path, digits: tuple) -> Path:
    root = tmp_path / "broken"
    root.mkdir()
    (root / "a.png").write_bytes(png(digits[0][0]))
    (root / "b.png").write_bytes(png(digits[0][1])[:60])  # truncated
    (root / "c.png").write_bytes(b"")
    (root / "d.png").write_bytes(png(digits[0][2]))
    return root


def test_unreadable_images_become_error_rows(broken_folder: Path, predictor: Predictor, tmp_path: Path) -> None:
    rows = predict_all(broken_folder, predictor, tmp_path / "out").to_pylist()
    assert [r["error"] for r in rows] == [
        None,
        "image is truncated or corrupt: image file is truncated",
        "image is empty (0 bytes)",
        None,
    ]
    assert rows[1]["predicted_class"] is None and rows[1]["pose"] is None and rows[1]["ood_score"] is None
    assert (
        rows[3]["pose"] == predictor.predict(list(open_source(broken_folder).items())[3:]).column("pose").to_pylist()[0]
    )


def test_fail_fast_stops_at_the_first_unreadable_image(
    broken_folder: Path, predictor: Predictor, tmp_path: Path
) -> None:
    with pytest.raises(JobError, match=r"^b\.png: image is truncated or corrupt"):
        predict_all(broken_folder, predictor, tmp_path / "out", fail_fast=True)
    assert not list((tmp_path / "out").glob("part-*.parquet"))


def test_resume_skips_finished_shards(
    idx_file: Path, predictor: Predictor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = predict_all(idx_file, predictor, tmp_path / "whole", shard_size=5)
    out = tmp_path / "resumed"
    real = job_module.write_shard
    calls = []

    def interrupted(path: Path, *args: object) -> tuple[int, int]:
        calls.append(path.name)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(path, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(job_module, "write_shard", interrupted)
    with pytest.raises(KeyboardInterrupt):
        predict_all(idx_file, predictor, out, shard_size=5)
    first = (out / "part-00000.parquet").stat().st_mtime_ns
    assert not (out / "part-00001.parquet").exists()
    monkeypatch.setattr(job_module, "write_shard", real)
    result = run_job(
        open_source(idx_file), predictor, JobConfig(out=out, shard_size=5, progress=False), {"path": str(idx_file)}
    )
    assert (
        result.skipped_shards == 1
        and result.rows == 7
        and [p.name for p in result.shards] == ["part-00001.parquet", "part-00002.parquet"]
    )
    assert (out / "part-00000.parquet").stat().st_mtime_ns == first
    assert pq.read_table(out).equals(whole)


def test_an_output_of_another_job_is_refused(idx_file: Path, predictor: Predictor, tmp_path: Path) -> None:
    out = tmp_path / "out"
    predict_all(idx_file, predictor, out, shard_size=5)
    with pytest.raises(JobError, match=r"differs in shard_size\); choose another --out or pass --overwrite"):
        predict_all(idx_file, predictor, out, shard_size=4)
    assert len(predict_all(idx_file, predictor, out, shard_size=4, overwrite=True)) == 12
    assert len(list(out.glob("part-*.parquet"))) == 3
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(JobError, match=r"is not empty and holds no _job\.json"):
        predict_all(idx_file, predictor, tmp_path / "full")


def test_cli_writes_shards_and_reports(
    idx_file: Path, dynamic_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = [str(idx_file), "--model", str(dynamic_model), "--out", str(out), "--shard-size", "8", "--threads", "1"]
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "wrote 12 rows (0 errors) in 2 shards" in captured.out
    assert "img/s" not in captured.err  # no progress bar off a terminal
    assert main(args) == 0
    assert "wrote 0 rows (0 errors) in 0 shards" in capsys.readouterr().out


def test_cli_errors_are_one_line(tmp_path: Path, dynamic_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nothing"), "--model", str(dynamic_model), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == f"capsnet-predict: error: input {tmp_path / 'nothing'} does not exist"
    bogus = tmp_path / "bogus.idx"
    bogus.write_bytes(b"\x00\x00\x08\x01" + b"\x00" * 8)
    assert main([str(bogus), "--model", str(dynamic_model), "--out", str(tmp_path / "o")]) == 2
    assert "is not an IDX file of images (magic 0x803 expected, found 0x801)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main([str(bogus), "--out", str(tmp_path / "o"), "--batch-size", "0"])
    assert exit_info.value.code == 2
    assert "--batch-size must be at least 1, got 0" in capsys.readouterr().err
    with pytest.raises(SourceError, match="has no column 'image'"):
        pq.write_table(pa.table({"x": [1]}), tmp_path / "x.parquet")
        open_source(tmp_path / "x.parquet")


NO_TORCH = """
import sys
sys.modules["torch"] = None  # any import of torch fails
from training.predict.main import main
code = main(sys.argv[1:])
leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "model") and sys.modules[m] is not None)
sys.exit(code or (3 if leaked else 0))
"""


def test_runs_without_torch(idx_file: Path, dynamic_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [str(idx_file), "--model", str(dynamic_model), "--out", str(out), "--threads", "1", "--limit", "3"]
    result = subprocess.run(
        [sys.executable, "-c", NO_TORCH, *args], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert pq.read_table(out).num_rows == 3


class CountingSource:
    """200 IDX-like items, counting how many have been read."""

    kind = "counting"

    def __init__(self, pixels: np.ndarray) -> None:
        self.pixels, self.pulled = pixels, 0

    def count(self) -> int:
        return 200

    def items(self, start: int = 0) -> Iterator[Item]:
        for i in range(start, 200):
            self.pulled += 1
            yield Item(f"item#{i}", None, pixels=self.pixels[i % len(self.pixels)])


def test_images_are_read_as_they_are_needed(
    digits: tuple, dynamic_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = CountingSource(digits[0])
    predictor = Predictor(dynamic_model, PredictOptions(batch_size=4, threads=1))
    ahead = []  # images read but not yet written, at each write
    written = [0]
    real = pq.ParquetWriter.write_batch

    def write_batch(writer: pq.ParquetWriter, batch: pa.RecordBatch, *args: Any, **kwargs: Any) -> None:
        ahead.append(source.pulled - written[0])
        written[0] += batch.num_rows
        real(writer, batch, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_batch", write_batch)
    run_job(source, predictor, JobConfig(out=tmp_path / "out", shard_size=150, workers=1, progress=False), {})
    # at most (workers + runs + 1) batches of 4 are read ahead of the one being written, never a whole shard
    assert written[0] == 200 and max(ahead) <= 4 * 4
    assert pq.read_table(tmp_path / "out" / "part-00001.parquet").num_rows == 50


def test_progress_shows_count_rate_and_time_left(
    idx_file: Path, predictor: Predictor, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = JobConfig(out=tmp_path / "out", progress=True)
    run_job(open_source(idx_file), predictor, config, {"path": str(idx_file)})
    bar = capsys.readouterr().err.split("\r")[-1]
    assert "12/12" in bar and "img/s" in bar and "<00:00" in bar


def test_engine_ray_without_ray_says_how_to_install_it(
    idx_file: Path,
    dynamic_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if it were not installed
    args = [str(idx_file), "--model", str(dynamic_model), "--out", str(tmp_path / "out"), "--engine", "ray"]
    assert main(args) == 2
    assert capsys.readouterr().err.strip() == (
        "capsnet-predict: error: --engine ray needs Ray: pip install -e '.[ray]' (from a clone) or "
        "pip install 'capsnet-serve[ray]'"
    )


def test_without_pyarrow_capsnet_predict_says_how_to_install_it() -> None:
    from tests.training.test_entry import run_blocked

    result = run_blocked("predict", "capsnet-predict", {"pyarrow"}, ["--help"])
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "capsnet-predict: error: needs the batch extra (no module named 'pyarrow'): pip install -e '.[batch]' "
        "(from a clone) or pip install 'capsnet-serve[batch]'"
    )
    assert run_blocked("predict", "capsnet-predict", {"torch", "ray"}, ["--help"]).returncode == 0
