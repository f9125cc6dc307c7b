"""A job's trace: stored with the job when it is submitted, continued by whichever process runs it (another
server process through SQLite; Redis), with the time it waited in the queue."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx

from modelserve.jobs.base import NewJob
from modelserve.jobs.sqlite import SCHEMA, SQLiteStore
from tests.conftest import redis_server, write_project
from tests.tracing.receiver import Receiver, Span, children, client_span, env

HANDLER = """
import asyncio
import os


class Handler:
    async def handle_async(self, payload):
        if "gate" in payload:  # runs until the test makes the file
            while not os.path.exists(payload["gate"]):
                await asyncio.sleep(0.01)
        if "fail" in payload:
            raise ValueError("no good")
        return {"pid": os.getpid()}
"""

PROJECT = """
apis:
  - name: jobs
    kind: async
    handler: {path: handler.py}
    max_concurrency: 1
"""


def wait_status(url: str, job_id: str, wanted: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        job = httpx.get(f"{url}/jobs/{job_id}").json()
        if job["status"] == wanted or time.monotonic() > deadline:
            assert job["status"] == wanted, job
            return job
        time.sleep(0.02)


def job_spans(receiver: Receiver, submit: Span) -> tuple[Span, Span]:
    """The job's run and queue spans, children of the span of its submit."""

    def found(spans: list[Span]) -> Any:
        names = {span.name: span for span in children(spans, submit)}
        if "modelserve.job" in names and "modelserve.job.queue" in names:
            return names["modelserve.job"], names["modelserve.job.queue"]
        return None

    return receiver.wait_for(found)


def submitted(receiver: Receiver, trace_id: str) -> Span:
    return receiver.wait_for(
        lambda spans: next((s for s in spans if s.trace_id == trace_id and s.name == "POST /jobs"), None)
    )


def test_a_job_submitted_to_one_process_is_run_by_another_through_sqlite(
    tmp_path: Path, start_server: Any, receiver: Receiver
) -> None:
    root = write_project(tmp_path / "project", {"modelserve.yaml": PROJECT, "handler.py": HANDLER})
    first = start_server(root, env=env(receiver, "server-a"))
    first.wait_ready()
    gate = tmp_path / "gate"
    busy = httpx.post(f"{first.url}/jobs", json={"gate": str(gate)}).json()["id"]
    wait_status(first.url, busy, "in_progress")  # the first process's only slot is taken
    headers, trace_id, client_id = client_span()
    job_id = httpx.post(f"{first.url}/jobs", json={}, headers=headers).json()["id"]
    second = start_server(root, env=env(receiver, "server-b"))
    second.wait_ready()
    done = wait_status(first.url, job_id, "completed")
    gate.touch()
    assert done["result"]["pid"] == second.process.pid
    submit = submitted(receiver, trace_id)
    assert (submit.service, submit.parent_id, submit.kind) == ("server-a", client_id, 2)
    assert submit.attributes["modelserve.request_id"] == job_id
    run, queue = job_spans(receiver, submit)
    assert (run.service, queue.service) == ("server-b", "server-b")
    assert run.kind == 5  # consumer
    assert run.attributes["modelserve.job_id"] == job_id
    assert queue.start >= submit.start and queue.end <= run.start + 1_000_000
    assert receiver.wait_for(lambda spans: [s for s in children(spans, run) if s.name.startswith("modelserve.stage.")])


def test_a_job_through_redis_continues_its_trace_and_records_its_failure(
    tmp_path: Path, start_server: Any, receiver: Receiver
) -> None:
    root = write_project(tmp_path / "project", {"modelserve.yaml": PROJECT, "handler.py": HANDLER})
    with redis_server(tmp_path) as port:
        server = start_server(root, "--jobs-store", f"redis://127.0.0.1:{port}", env=env(receiver, "redis-server"))
        server.wait_ready()
        headers, trace_id, client_id = client_span()
        job_id = httpx.post(f"{server.url}/jobs", json={"fail": 1}, headers=headers).json()["id"]
        wait_status(server.url, job_id, "failed")
        submit = submitted(receiver, trace_id)
        assert submit.parent_id == client_id
        run, queue = job_spans(receiver, submit)
        assert run.status == 2
        (event,) = [attributes for name, attributes in run.events if name == "exception"]
        assert event["exception.type"] == "ValueError"
        assert queue.end <= run.start + 1_000_000


def test_a_job_file_from_before_tracing_gains_the_column_and_keeps_its_jobs(tmp_path: Path) -> None:
    path = tmp_path / "jobs.sqlite"
    old = sqlite3.connect(path)
    old.executescript(SCHEMA.replace("    trace TEXT,\n", ""))
    old.execute("INSERT INTO jobs (api, id, status, kind, payload) VALUES ('a', 'old', 'in_queue', 'json', x'7b7d')")
    old.commit()
    old.close()

    async def run() -> list[Any]:
        store = SQLiteStore(path)
        await store.open()
        try:
            await store.submit(NewJob("a", "new", "json", b"{}", "1 00-" + "1" * 32 + "-" + "2" * 16 + "-01"), 10)
            return await store.claim("a", "me", 2)
        finally:
            await store.close()

    claimed = asyncio.run(run())
    assert [(job.id, job.trace) for job in claimed] == [
        ("old", None),
        ("new", "1 00-" + "1" * 32 + "-" + "2" * 16 + "-01"),
    ]
