"""``max_concurrency`` bounds each user stage, for every kind of API (issue 14): a batched Model class with
``max_concurrency: 1`` never runs two ``preprocess`` (nor two ``postprocess``) calls at once, through a real
server under 32 concurrent requests, while its requests still share batched ``predict`` calls."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.conftest import write_project

MODEL = """
import threading
import time

lock = threading.Lock()
active = {"preprocess": 0, "predict": 0, "postprocess": 0}
most = {"preprocess": 0, "predict": 0, "postprocess": 0}


def enter(stage):
    with lock:
        active[stage] += 1
        most[stage] = max(most[stage], active[stage])


def leave(stage):
    with lock:
        active[stage] -= 1


class Model:
    def preprocess(self, inputs):
        enter("preprocess")
        time.sleep(0.002)
        leave("preprocess")
        return inputs["x"]

    def predict(self, xs):
        enter("predict")
        time.sleep(0.03)
        leave("predict")
        return [{"double": x * 2, "batch": len(xs)} for x in xs]

    def postprocess(self, output):
        enter("postprocess")
        time.sleep(0.002)
        leave("postprocess")
        with lock:
            output["most"] = dict(most)
        return output
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> Any:
    root = write_project(
        tmp_path_factory.mktemp("max_concurrency"),
        {
            "model.py": MODEL,
            "modelserve.yaml": """
                apis:
                  - name: batched
                    handler: {path: model.py}
                    max_concurrency: 1
                    max_queue_length: 100
                    batching: {max_batch_size: 8}
            """,
        },
    )
    server = start_server_module(root)
    server.wait_ready()
    return server


async def post_many(url: str, values: list[int]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=len(values))) as client:
        return await asyncio.gather(*(client.post(url, json={"x": value}) for value in values))


def test_a_batched_model_class_with_max_concurrency_1_never_overlaps_a_stage(server: Any) -> None:
    answers = asyncio.run(post_many(server.url + "/batched", list(range(32))))
    assert [answer.status_code for answer in answers] == [200] * 32, [a.text for a in answers if a.status_code != 200]
    bodies = [answer.json() for answer in answers]
    assert [body["double"] for body in bodies] == [x * 2 for x in range(32)]
    assert max(body["batch"] for body in bodies) > 1, "the requests never shared a batch: nothing was shown"
    # one more request reads what the 32 left behind
    most = httpx.post(server.url + "/batched", json={"x": 0}).json()["most"]
    assert most == {"preprocess": 1, "predict": 1, "postprocess": 1}
