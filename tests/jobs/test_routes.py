"""Async jobs through HTTP against real servers: the same behaviour with the memory, SQLite and Redis stores,
then what only the durable stores promise (restarts, kill -9, several processes)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import free_port, redis_server, write_project

HANDLER = """
import asyncio
import os
import time


def mark(*words):
    with open("runs.log", "a") as log:
        log.write(" ".join(str(word) for word in words) + "\\n")


class Handler:
    def __init__(self, config, metrics_client):
        self.config = config

    async def handle_async(self, payload, request_id):
        mark(os.getpid(), request_id, "start", time.time())
        try:
            if isinstance(payload, dict):
                if "fail" in payload:
                    raise ValueError("no good: " + payload["fail"])
                if "object" in payload:
                    return {"value": object()}
                if "sleep" in payload:
                    await asyncio.sleep(payload["sleep"])
                if "gate" in payload:  # runs until the test makes the file
                    while not os.path.exists(payload["gate"]):
                        await asyncio.sleep(0.01)
            if isinstance(payload, bytes):
                payload = payload.hex()
            return {"type": type(payload).__name__, "payload": payload, "request_id": request_id}
        except asyncio.CancelledError:
            mark(os.getpid(), request_id, "cancelled")
            raise
        finally:
            mark(os.getpid(), request_id, "end")


class SyncHandler:
    def handle_async(self, payload):
        time.sleep(payload.get("sleep", 0))
        while "gate" in payload and not os.path.exists(payload["gate"]):  # runs until the test makes the file
            time.sleep(0.01)
        return {"slept": payload.get("sleep", 0)}
"""

CONFIG = """
apis:
  - name: jobs
    kind: async
    handler: {path: handler.py, config: {greeting: hi}}
  - name: sync
    kind: async
    handler: {path: handler.py, class: SyncHandler}
  - name: narrow
    kind: async
    handler: {path: handler.py}
    max_queue_length: 1
  - name: short
    kind: async
    handler: {path: handler.py}
    result_ttl: 1
  - name: limited
    kind: async
    handler: {path: handler.py}
    timeout: 0.3
