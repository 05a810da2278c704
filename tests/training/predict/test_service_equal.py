"""capsnet-predict's rows are the service's answers: the same files posted to the app give the same values."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient

from service.api.routes.inference import rounded
from service.main import create_app
from tests.service.conftest import service_settings, wait_ready
from training.predict.job import JobConfig, run_job
from training.predict.predictor import PredictOptions, Predictor
from training.predict.sources import open_source

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(dynamic_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    repository = tmp_path_factory.mktemp("repository")
    os.symlink(dynamic_model.resolve(), repository / dynamic_model.name)
    app = create_app(service_settings(repository, max_batch_size=16))
    with TestClient(app, raise_server_exceptions=False) as c:
        wait_ready(c)
        yield c


def test_rows_equal_the_service_s_answers_bit_for_bit(
    image_folder: Path, dynamic_model: Path, client: TestClient, tmp_path: Path
) -> None:
    # runs of 4 and 4 and 4 here, one run of 13 in the service: batched runs give the same bits at any size
    predictor = Predictor(dynamic_model, PredictOptions(batch_size=4, threads=1, all_poses=True))
    source = open_source(image_folder)
    run_job(source, predictor, JobConfig(out=tmp_path / "out", progress=False), {"path": "folder"})
    rows = pq.read_table(tmp_path / "out").to_pylist()
    files = [("files", (row["source"], (image_folder / row["source"]).read_bytes())) for row in rows]
    name = dynamic_model.name

    v1 = client.post(f"/v1/models/{name}/capsules?include_input=true", files=files)
    assert v1.status_code == 200, v1.text
    inputs = np.stack([predictor.prepare_one(item)[0] for item in source.items()])
    for row, answer, model_input in zip(rows, v1.json()["capsules"], inputs, strict=True):
        assert answer["preprocessing"]["filename"] == row["source"]
        assert answer["preprocessing"]["input"] == rounded(model_input)
        assert answer["preprocessing"]["inverted"] == row["inverted"]
        assert answer["predicted_class"] == row["predicted_class"] and answer["label"] == row["predicted_label"]
        assert answer["scores"] == rounded(np.float32(row["scores"]))
        assert answer["poses"] == rounded(np.float32(row["poses"]).reshape(10, 16))
        assert answer["predicted_pose"] == rounded(np.float32(row["pose"]))
        assert answer["ood_score"] == round(row["ood_score"], 6)
        assert answer["in_distribution"] == row["in_distribution"]

    # the exact floats: the same model inputs through the Open Inference Protocol, which does not round
    body: dict[str, Any] = {
        "inputs": [
            {
                "name": "image",
                "shape": [len(inputs), 1, 28, 28],
                "datatype": "FP32",
                "data": inputs.reshape(-1).tolist(),
            }
        ],
        "outputs": [{"name": "lengths"}, {"name": "poses"}],
    }
    v2 = client.post(f"/v2/models/{name}/infer", json=body)
    assert v2.status_code == 200, v2.text
    outputs = {o["name"]: np.asarray(o["data"], np.float32) for o in v2.json()["outputs"]}
    assert np.array_equal(outputs["lengths"], np.float32([row["scores"] for row in rows]).reshape(-1))
    assert np.array_equal(outputs["poses"], np.float32([row["poses"] for row in rows]).reshape(-1))


def test_a_predictor_keeps_numpys_blas_on_one_thread_as_the_server_does(dynamic_model: Path) -> None:
    """The "not a digit" network's float32 products sum in another order with two BLAS threads: rows would differ
    from the service's in the score's sixth decimal on a machine with more cores."""
    from threadpoolctl import threadpool_info, threadpool_limits

    with threadpool_limits(limits=2, user_api="blas"):  # restored afterwards, whatever the predictor sets
        Predictor(dynamic_model, PredictOptions(batch_size=4, threads=1))
        blas = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
        assert blas and all(pool["num_threads"] == 1 for pool in blas)
