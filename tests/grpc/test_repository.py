"""The repository over gRPC (model control explicit): index, load and unload through tritonclient.grpc, the
health service following, and calls in flight while a new version replaces the old one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.grpc.test_grpc import served
from tests.http.test_repository import plus_onnx, versioned_project

grpc = pytest.importorskip("grpc")
grpcclient = pytest.importorskip("tritonclient.grpc")
aioclient = pytest.importorskip("tritonclient.grpc.aio")
health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
health_pb2_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException


@pytest.fixture
def explicit(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    root = versioned_project(tmp_path)
    with served(root, load=["latest"]) as (_, address):
        yield address, root


def health(address: str, service: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return int(health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service)).status)


def test_index_load_and_unload(explicit: tuple[str, Path]) -> None:
    address, _ = explicit
    client = grpcclient.InferenceServerClient(address)
    index = {(m.name, m.version): m.state for m in client.get_model_repository_index().models}
    assert index[("latest", "3")] == "READY" and index[("every", "2")] == "UNAVAILABLE"
    assert health(address, "every") == health_pb2.HealthCheckResponse.NOT_SERVING
    client.load_model("every")
    assert client.is_model_ready("every", "2") and health(address, "every") == health_pb2.HealthCheckResponse.SERVING
    client.unload_model("every")
    assert not client.is_model_ready("every") and health(address, "every") == health_pb2.HealthCheckResponse.NOT_SERVING
    with pytest.raises(InferenceServerException) as error:
        client.load_model("wrong_model_name")
    assert "failed to load" in error.value.message() and error.value.status() == "StatusCode.INVALID_ARGUMENT"
    client.close()


def test_calls_in_flight_while_a_new_version_replaces_the_old(explicit: tuple[str, Path]) -> None:
    """200 calls at a time keep coming while version 4 loads and version 3 is retired: every one is answered,
    by one version or the other, and the calls after the load by version 4."""
    address, root = explicit
    plus_onnx(root / "models" / "plus" / "4" / "model.onnx", 4.0)

    async def run() -> tuple[list[float], list[float]]:
        client = aioclient.InferenceServerClient(address)
        x = aioclient.InferInput("x", [1], "FP32")
        x.set_data_from_numpy(np.array([10], np.float32))

        async def one() -> float:
            return float((await client.infer("latest", [x])).as_numpy("y")[0])

        load = asyncio.ensure_future(client.load_model("latest"))
        during: list[float] = []
        while not load.done():
            during += await asyncio.gather(*(one() for _ in range(200)))
        await load
        after = list(await asyncio.gather(*(one() for _ in range(200))))
        await client.close()
        return during, after

    during, after = asyncio.run(run())
    assert during and set(during) <= {13.0, 14.0}
    assert set(after) == {14.0}
