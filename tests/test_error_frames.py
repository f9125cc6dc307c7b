"""Error paths keep no large frames alive (`modelserve._frames`), through a real server.

Every API of the project below fails with a large array in a local of the failing frame, and puts an object
that holds it in a module-level `weakref.WeakSet`. After failing requests (sync, async, batched, a sync
stream, a job), the same API reports how many of those objects are still alive, without collecting: none.
Before the frames were cleared once logged, every one stayed alive (in a reference cycle through the
traceback) until the collector ran, which a served process does rarely.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.conftest import write_project

MODEL = """
import asyncio
import weakref

import numpy as np

#: The objects the failing frames held; the count is read without collecting (gc.collect would hide a cycle).
LIVE = weakref.WeakSet()


class Held:
    pass


def hold():
    held = Held()
    held.array = np.ones(1_000_000)  # 8 MB
    LIVE.add(held)
    return held


def live():
    return {"live": len(LIVE)}


class SyncModel:
    def predict(self, inputs):
        if inputs.get("count"):
            return live()
        held = hold()
        raise ValueError(f"failing with {held.array.nbytes} bytes in a local")


class AsyncModel:
    async def predict(self, inputs):
        if inputs.get("count"):
            return live()
        held = hold()
        await asyncio.sleep(0)
        raise ValueError(f"failing with {held.array.nbytes} bytes in a local")


class BatchedModel:
    def predict(self, batch):
        if any(item.get("count") for item in batch):
            return [live() for _ in batch]
        held = hold()
        raise ValueError(f"failing with {held.array.nbytes} bytes in a local")


class StreamModel:
    def predict(self, inputs):
        if inputs.get("count"):
            return live()
        return self.chunks()

    def chunks(self):
        held = hold()
        yield "first "
        raise ValueError(f"failing with {held.array.nbytes} bytes in a local")


class JobHandler:
    def handle_async(self, payload, request_id):
        return SyncModel().predict(payload)
"""

CONFIG = """
apis:
  - name: sync
    handler: {path: model.py, class: SyncModel}
  - name: async
    handler: {path: model.py, class: AsyncModel}
  - name: batched
    handler: {path: model.py, class: BatchedModel}
    batching: {max_batch_size: 4}
  - name: stream
    handler: {path: model.py, class: StreamModel}
  - name: jobs
    kind: async
    handler: {path: model.py, class: JobHandler}
"""

FAILURES = 5


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> Any:
    root = write_project(tmp_path_factory.mktemp("frames"), {"model.py": MODEL, "modelserve.yaml": CONFIG})
    server = start_server_module(root, "--jobs-store", "memory")
    server.wait_ready()
    return server


def live_count(server: Any, api: str) -> int:
    """What the API's own model reports (the project's model file may be loaded once per API)."""
    answer = httpx.post(f"{server.url}/{api}", json={"count": True}, timeout=30)
    assert answer.status_code == 200, answer.text
    count: int = answer.json()["live"]
    return count


@pytest.mark.slow
@pytest.mark.parametrize("api", ["sync", "async", "batched"])
def test_a_failed_call_keeps_nothing_of_its_frames(server: Any, api: str) -> None:
    for _ in range(FAILURES):
        answer = httpx.post(f"{server.url}/{api}", json={"x": 1}, timeout=30)
        assert answer.status_code == 500
    assert live_count(server, api) == 0
    assert server.log.count("failing with 8000000 bytes in a local") >= FAILURES  # each one was logged first


@pytest.mark.slow
def test_a_stream_failing_in_the_middle_keeps_nothing_of_its_frames(server: Any) -> None:
    for _ in range(FAILURES):
        answer = httpx.post(f"{server.url}/stream", json={"x": 1}, headers={"accept": "text/event-stream"})
        assert "event: error" in answer.text
    assert live_count(server, "stream") == 0


@pytest.mark.slow
def test_a_failed_job_keeps_nothing_of_its_frames(server: Any) -> None:
    ids = [httpx.post(f"{server.url}/jobs", json={"x": 1}).json()["id"] for _ in range(FAILURES)]
    deadline = time.monotonic() + 30
    for job_id in ids:
        while (status := httpx.get(f"{server.url}/jobs/{job_id}").json()["status"]) != "failed":
            assert status in ("in_queue", "in_progress"), status
            assert time.monotonic() < deadline, f"job {job_id} still {status}"
            time.sleep(0.02)
    # The job table keeps the failure's words, not the exception: the count is read by a job too.
    counting = httpx.post(f"{server.url}/jobs", json={"count": True}).json()["id"]
    while (job := httpx.get(f"{server.url}/jobs/{counting}").json())["status"] != "completed":
        assert job["status"] in ("in_queue", "in_progress"), job
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert job["result"] == {"live": 0}
