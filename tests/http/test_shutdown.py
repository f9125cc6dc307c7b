"""Shutdown after the grace period: a sync stage still running does not keep the process alive."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import write_project

SLOW_SYNC = """
import time

class Model:
    def predict(self, inputs):
        open("started", "w").close()
        time.sleep(3600)  # only a shutdown that does not wait for it ends the test
        return "late"

class Handler:
    def handle_async(self, payload, request_id):
        with open("runs.log", "a") as log:
            log.write(request_id + "\\n")
        time.sleep(payload["sleep"])
        return {"slept": payload["sleep"]}
"""


def test_a_stuck_sync_stage_does_not_outlive_the_grace_period(tmp_path: Path, start_server: Any) -> None:
    root = write_project(tmp_path, {"model.py": SLOW_SYNC})
    server = start_server(root, "--graceful-timeout", "1")
    server.wait_ready()
    answers: list[Any] = []

    def call() -> None:
        try:
            answers.append(httpx.post(server.url, content=b"x", timeout=60))
        except httpx.HTTPError as exc:
            answers.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    # Stopped once the call runs (a 0.5 s sleep bet on it; a busy machine may not have read the request yet).
    deadline = time.monotonic() + 60  # bounds a failing test; a passing one waits only for the call to start
    while not (root / "started").exists():
        assert time.monotonic() < deadline, server.log
        time.sleep(0.01)
    assert server.stop() == 0
    assert "still running user code after the shutdown; exiting without waiting" in server.log
    caller.join(10)
    (answer,) = answers  # a JSON 503 naming the request, not the server's plain-text 500
    assert isinstance(answer, httpx.Response), answer
    assert answer.status_code == 503
    body = {"error": "the server is shutting down; retry later", "request_id": answer.headers["x-request-id"]}
    assert answer.json() == body
    # One warning line for the stopped request, and no traceback (uvicorn's "Exception in ASGI application").
    assert server.log.count("stopped by the server's shutdown (503)") == 1
    assert "Traceback" not in server.log and "Exception in ASGI application" not in server.log


def test_a_sync_job_interrupted_by_shutdown_runs_again_at_the_next_start(tmp_path: Path, start_server: Any) -> None:
    root = write_project(
        tmp_path,
        {
            "model.py": SLOW_SYNC,
            "modelserve.yaml": """
                apis:
                  - name: slow
                    kind: async
                    handler: {path: model.py}
            """,
        },
    )
    first = start_server(root, "--graceful-timeout", "1")
    first.wait_ready()
    job_id = httpx.post(f"{first.url}/slow", json={"sleep": 3600}).json()["id"]
    deadline = time.monotonic() + 60  # bounds a failing test; a passing one waits only for the job to start
    while not (root / "runs.log").exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert first.stop() == 0
    assert "interrupting them" in first.log
    second = start_server(root)
    second.wait_ready()
    while (root / "runs.log").read_text().split() != [job_id, job_id]:
        assert time.monotonic() < deadline + 20, (root / "runs.log").read_text()
        time.sleep(0.05)
    status = httpx.get(f"{second.url}/slow/{job_id}").json()["status"]
    assert status == "in_progress"
    httpx.delete(f"{second.url}/slow/{job_id}")
