"""Async jobs run through `Api.call`, like realtime requests: one timeout and one cancellation, both ways.

Through a real server: a job past its API's ``timeout`` and a job cancelled by ``DELETE`` end the way a
realtime request past its timeout or whose client left does (the same log lines, the same
``modelserve_requests_cancelled_total`` reasons), and a sync handler whose job was deleted keeps its
concurrency slot until it returns. (The job documents themselves are covered for every store in
tests/jobs/test_routes.py.)
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import write_project

HANDLERS = """
import asyncio
import time
from pathlib import Path


def mark(*words):
    with Path("marks.log").open("a") as log:
        log.write(" ".join(str(word) for word in words) + "\\n")


class Sleeper:
    async def handle_async(self, payload, request_id):
        try:
            await asyncio.sleep(payload.get("sleep", 0))
        except asyncio.CancelledError:
            mark(request_id, "cancelled")
            raise
        return {"slept": payload.get("sleep", 0)}


class SyncSleeper:
    def handle_async(self, payload, request_id):
        mark(request_id, "start", time.time())
        time.sleep(payload.get("sleep", 0))
        while "gate" in payload and not Path(payload["gate"]).exists():  # runs until the test makes it
            time.sleep(0.01)
        mark(request_id, "end", time.time())
        return {"slept": payload.get("sleep", 0)}


class RealtimeSleeper:
    async def predict(self, inputs):
        await asyncio.sleep(inputs.get("sleep", 0))
        return {"slept": inputs.get("sleep", 0)}
"""

CONFIG = """
apis:
  - name: limited
    kind: async
    handler: {path: handlers.py, class: Sleeper}
    timeout: 0.3
  - name: deletable
    kind: async
    handler: {path: handlers.py, class: Sleeper}
    timeout: 30
  - name: sync
    kind: async
    handler: {path: handlers.py, class: SyncSleeper}
    max_concurrency: 1
  - name: realtime
    handler: {path: handlers.py, class: RealtimeSleeper}
    timeout: 0.3
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> tuple[Any, Path]:
    root = write_project(tmp_path_factory.mktemp("jobs_call"), {"handlers.py": HANDLERS, "modelserve.yaml": CONFIG})
    server = start_server_module(root, "--jobs-store", "memory")
    server.wait_ready()
    return server, root


def marks(root: Path) -> list[list[str]]:
    path = root / "marks.log"
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def cancelled_total(url: str, api: str, reason: str) -> float:
    match = re.search(
        rf'^modelserve_requests_cancelled_total\{{api="{api}",reason="{reason}"\}} (\S+)$',
        httpx.get(url + "/metrics").text,
        re.MULTILINE,
    )
    return float(match.group(1)) if match else 0.0


def wait_status(url: str, api: str, job_id: str, statuses: set[str], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = httpx.get(f"{url}/{api}/{job_id}").json()
        if body["status"] in statuses:
            return body
        assert time.monotonic() < deadline, f"job {job_id} still {body['status']} after {timeout} s"
        time.sleep(0.02)


def wait_log(server: Any, text: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while text not in server.log:
        assert time.monotonic() < deadline, f"{text!r} never logged:\n{server.log}"
        time.sleep(0.02)
    return server.log


def test_a_timeout_is_the_same_for_a_job_and_a_realtime_request(served: tuple[Any, Path]) -> None:
    server, root = served
    before = {api: cancelled_total(server.url, api, "timeout") for api in ("limited", "realtime")}

    job_id = httpx.post(server.url + "/limited", json={"sleep": 10}).json()["id"]
    failed = wait_status(server.url, "limited", job_id, {"failed", "completed", "cancelled"})
    assert failed["status"] == "failed"
    assert failed["error"] == "the call took longer than the timeout of 0.3 s"
    assert [job_id, "cancelled"] in marks(root)  # the handler was cancelled, not left running
    wait_log(server, f"request timed out after 0.3 s (504) [api=limited request_id={job_id}]")

    answer = httpx.post(server.url + "/realtime", json={"sleep": 10}, headers={"x-request-id": "rt-timeout"})
    assert answer.status_code == 504
    assert answer.json() == {"error": "the call took longer than the timeout of 0.3 s", "request_id": "rt-timeout"}
    wait_log(server, "request timed out after 0.3 s (504) [api=realtime request_id=rt-timeout]")

    assert cancelled_total(server.url, "limited", "timeout") == before["limited"] + 1
    assert cancelled_total(server.url, "realtime", "timeout") == before["realtime"] + 1


def delete_a_running_job(server: Any) -> str:
    # On an API whose timeout is far off: on `limited` (0.3 s), the job timed out first whenever a busy machine
    # took that long to show it in progress and delete it.
    job_id: str = httpx.post(server.url + "/deletable", json={"sleep": 60}).json()["id"]
    wait_status(server.url, "deletable", job_id, {"in_progress"})
    deleted = httpx.delete(f"{server.url}/deletable/{job_id}")
    assert deleted.status_code == 200 and deleted.json()["status"] == "cancelled"
    return job_id


def cancellations(url: str) -> dict[str, float]:
    return {reason: cancelled_total(url, "deletable", reason) for reason in ("cancelled", "disconnect", "timeout")}


def test_a_delete_cancels_a_running_job_through_the_call(served: tuple[Any, Path]) -> None:
    server, root = served
    before = cancellations(server.url)
    job_id = delete_a_running_job(server)
    wait_log(server, f"request cancelled (499) [api=deletable request_id={job_id}]")
    assert [job_id, "cancelled"] in marks(root)  # the handler was cancelled at once, as on a disconnect
    after = cancellations(server.url)
    assert after["timeout"] == before["timeout"]  # a DELETE is no timeout
    assert sum(after.values()) == sum(before.values()) + 1  # counted once
    final = httpx.get(f"{server.url}/deletable/{job_id}").json()
    assert final["status"] == "cancelled" and "result" not in final


def test_a_delete_is_counted_and_logged_as_a_cancellation(served: tuple[Any, Path]) -> None:
    server, _ = served
    before = cancellations(server.url)
    job_id = delete_a_running_job(server)
    wait_log(server, f"request cancelled (499) [api=deletable request_id={job_id}]")
    assert f"job cancelled by a DELETE; request cancelled (499) [api=deletable request_id={job_id}]" in server.log
    after = cancellations(server.url)
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["disconnect"] == before["disconnect"]


def test_a_deleted_sync_job_keeps_its_slot_until_the_handler_returns(served: tuple[Any, Path], tmp_path: Path) -> None:
    server, root = served
    gate = tmp_path / "gate"  # the first handler runs until then (a 0.8 s sleep could end before the DELETE)
    first = httpx.post(server.url + "/sync", json={"gate": str(gate)}).json()["id"]
    wait_status(server.url, "sync", first, {"in_progress"})
    assert httpx.delete(f"{server.url}/sync/{first}").json()["status"] == "cancelled"
    second = httpx.post(server.url + "/sync", json={"sleep": 0}).json()["id"]
    assert httpx.get(f"{server.url}/sync/{second}").json()["status"] == "in_queue"
    gate.touch()
    assert wait_status(server.url, "sync", second, {"completed"})["result"] == {"slept": 0}
    times = {(run[0], run[1]): float(run[2]) for run in marks(root) if run[0] in (first, second)}
    # max_concurrency 1: the second job started only once the deleted one's handler had returned
    assert times[(second, "start")] >= times[(first, "end")]
    assert httpx.get(f"{server.url}/sync/{first}").json()["status"] == "cancelled"
