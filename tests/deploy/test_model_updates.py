"""Models on a PersistentVolumeClaim are updated without restarting pods: the component turns polling on."""

from __future__ import annotations

from tests.deploy.manifests import render


def test_the_model_claim_component_polls_the_repository() -> None:
    (config,) = [o for o in render("cpu", ("model-repository-pvc",)) if o["kind"] == "ConfigMap"]
    data = config["data"]
    assert (data["CAPSNET_MODEL_REPOSITORY"], data["CAPSNET_MODEL_CONTROL"], data["CAPSNET_POLL_SECONDS"]) == (
        "/models",
        "poll",
        "30",
    )
    (plain,) = [o for o in render("cpu") if o["kind"] == "ConfigMap"]
    assert "CAPSNET_MODEL_CONTROL" not in plain["data"]  # the image's own models: loaded once (none)
