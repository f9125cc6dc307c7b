"""One batch holds requests from both transports: a batched Model class served over HTTP (V2 REST) and gRPC at
once. Its batches form only when full (``max_batch_size: 4`` with a wait far longer than the test), so two HTTP
and two gRPC requests sent together can only be answered by one batch of four; the model answers each request
with the tags of every request in its batch, and the batch-size metric counts that one batch."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import write_project
from tests.grpc.test_grpc import served

aioclient = pytest.importorskip("tritonclient.grpc.aio")

PROJECT = """
apis:
  - name: mixed
    handler: {path: model.py, class: Tags}
    batching: {max_batch_size: 4, max_wait_ms: 600000}  # a batch runs when full; the clients give up after 60 s
"""

MODEL = """
import numpy as np


class Tags:
    v2_inputs = [{"name": "tag", "datatype": "INT32", "shape": [1]}]
    v2_outputs = [{"name": "batch", "datatype": "INT32", "shape": [-1]}]

    def preprocess(self, inputs):
        return int(inputs["tag"][0])

    def predict(self, tags):
        together = np.array(sorted(tags), dtype=np.int32)
        return [{"batch": together} for _ in tags]
"""

#: The tags of the requests: HTTP ones below 100, gRPC ones from 100.
HTTP_TAGS, GRPC_TAGS = [1, 2], [101, 102]


@pytest.fixture
def urls(tmp_path: Path) -> Iterator[tuple[str, str]]:
    root = write_project(tmp_path, {"modelserve.yaml": PROJECT, "model.py": MODEL})
    with served(root) as urls:
        yield urls


async def _both(url: str, address: str) -> tuple[list[list[int]], list[list[int]]]:
    grpc_client = aioclient.InferenceServerClient(address)

    async def over_grpc(tag: int) -> list[int]:
        tensor = aioclient.InferInput("tag", [1], "INT32")
        tensor.set_data_from_numpy(np.array([tag], np.int32))
        return [int(v) for v in (await grpc_client.infer("mixed", [tensor], client_timeout=60)).as_numpy("batch")]

    async def over_http(client: httpx.AsyncClient, tag: int) -> list[int]:
        body = {"inputs": [{"name": "tag", "datatype": "INT32", "shape": [1], "data": [tag]}]}
        answer = await client.post(f"{url}/v2/models/mixed/infer", json=body)
        assert answer.status_code == 200, answer.text
        return [int(v) for v in answer.json()["outputs"][0]["data"]]

    async with httpx.AsyncClient(timeout=60) as http_client:
        answers: list[Any] = await asyncio.gather(
            *(over_http(http_client, tag) for tag in HTTP_TAGS), *(over_grpc(tag) for tag in GRPC_TAGS)
        )
    await grpc_client.close()
    return answers[: len(HTTP_TAGS)], answers[len(HTTP_TAGS) :]


def test_one_batch_holds_requests_from_both_transports(urls: tuple[str, str]) -> None:
    url, address = urls
    over_http, over_grpc = asyncio.run(_both(url, address))
    every = sorted(HTTP_TAGS + GRPC_TAGS)
    assert over_http == [every, every] and over_grpc == [every, every]
    metrics = httpx.get(f"{url}/metrics").text
    count = re.search(r'^modelserve_batch_size_count\{api="mixed"\} (\S+)$', metrics, re.M)
    total = re.search(r'^modelserve_batch_size_sum\{api="mixed"\} (\S+)$', metrics, re.M)
    assert count is not None and total is not None, metrics
    assert (float(count[1]), float(total[1])) == (1.0, 4.0)
