"""ModelStreamInfer of a generating API (its predict yields): one response per chunk, in order, through
tritonclient.grpc's stream (sync, with a callback) and its aio client, against a real server."""

from __future__ import annotations

import asyncio
import queue
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import write_project
from tests.grpc.test_grpc import served

grpcclient = pytest.importorskip("tritonclient.grpc")
aioclient = pytest.importorskip("tritonclient.grpc.aio")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

PROJECT = """
apis:
  - name: count
    handler: {path: model.py, class: Count}
  - name: count_async
    handler: {path: model.py, class: CountAsync}
"""

MODEL = """
import numpy as np


class Count:
    v2_inputs = [{"name": "n", "datatype": "INT32", "shape": [1]}]

    def predict(self, inputs):
        n = int(inputs["n"][0])
        for i in range(abs(n)):
            yield {"i": np.array([i], dtype=np.int32)}
        if n < 0:
            raise RuntimeError("a negative count fails after its chunks")


class CountAsync:
    v2_inputs = [{"name": "n", "datatype": "INT32", "shape": [1]}]

    async def predict(self, inputs):
        for i in range(int(inputs["n"][0])):
            yield {"i": np.array([i], dtype=np.int32)}
"""


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    root = write_project(tmp_path_factory.mktemp("stream"), {"modelserve.yaml": PROJECT, "model.py": MODEL})
    with served(root) as urls:
        yield urls


def count_input(module: Any, n: int) -> list[Any]:
    tensor = module.InferInput("n", [1], "INT32")
    tensor.set_data_from_numpy(np.array([n], np.int32))
    return [tensor]


def test_each_chunk_is_a_response_on_the_sync_clients_stream(urls: tuple[str, str]) -> None:
    _, address = urls
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(address)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer("count", count_input(grpcclient, 3), request_id="first")
    client.async_stream_infer("count", count_input(grpcclient, 2), request_id="second")
    got = [answers.get(timeout=30) for _ in range(5)]
    client.stop_stream()
    client.close()
    assert [error for _, error in got] == [None] * 5
    assert [(r.get_response().id, int(r.as_numpy("i")[0])) for r, _ in got] == [
        ("first", 0),
        ("first", 1),
        ("first", 2),
        ("second", 0),
        ("second", 1),
    ]


def test_an_async_generator_streams_and_a_failure_ends_its_request_only(urls: tuple[str, str]) -> None:
    url, address = urls

    async def run() -> list[tuple[Any, Any]]:
        client = aioclient.InferenceServerClient(address)

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": "count_async", "inputs": count_input(aioclient, 2)}
            yield {"model_name": "count", "inputs": count_input(aioclient, -2)}
            yield {"model_name": "count", "inputs": count_input(aioclient, 1)}

        got = [answer async for answer in client.stream_infer(requests())]  # until the server ends the stream
        await client.close()
        return got

    got = asyncio.run(run())
    assert len(got) == 6
    values = [int(result.as_numpy("i")[0]) if error is None else str(error) for result, error in got]
    assert values[:4] == [0, 1, 0, 1] and values[5] == 0
    assert "user code failed" in str(values[4])  # the 500 of user code, as over HTTP
    metrics = httpx.get(f"{url}/metrics").text
    assert re.search(r'^modelserve_requests_total\{api="count",code="500"\} 1\.0$', metrics, re.M), metrics


def test_model_infer_of_a_generating_api_says_to_stream(urls: tuple[str, str]) -> None:
    _, address = urls
    client = grpcclient.InferenceServerClient(address)
    with pytest.raises(InferenceServerException) as error:
        client.infer("count", count_input(grpcclient, 2))
    client.close()
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "call ModelStreamInfer" in error.value.message()