"""

STORES = ["memory", "sqlite", "redis"]


def project(root: Path, config: str = CONFIG) -> Path:
    return write_project(root, {"handler.py": HANDLER, "modelserve.yaml": config})


def runs(root: Path) -> list[list[str]]:
    path = root / "runs.log"
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines()]


def wait_started(root: Path, job_id: str, times: int, timeout: float = 30) -> None:
    """Wait until the handler has started `job_id` `times` times (a restarted job shows a stale in_progress)."""
    deadline = time.monotonic() + timeout
    while len([run for run in runs(root) if run[1] == job_id and run[2] == "start"]) < times:
        assert time.monotonic() < deadline, f"job {job_id} was not started {times} time(s): {runs(root)}"
        time.sleep(0.02)


def submit(url: str, payload: Any = None, *, api: str = "jobs", **kwargs: Any) -> httpx.Response:
    if payload is not None:
        kwargs["json"] = payload
    return httpx.post(f"{url}/{api}", timeout=10, **kwargs)


def wait_status(url: str, job_id: str, statuses: set[str], *, api: str = "jobs", timeout: float = 20) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        answer = httpx.get(f"{url}/{api}/{job_id}", timeout=10)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        if body["status"] in statuses:
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {body['status']} after {timeout} s")
        time.sleep(0.02)


# ------------------------------------------------------------------------------------------------------
# a Redis server of the tests' own


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with redis_server(tmp_path_factory.mktemp("redis")) as port:
        yield f"redis://127.0.0.1:{port}/0"


def store_arg(store: str, request: pytest.FixtureRequest) -> str:
    if store == "redis":
        url: str = request.getfixturevalue("redis_url")
        # Each server gets its own key prefix through its own project, so tests never see each other's jobs.
        return url
    return store


@pytest.fixture(scope="module", params=STORES)
def served(request: pytest.FixtureRequest, start_server_module: Any, tmp_path_factory: pytest.TempPathFactory):
    """(server, project root) for each store, shared by the behavioural tests below."""
    store = request.param
    root = project(tmp_path_factory.mktemp(f"jobs-{store}"))
    if store == "redis":
        config = CONFIG.replace("apis:", f"jobs: {{prefix: {root.name}}}\napis:", 1)
        (root / "modelserve.yaml").write_text(config)
    server = start_server_module(root, "--jobs-store", store_arg(store, request))
    server.wait_ready()
    return server, root


# ------------------------------------------------------------------------------------------------------
# the contract, for every store


def test_job_goes_from_queue_to_completed(served: Any, tmp_path: Path) -> None:
    server, _ = served
    gate = str(tmp_path / "gate")
    answer = submit(server.url, {"gate": gate})
    assert answer.status_code == 200
    job_id = answer.json()["id"]
    assert re.fullmatch(r"[0-9a-f]{32}", job_id)
    assert answer.headers["x-request-id"] == job_id
    running = wait_status(server.url, job_id, {"in_progress", "completed"})
    assert running["status"] == "in_progress"
    assert set(running) == {"id", "status"}
    Path(gate).touch()
    done = wait_status(server.url, job_id, {"completed"})
    assert done["result"] == {"type": "dict", "payload": {"gate": gate}, "request_id": job_id}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", done["timestamp"])


def test_queued_behind_a_running_job(served: Any, tmp_path: Path) -> None:
    server, _ = served
    first = submit(server.url, {"gate": str(tmp_path / "gate")}).json()["id"]
    second = submit(server.url, {"sleep": 0}).json()["id"]
    assert httpx.get(f"{server.url}/jobs/{second}").json()["status"] == "in_queue"
    (tmp_path / "gate").touch()
    wait_status(server.url, first, {"completed"})
    wait_status(server.url, second, {"completed"})


@pytest.mark.parametrize(
    ("content_type", "body", "expected_type", "expected"),
    [
        ("application/json", b'[1, "two", null]', "list", [1, "two", None]),
        ("application/vnd.api+json", b'{"a": 1}', "dict", {"a": 1}),
        ("text/plain; charset=latin-1", "caf\u00e9".encode("latin-1"), "str", "caf\u00e9"),
        ("application/octet-stream", b"\x00\xff", "str", "00ff"),
        (None, b"raw", "str", "726177"),
    ],
)
def test_payload_types(served: Any, content_type: str | None, body: bytes, expected_type: str, expected: Any) -> None:
    server, _ = served
    headers = {"content-type": content_type} if content_type else {}
    job_id = submit(server.url, content=body, headers=headers).json()["id"]
    result = wait_status(server.url, job_id, {"completed"})["result"]
    assert (result["type"], result["payload"]) == (expected_type, expected)


def test_request_id_is_the_job_id_and_a_duplicate_is_409(served: Any, request: pytest.FixtureRequest) -> None:
    server, _ = served
    job_id = f"mine-{request.node.callspec.id}-{time.monotonic_ns()}"
    first = submit(server.url, {"n": 1}, headers={"x-request-id": job_id})
    assert first.json() == {"id": job_id}
    again = submit(server.url, {"n": 2}, headers={"x-request-id": job_id})
    assert again.status_code == 409
    assert again.json() == {
        "error": f"a job with id {job_id!r} already exists; send another X-Request-ID",
        "request_id": job_id,
    }
    assert wait_status(server.url, job_id, {"completed"})["result"]["payload"] == {"n": 1}


def test_malformed_json_is_refused_at_submit(served: Any) -> None:
    server, _ = served
    answer = submit(server.url, content=b"{nope", headers={"content-type": "application/json"})
    assert answer.status_code == 400
    assert "not valid JSON" in answer.json()["error"]


def test_failures_say_why_without_a_traceback(served: Any) -> None:
    server, _ = served
    failed = wait_status(server.url, submit(server.url, {"fail": "bad input"}).json()["id"], {"failed"})
    assert failed["error"] == "handle_async raised ValueError: no good: bad input"
    assert "Traceback" not in failed["error"]
    assert "timestamp" in failed and "result" not in failed
    odd = wait_status(server.url, submit(server.url, {"object": 1}).json()["id"], {"failed"})
    assert odd["error"].startswith("the result is not JSON-serialisable")
    assert "object" in odd["error"]


def test_unknown_job_is_404_and_an_ended_job_cannot_be_cancelled(served: Any) -> None:
    server, _ = served
    missing = httpx.get(f"{server.url}/jobs/no-such-job")
    assert missing.status_code == 404
    assert "no-such-job" in missing.json()["error"]
    assert httpx.delete(f"{server.url}/jobs/no-such-job").status_code == 404
    job_id = submit(server.url, {"n": 1}).json()["id"]
    wait_status(server.url, job_id, {"completed"})
    refused = httpx.delete(f"{server.url}/jobs/{job_id}")
    assert refused.status_code == 409
    assert "completed" in refused.json()["error"]


def test_cancel_a_queued_job_it_never_runs(served: Any, tmp_path: Path) -> None:
    server, root = served
    blocker = submit(server.url, {"gate": str(tmp_path / "gate")}).json()["id"]
    queued = submit(server.url, {"n": 1}).json()["id"]
    cancelled = httpx.delete(f"{server.url}/jobs/{queued}")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    (tmp_path / "gate").touch()
    wait_status(server.url, blocker, {"completed"})
    follower = submit(server.url, {"n": 2}).json()["id"]
    wait_status(server.url, follower, {"completed"})
    assert httpx.get(f"{server.url}/jobs/{queued}").json()["status"] == "cancelled"
    assert not [run for run in runs(root) if run[1] == queued]


def test_cancel_a_running_async_job_cancels_the_handler(served: Any) -> None:
    server, root = served
    job_id = submit(server.url, {"sleep": 30}).json()["id"]
    wait_status(server.url, job_id, {"in_progress"})
    assert httpx.delete(f"{server.url}/jobs/{job_id}").json()["status"] == "cancelled"
    # the handler sleeps 30 s: only a cancellation ends it within the (failing test's) bound below
    deadline = time.monotonic() + 10
    while ["cancelled"] != [run[2] for run in runs(root) if run[1] == job_id and run[2] == "cancelled"]:
        assert time.monotonic() < deadline, runs(root)
        time.sleep(0.01)
    # the slot is free again: the next job runs at once
    wait_status(server.url, submit(server.url, {"n": 3}).json()["id"], {"completed"}, timeout=5)


def test_cancel_a_running_sync_job_drops_its_result(served: Any, tmp_path: Path) -> None:
    server, _ = served
    job_id = submit(server.url, {"gate": str(tmp_path / "gate")}, api="sync").json()["id"]
    wait_status(server.url, job_id, {"in_progress"}, api="sync")
    assert httpx.delete(f"{server.url}/sync/{job_id}").json()["status"] == "cancelled"
    (tmp_path / "gate").touch()  # the sync call cannot be interrupted: it returns, and its result is dropped
    # max_concurrency 1: the next job starts only once the interrupted call has returned
    follower = submit(server.url, {"sleep": 0}, api="sync").json()["id"]
    wait_status(server.url, follower, {"completed"}, api="sync")
    final = httpx.get(f"{server.url}/sync/{job_id}").json()
    assert final["status"] == "cancelled" and "result" not in final


def test_a_job_longer_than_the_timeout_fails_and_is_cancelled(served: Any) -> None:
    server, root = served
    job_id = submit(server.url, {"sleep": 10}, api="limited").json()["id"]
    failed = wait_status(server.url, job_id, {"failed"}, api="limited")
    assert failed["error"] == "the call took longer than the timeout of 0.3 s"
    assert [run[2] for run in runs(root) if run[1] == job_id] == ["start", "cancelled", "end"]
    # A job that returns at once: nothing but a stall of the whole 0.3 s could make it late.
    quick = submit(server.url, {"n": 1}, api="limited").json()["id"]
    assert wait_status(server.url, quick, {"completed"}, api="limited")["result"]["payload"] == {"n": 1}


def test_a_full_queue_answers_503(served: Any, tmp_path: Path) -> None:
    server, _ = served
    running = submit(server.url, {"gate": str(tmp_path / "gate")}, api="narrow").json()["id"]
    wait_status(server.url, running, {"in_progress"}, api="narrow")
    queued = submit(server.url, {"n": 1}, api="narrow")
    assert queued.status_code == 200
    refused = submit(server.url, {"n": 2}, api="narrow")
    assert refused.status_code == 503
    assert refused.headers["retry-after"]
    assert "queue is full" in refused.json()["error"]
    (tmp_path / "gate").touch()
    wait_status(server.url, queued.json()["id"], {"completed"}, api="narrow")


def test_records_expire_after_result_ttl_without_being_read(served: Any) -> None:
    server, _ = served
    job_id = submit(server.url, {"n": 1}, api="short").json()["id"]
    deadline = time.monotonic() + 10
    while httpx.get(f"{server.url}/short/{job_id}").status_code == 200:
        assert time.monotonic() < deadline, "the record was never removed"
        time.sleep(0.2)
    assert httpx.get(f"{server.url}/short/{job_id}").status_code == 404


def test_describe_and_metrics(served: Any) -> None:
    server, _ = served
    described = httpx.get(f"{server.url}/jobs").json()
    assert described["kind"] == "async"
    assert described["handle_async"] == {"async": True, "takes": ["payload", "request_id"]}
    assert described["config_keys"] == ["greeting"]
    metrics = httpx.get(f"{server.url}/metrics").text
    assert re.search(r'modelserve_jobs_total\{api="jobs",status="completed"\} [1-9]', metrics)
    assert 'modelserve_jobs_queue_depth{api="jobs"}' in metrics


# ------------------------------------------------------------------------------------------------------
# start-up and shutdown


def test_memory_store_refuses_several_workers(tmp_path: Path, start_server: Any) -> None:
    server = start_server(project(tmp_path), "--jobs-store", "memory", "--workers", "2")
    assert server.wait_exit() == 2
    assert "cannot be shared by --workers 2" in server.log


def test_sqlite_store_that_cannot_be_opened_stops_start_up(tmp_path: Path, start_server: Any) -> None:
    root = project(tmp_path)
    (root / "blocked").write_text("a file where the store's folder should be")
    config = "jobs: {path: blocked/jobs.db}\n" + CONFIG
    (root / "modelserve.yaml").write_text(config)
    server = start_server(root)
    assert server.wait_exit() == 3
    assert "cannot open the sqlite store blocked/jobs.db" in server.log  # as the project names it


def test_unreachable_redis_stops_start_up(tmp_path: Path, start_server: Any) -> None:
    server = start_server(project(tmp_path), "--jobs-store", f"redis://127.0.0.1:{free_port()}/0")
    assert server.wait_exit() == 3
    assert "cannot open the redis store" in server.log


def test_memory_store_graceful_shutdown(tmp_path: Path, start_server: Any) -> None:
    root = project(tmp_path)
    server = start_server(root, "--jobs-store", "memory")
    server.wait_ready()
    gate = tmp_path / "gate"
    running = submit(server.url, {"gate": str(gate)}).json()["id"]
    wait_status(server.url, running, {"in_progress"})
    submit(server.url, {"n": 1})
    submit(server.url, {"n": 2})
    server.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    # once the workers are stopping (they claim no more jobs), the running job may end within the grace period
    while "Waiting for application shutdown" not in server.log:
        assert time.monotonic() < deadline, server.log
        time.sleep(0.02)
    gate.touch()
    assert server.wait_exit() == 0
    assert [run[2] for run in runs(root) if run[1] == running] == ["start", "end"]
    assert "2 queued job(s) dropped" in server.log
    assert "do not survive a restart" in server.log


# ------------------------------------------------------------------------------------------------------
# durable stores


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_queued_jobs_survive_a_restart(
    store: str, tmp_path: Path, start_server: Any, request: pytest.FixtureRequest
) -> None:
    root = project(tmp_path)
    args = ("--jobs-store", store_arg(store, request))
    if store == "redis":
        (root / "modelserve.yaml").write_text(f"jobs: {{prefix: {tmp_path.name}}}\n" + CONFIG)
    first = start_server(root, *args)
    first.wait_ready()
    running = submit(first.url, {"gate": "go"}).json()["id"]
    wait_status(first.url, running, {"in_progress"})
    queued = [submit(first.url, {"n": n}).json()["id"] for n in range(3)]
    first.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60  # bounds a failing test; a passing one waits for the line alone
    while "waiting up to" not in first.log:  # the workers claim no more jobs
        assert time.monotonic() < deadline and first.process.poll() is None, first.log
        time.sleep(0.02)
    (root / "go").touch()  # the running job ends within the grace period
    assert first.stop() == 0
    assert "3 queued job(s) stay in the" in first.log
    second = start_server(root, *args)
    second.wait_ready()
    for job_id in [running, *queued]:
        wait_status(second.url, job_id, {"completed"})


def test_sqlite_kill_9_loses_no_accepted_job(tmp_path: Path, start_server: Any) -> None:
    root = project(tmp_path)
    first = start_server(root)
    first.wait_ready()
    running = submit(first.url, {"sleep": 30}).json()["id"]
    wait_status(first.url, running, {"in_progress"})
    queued = [submit(first.url, {"n": n}).json()["id"] for n in range(5)]
    first.stop(signal.SIGKILL)
    second = start_server(root)
    second.wait_ready()
    for job_id in queued:
        wait_status(second.url, job_id, {"completed"}, timeout=60)
    # the interrupted job comes back once its lease expires, with the same id; it sleeps again, so cancel it
    wait_started(root, running, times=2)
    starts = [run for run in runs(root) if run[1] == running and run[2] == "start"]
    assert starts[0][0] != starts[1][0]
    httpx.delete(f"{second.url}/jobs/{running}")


def test_sqlite_second_interruption_fails_the_job(tmp_path: Path, start_server: Any) -> None:
    root = project(tmp_path)
    job_id = None
    for attempt in (1, 2):
        server = start_server(root)
        server.wait_ready()
        if job_id is None:
            job_id = submit(server.url, {"sleep": 60}).json()["id"]
        wait_started(root, job_id, times=attempt)
        server.stop(signal.SIGKILL)
    server = start_server(root)
    server.wait_ready()
    assert job_id is not None
    failed = wait_status(server.url, job_id, {"failed"}, timeout=30)
    assert "interrupted twice" in failed["error"]


def test_sqlite_with_two_workers_runs_each_job_once(tmp_path: Path, start_server: Any) -> None:
    root = project(tmp_path)
    server = start_server(root, "--workers", "2")
    server.wait_ready(consecutive=20)
    # Two jobs held on a gate: a process runs one job at a time (max_concurrency 1), so while the first runs in
    # one process, only the other can claim the second: both processes run jobs whatever a busy machine does
    # (40 quick jobs once all ran in one process).
    gate = tmp_path / "gate"
    held = [submit(server.url, {"gate": str(gate)}).json()["id"] for _ in range(2)]
    for job_id in held:
        wait_started(root, job_id, times=1)
    assert len({run[0] for run in runs(root) if run[1] in held}) == 2, "both processes should have run jobs"
    gate.touch()
    with httpx.Client(timeout=10) as client:
        ids = []
        for n in range(40):
            client.headers["connection"] = "close"  # new connections spread over both processes
            ids.append(client.post(f"{server.url}/jobs", json={"n": n}).json()["id"])
    for job_id in [*held, *ids]:
        wait_status(server.url, job_id, {"completed"})
    started = [run for run in runs(root) if run[2] == "start"]
    assert sorted(run[1] for run in started) == sorted([*held, *ids])  # each job ran once


def test_two_servers_share_one_redis(tmp_path: Path, start_server: Any, redis_url: str) -> None:
    root = project(tmp_path)
    (root / "modelserve.yaml").write_text(f"jobs: {{store: {redis_url}, prefix: {tmp_path.name}}}\n" + CONFIG)
    first, second = start_server(root), start_server(root)
    first.wait_ready()
    second.wait_ready()
    ids = [submit(server.url, {"n": n}).json()["id"] for n in range(10) for server in (first, second)]
    for job_id in ids:
        wait_status(first.url, job_id, {"completed"})
        assert httpx.get(f"{second.url}/jobs/{job_id}").json()["status"] == "completed"
    started = [run[1] for run in runs(root) if run[2] == "start"]
    assert sorted(started) == sorted(ids)
    # a job running in one server is cancelled from the other (its heartbeat, every 0.5 s, notices it)
    slow = submit(first.url, {"sleep": 30}).json()["id"]
    wait_status(second.url, slow, {"in_progress"})
    asked = time.monotonic()
    assert httpx.delete(f"{second.url}/jobs/{slow}").json()["status"] == "cancelled"
    # The handler sleeps 30 s: only the cancellation ends it within this bound, which leaves a busy machine
    # 15 s (it was 2 s: four heartbeats).
    while not [run for run in runs(root) if run[1] == slow and run[2] == "cancelled"]:
        assert time.monotonic() - asked < 15, "the handler was not cancelled"
        time.sleep(0.02)


def test_redis_lease_expiry_after_kill_9(tmp_path: Path, start_server: Any, redis_url: str) -> None:
    root = project(tmp_path)
    (root / "modelserve.yaml").write_text(f"jobs: {{store: {redis_url}, prefix: {tmp_path.name}}}\n" + CONFIG)
    servers = [start_server(root), start_server(root)]
    for server in servers:
        server.wait_ready()
    # A blocker occupies one server (whichever claims it from the shared store: the survivor), so that the
    # other one (doomed) claims the job; both run until the test makes their gate. (Sleeps of 1.0 and 1.5 s
    # could run out before a busy machine had shown either in progress, and the test skipped when the server
    # it sent the blocker to was not the one that claimed it.)
    blocker = submit(servers[0].url, {"gate": str(tmp_path / "blocker")}).json()["id"]
    wait_started(root, blocker, times=1)
    busy = next(run[0] for run in runs(root) if run[1] == blocker)
    survivor, doomed = servers if busy == str(servers[0].process.pid) else servers[::-1]
    job_id = submit(doomed.url, {"gate": str(tmp_path / "job")}).json()["id"]
    wait_started(root, job_id, times=1)
    owner = next(run[0] for run in runs(root) if run[1] == job_id)
    assert owner == str(doomed.process.pid), "the busy survivor claimed the job"
    doomed.stop(signal.SIGKILL)
    (tmp_path / "blocker").touch()
    (tmp_path / "job").touch()
    done = wait_status(survivor.url, job_id, {"completed"}, timeout=30)
    assert done["result"]["request_id"] == job_id
    starts = [run[0] for run in runs(root) if run[1] == job_id and run[2] == "start"]
    assert starts == [owner, str(survivor.process.pid)]


def test_redis_keys_carry_the_prefix_and_expire(tmp_path: Path, start_server: Any, redis_url: str) -> None:
    import redis

    root = project(tmp_path)
    prefix = f"p{tmp_path.name}"
    (root / "modelserve.yaml").write_text(f"jobs: {{store: {redis_url}, prefix: {prefix}}}\n" + CONFIG)
    server = start_server(root)
    server.wait_ready()
    job_id = submit(server.url, {"n": 1}, api="short").json()["id"]
    wait_status(server.url, job_id, {"completed"}, api="short")
    client = redis.Redis.from_url(redis_url)
    key = f"{prefix}:short:job:{job_id}"
    assert 0 < client.pttl(key) <= 1000
    deadline = time.monotonic() + 5
    while client.exists(key):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert httpx.get(f"{server.url}/short/{job_id}").status_code == 404
    names = [name if isinstance(name, bytes) else name.encode() for name in client.keys(f"{prefix}*")]
    assert all(name.startswith(prefix.encode()) for name in names)
    client.close()


def test_jobs_submitted_one_at_a_time_to_two_idle_processes_each_run_once(tmp_path: Path, start_server: Any) -> None:
    """A job submitted to either of two idle processes (a new connection each) is run, once: by the process
    that took it, woken by the submit, or by the other, at its next poll of the store. How soon is measured by
    `benchmarks/jobs.py` (its idle pick-up: a millisecond or two here), not asserted."""
    root = project(tmp_path)
    server = start_server(root, "--workers", "2")
    server.wait_ready()
    job_ids = []
    for n in range(15):
        time.sleep(0.05)  # idle again
        job_id = submit(server.url, {"n": n}, headers={"connection": "close"}).json()["id"]
        assert wait_status(server.url, job_id, {"completed"})["result"]["payload"] == {"n": n}
        job_ids.append(job_id)
    started = [run[1] for run in runs(root) if run[2] == "start"]
    assert sorted(started) == sorted(job_ids)


# ------------------------------------------------------------------------------------------------------
# other backends as async APIs, and handlers refused at load


def test_onnx_model_as_an_async_api(tmp_path: Path, start_server: Any) -> None:
    from tests.models import iris_expected, iris_onnx

    root = write_project(
        tmp_path,
        {
            "modelserve.yaml": """
                apis:
                  - name: iris
                    kind: async
                    model: {path: iris.onnx}
            """
        },
    )
    iris_onnx(root / "iris.onnx")
    server = start_server(root, "--jobs-store", "memory")
    server.wait_ready()
    rows = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]
    job_id = submit(server.url, {"input": rows}, api="iris").json()["id"]
    result = wait_status(server.url, job_id, {"completed"}, api="iris")["result"]
    _, labels = iris_expected(rows)
    assert result["label"] == labels.tolist()
    bad = submit(server.url, {"input": [[1, 2]]}, api="iris").json()["id"]
    failed = wait_status(server.url, bad, {"failed"}, api="iris")
    assert "input" in failed["error"] and "4" in failed["error"]


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("class Handler:\n    def predict(self, payload):\n        return 1\n", "needs a method handle_async"),
        (
            "class Handler:\n    def handle_async(self, payload, extra):\n        return 1\n",
            "handle_async may take only payload and request_id",
        ),
        (
            "class Handler:\n    def __init__(self, model_path):\n        pass\n"
            "    def handle_async(self, payload):\n        return 1\n",
            "requires ['model_path']",
        ),
        (
            "class Handler:\n    def __init__(self):\n        raise RuntimeError('no weights')\n"
            "    def handle_async(self, payload):\n        return 1\n",
            "Handler() raised RuntimeError: no weights",
        ),
    ],
)
def test_invalid_handlers_stop_start_up(tmp_path: Path, start_server: Any, source: str, message: str) -> None:
    root = write_project(tmp_path, {"handler.py": source, "modelserve.yaml": CONFIG.split("  - name: sync")[0]})
    server = start_server(root, "--jobs-store", "memory")
    assert server.wait_exit() == 3
    assert message in server.log
    assert "handler.py:Handler" in server.log


def test_missing_redis_extra_names_the_pip_command(tmp_path: Path) -> None:
    root = project(tmp_path)
    script = (
        "import sys; sys.modules['redis'] = None\n"
        "import modelserve\n"
        "try:\n"
        f"    modelserve.create_app({str(root)!r}, jobs_store='redis://127.0.0.1:1/0')\n"
        "except modelserve.LoadError as exc:\n"
        "    print(exc)\n"
    )
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert 'pip install "modelserve[redis]"' in output.stdout, output.stdout + output.stderr


def test_json_access_lines_and_request_metrics(tmp_path: Path, start_server: Any) -> None:
    import json

    server = start_server(project(tmp_path), "--jobs-store", "memory", "--log-format", "json")
    server.wait_ready()
    job_id = submit(server.url, {"n": 1}, headers={"x-request-id": "job-42"}).json()["id"]
    wait_status(server.url, job_id, {"completed"})
    assert submit(server.url, content=b"{", headers={"content-type": "application/json"}).status_code == 400
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'modelserve_requests_total{api="jobs",code="200"}' in metrics
    assert 'modelserve_requests_total{api="jobs",code="400"}' in metrics
    server.stop()
    lines = [json.loads(line) for line in server.log.splitlines() if line.startswith("{")]
    posts = [line for line in lines if line.get("method") == "POST" and line.get("path") == "/jobs"]
    assert [line["status"] for line in posts] == [200, 400]
    assert posts[0]["request_id"] == "job-42" and posts[0]["duration"] > 0
    polls = [line for line in lines if line.get("path") == "/jobs/job-42"]
    assert polls and all(line["status"] == 200 and "duration" in line for line in polls)
