"""GET /v1/models and /v1/models/{name} never hand a client the absolute paths of the machine that made a card."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.service.conftest import TINY

MACHINE_PATHS = ("/home/alice/runs/capsnet/last.pt", "/srv/data/mnist")


def test_the_card_is_served_without_absolute_paths(tmp_path: Path, model_repository: Path, make_client) -> None:
    shutil.copytree(model_repository / TINY, tmp_path / TINY)
    card_path = tmp_path / TINY / "model.json"
    card = json.loads(card_path.read_text())
    card["training"] = {
        "command": f"capsnet-train --data-dir {MACHINE_PATHS[1]} --resume {MACHINE_PATHS[0]} --out={tmp_path}/runs/x",
        "init_from": {"path": str(tmp_path / "zoo" / "capsnet-mnist"), "name": "capsnet-mnist"},
    }
    card_path.write_text(json.dumps(card))
    client = make_client(tmp_path)
    text = client.get(f"/v1/models/{TINY}").text
    for path in (*MACHINE_PATHS, str(tmp_path)):
        assert path not in text
    served = client.get(f"/v1/models/{TINY}").json()["card"]["training"]
    assert served["command"] == ("capsnet-train --data-dir …/data/mnist --resume …/capsnet/last.pt --out=…/runs/x")
    assert served["init_from"]["path"] == "…/zoo/capsnet-mnist"
    assert client.get(f"/v1/models/{TINY}").json()["card"]["input"]["normalization"] == card["input"]["normalization"]


def test_load_errors_name_no_absolute_path(broken_repository: Path, make_client) -> None:
    listing = make_client(broken_repository).get("/v1/models").text
    assert 'ready":false' in listing.replace(" ", "")
    assert str(broken_repository) not in listing
