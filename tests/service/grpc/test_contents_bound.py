"""A gRPC tensor's typed contents are counted before they are copied out of the message: a 10 MB message of floats
would otherwise hold the GIL (and so the HTTP event loop) while it is converted."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.service.grpc.test_grpc import grpc_app, stub, typed_request


def test_more_typed_values_than_the_image_limit_allows_are_refused(model_repository: Path) -> None:
    request = typed_request(np.zeros((1, 1, 28, 28), np.float32))
    request.inputs[0].contents.fp32_contents.extend([0.0] * 2 * 784)  # 3 images' worth, the limit is 2
    with grpc_app(model_repository, max_images_per_request=2) as target:
        with pytest.raises(grpc.RpcError) as e:
            stub(target).ModelInfer(request)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert e.value.details() == (
            "input 'image' has 2352 values, more than the most a request may need, 1568 "
            "(CAPSNET_MAX_IMAGES_PER_REQUEST)"
        )
        assert stub(target).ModelInfer(typed_request(np.zeros((2, 1, 28, 28), np.float32))).outputs
