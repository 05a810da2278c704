"""gRPC load for the service benchmark: `concurrency` calls kept in flight over one channel, raw tensor bytes.

Requests are serialized once and responses left unparsed, so the client spends as little of the shared CPU
as it can (like perf_analyzer, which measures the server, not protobuf in Python). One call at a time is made
with the blocking client (perf_analyzer's synchronous mode): grpcio's asyncio client adds about a tenth of a
millisecond of its own to every call, which concurrency 1 would count as the server's latency; more calls in
flight need the asyncio client.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np

from service.contract import ModelCard
from service.grpc import protocol

OK, FAILED = 200, 500  # statuses recorded per call, as the HTTP load records them


def infer_message(card: ModelCard) -> bytes:
    """A serialized ModelInferRequest for one random image (raw_input_contents; every output)."""
    image = np.random.default_rng(1).random((1, *card.image_shape), dtype=np.float32)
    message = protocol.ModelInferRequest(
        model_name=card.name,
        inputs=[{"name": card.input.name, "datatype": "FP32", "shape": list(image.shape)}],
        raw_input_contents=[image.astype("<f4").tobytes()],
    )
    return bytes(message.SerializeToString())


def check_infer_call(target: str, message: bytes) -> None:
    """One ModelInfer call with `message`: RuntimeError unless it ends OK with every output of the response filled."""
    with grpc.insecure_channel(target) as channel:
        infer = channel.unary_unary(
            protocol.method_path("ModelInfer"), response_deserializer=protocol.ModelInferResponse.FromString
        )
        try:
            response = infer(message, timeout=30)
        except grpc.RpcError as e:
            raise RuntimeError(f"a sample ModelInfer call to {target} failed: {e.code().name}: {e.details()}") from e
    if not response.outputs or len(response.raw_output_contents) != len(response.outputs):
        raise RuntimeError(f"a sample ModelInfer call to {target} returned no outputs")


def grpc_calls(target: str, message: bytes, window: float) -> list[tuple[float, float, int]]:
    """One call at a time on `target` for `window` seconds, with the blocking client; (start, end, status) each."""
    done: list[tuple[float, float, int]] = []
    last = time.perf_counter() + window
    with grpc.insecure_channel(target) as channel:
        infer = channel.unary_unary(protocol.method_path("ModelInfer"))  # bytes in, bytes out
        while time.perf_counter() < last:
            t0 = time.perf_counter()
            try:
                infer(message, timeout=30)
                status = OK
            except grpc.RpcError:
                status = FAILED
            done.append((t0, time.perf_counter(), status))
    return done


async def grpc_window(
    target: str, message: bytes, concurrency: int, ramp: float, window: float
) -> list[tuple[float, float, int]]:
    """Steady load of `concurrency` calls in flight on `target` (host:port); (start, end, status) of the calls
    that ended inside the window, after `ramp` seconds (200 for OK, 500 for any other status)."""
    done: list[tuple[float, float, int]] = []
    start = time.perf_counter()
    first, last = start + ramp, start + ramp + window
    async with grpc.aio.insecure_channel(target) as channel:
        infer = channel.unary_unary(protocol.method_path("ModelInfer"))  # bytes in, bytes out

        async def worker() -> None:
            while time.perf_counter() < last:
                t0 = time.perf_counter()
                try:
                    await infer(message, timeout=30)
                    status = OK
                except grpc.aio.AioRpcError:
                    status = FAILED
                done.append((t0, time.perf_counter(), status))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [d for d in done if first <= d[1] <= last]
