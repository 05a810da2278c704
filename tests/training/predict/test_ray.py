"""capsnet-predict --engine ray on a local Ray instance: the Ray Data pipeline writes the single-machine job's rows."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from service.runtime.model_dir import load_model_dir
from training.predict.job import JobConfig, run_job
from training.predict.main import main
from training.predict.predictor import PredictOptions, Predictor
from training.predict.sources import SourceError, open_source

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]'): the Ray engine is untested")

pytestmark = pytest.mark.slow
OPTIONS = PredictOptions(batch_size=4, threads=1, all_poses=True)


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def local_rows(path: Path, model: Path, out: Path) -> pa.Table:
    run_job(open_source(path), Predictor(model, OPTIONS), JobConfig(out=out, progress=False), {"path": str(path)})
    return pq.read_table(out)


def by_source(table: pa.Table) -> pa.Table:
    return table.replace_schema_metadata(None).sort_by("source")


@pytest.mark.parametrize("kind", ["folder", "idx", "tar"])
def test_ray_writes_the_local_job_s_rows(
    kind: str, local_ray: None, dynamic_model: Path, image_folder: Path, idx_file: Path, tar_file: Path, tmp_path: Path
) -> None:
    from training.predict.ray_job import run_ray_job

    path = {"folder": image_folder, "idx": idx_file, "tar": tar_file}[kind]
    expected = local_rows(path, dynamic_model, tmp_path / "local")
    rows = run_ray_job(path, load_model_dir(dynamic_model), OPTIONS, tmp_path / "ray", actors=2)
    assert rows == expected.num_rows
    written = pq.read_table(tmp_path / "ray")
    assert written.schema.names == expected.schema.names
    assert by_source(written).equals(by_source(expected))


def test_ray_refuses_a_non_empty_output(local_ray: None, dynamic_model: Path, idx_file: Path, tmp_path: Path) -> None:
    from training.predict.ray_job import run_ray_job

    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(SourceError, match="is not empty; choose another --out or pass --overwrite"):
        run_ray_job(idx_file, load_model_dir(dynamic_model), OPTIONS, out)
    assert (out / "mine.txt").read_text() == "keep"


def test_cli_engine_ray(
    local_ray: None, dynamic_model: Path, idx_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = [str(idx_file), "--model", str(dynamic_model), "--out", str(out), "--engine", "ray", "--limit", "5"]
    assert main(args) == 0
    assert f"wrote 5 rows to {out} with Ray Data" in capsys.readouterr().out
    assert pq.read_table(out).column("source").to_pylist() == [f"t10k-images-idx3-ubyte#{i}" for i in range(5)]
