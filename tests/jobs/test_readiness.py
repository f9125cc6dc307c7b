"""Readiness of a server with async APIs (a real uvicorn, a real redis-server): its APIs load first, then the jobs
service opens its store and starts its workers, and only then is the server ready. Before, ``/readyz`` said 200
as soon as the APIs had loaded, and a submit in between was a 503 ("is loading"): a Redis store that was slow to
answer its first ping (a busy machine) kept that window open long enough for a client, or a Kubernetes probe,
to fall into it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

import modelserve
from tests.conftest import free_port, redis_process, serve_in_thread, write_project

HANDLER = """
class Handler:
    def handle_async(self, payload):
        return {"echo": payload}
"""


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    with redis_process(tmp_path) as started:
        yield started


def test_the_server_is_ready_only_once_its_jobs_store_has_opened(
    tmp_path: Path, redis: tuple[subprocess.Popen[bytes], int]
) -> None:
    process, port = redis
    yaml = (
        f"jobs: {{store: 'redis://127.0.0.1:{port}/0', prefix: {tmp_path.name}}}\n"
        "apis:\n  - {name: jobs, kind: async, handler: {path: handler.py}}\n"
    )
    root = write_project(tmp_path / "project", {"handler.py": HANDLER, "modelserve.yaml": yaml})
    cwd = os.getcwd()
    try:
        app = modelserve.create_app(root)  # checks that the store answers (a ping)
    finally:
        os.chdir(cwd)
    # Paused, redis-server still takes connections (the kernel does) but answers nothing: once the API has
    # loaded, the jobs service's opening of its store waits on its first ping until redis goes on.
    process.send_signal(signal.SIGSTOP)
    try:
        config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning", lifespan="on")
        with (
            serve_in_thread(config) as server,
            httpx.Client(base_url=f"http://127.0.0.1:{server.config.port}") as client,
        ):
            deadline = time.monotonic() + 30  # bounds a failing test: the API loads in well under a second
            while client.get("/jobs").json().get("state") != "ready":
                assert time.monotonic() < deadline
                time.sleep(0.02)
            # The API has loaded, its store has not opened: not ready, and a submit is refused, both saying so.
            ready, refused = client.get("/readyz"), client.post("/jobs", json={"a": 1})
            assert ready.status_code == 503, ready.text
            assert ready.json()["apis"] == {"jobs": "ready"} and "jobs store" in ready.json()["error"]
            assert refused.status_code == 503, refused.text
            process.send_signal(signal.SIGCONT)
            while client.get("/readyz").status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            submitted = client.post("/jobs", json={"a": 1})  # at once: ready means a submit is taken
            assert submitted.status_code == 200, submitted.text
            job_id = submitted.json()["id"]
            while (job := client.get(f"/jobs/{job_id}").json())["status"] != "completed":
                assert time.monotonic() < deadline, job
                time.sleep(0.02)
            assert job["result"] == {"echo": {"a": 1}}
    finally:
        process.send_signal(signal.SIGCONT)
