"""Run inside a private network namespace by tests/deploy/test_ray.py: a local Ray instance, the project of
argv[1] deployed through ``modelserve.ray:app`` with the arguments of argv[2] (JSON), and the requests of
argv[3] (JSON: ``[method, path, body or null, headers]``) sent through Ray's HTTP proxy on 127.0.0.1.

Prints one JSON line, ``RESULT {...}``: each answer's status, content type and body; the process ids that
``POST /who`` answered from (at most 60 tries to see two); and an async job's end, when the project has one.
With argv[4] (JSON ``{"marker": path, "jobs": n, "started": folder}``), also how a stream ended in its replica
once its client left, and, after the replica running the first of n slow jobs was killed with ``ray.kill``,
the replicas, which processes started each job, and the end of every job; with ``"autoscale": [project, n]``,
that project deployed as a second application under ``/auto`` (its modelserve.yaml's ``ray:`` autoscales it)
and n concurrent ``POST /auto/nap`` kept in flight until a second replica runs: their answers and the most
replicas Serve ran meanwhile.
Not a test itself (pytest collects ``test_*.py`` only).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import ray
from ray import serve

import modelserve.ray

PROXY = "http://127.0.0.1:8000"
METRICS = "http://127.0.0.1:8079/metrics"  # the node's metrics agent: what Prometheus scrapes on a Ray node


def main() -> None:
    project, args, requests = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    started = time.monotonic()
    phases: dict[str, float] = {}
    temp_dir = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths under it must fit in 107 bytes
    ray.init(
        _temp_dir=temp_dir,
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _metrics_export_port=8079,
        _system_config={"metrics_report_interval_ms": 1000},
    )
    try:
        phases["ray.init"] = time.monotonic() - started
        serve.run(modelserve.ray.app({"project": project, **args}))
        phases["serve.run"] = time.monotonic() - started
        result: dict[str, object] = {"answers": [], "pids": []}
        with httpx.Client(base_url=PROXY, timeout=30) as client:
            for method, path, body, headers in requests:
                answer = client.request(method, path, content=body, headers=headers)
                result["answers"].append(  # type: ignore[attr-defined]
                    [answer.status_code, answer.headers.get("content-type"), answer.text]
                )
            pids: set[int] = set()
            for _ in range(60):  # Ray's router picks a replica per request: two show up within a few
                pids.add(client.post("/who", json={}).json()["pid"])
                if len(pids) == 2:
                    break
            result["pids"] = sorted(pids)
            submitted = client.post("/job", json={"text": "x"})
            if submitted.status_code == 200:
                job_id = submitted.json()["id"]
                polls: list[dict[str, object]] = []
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:  # polled through the proxy: any replica answers
                    document = client.get(f"/job/{job_id}").json()
                    polls.append(document)
                    if document["status"] not in ("in_queue", "in_progress"):
                        break
                    time.sleep(0.1)
                result["job"] = polls[-1]
            phases["requests"] = time.monotonic() - started
            result["metrics"] = exported_replicas(client)
            phases["metrics"] = time.monotonic() - started
            if len(sys.argv) > 4:  # the checks of a replica's failures: a client that leaves, a replica killed
                checks = json.loads(sys.argv[4])
                result["stream_end"] = disconnect_from_stream(checks["marker"])
                phases["disconnect"] = time.monotonic() - started
                result.update(kill_a_replica_running_a_job(client, checks["jobs"], checks["started"]))
                phases["kill"] = time.monotonic() - started
                if "autoscale" in checks:
                    result["autoscale"] = autoscale(client, *checks["autoscale"])
                    phases["autoscale"] = time.monotonic() - started
        result["phases"] = phases  # seconds since the start, for a reader of a slow run
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        ray.shutdown()  # the replicas and the proxy with it (and whatever is left, with the namespace)
        shutil.rmtree(temp_dir, ignore_errors=True)


def disconnect_from_stream(marker: str) -> str:
    """Read the first chunk of ``POST /drip`` and close the connection; return what the stream's generator
    wrote into `marker` when it ended in the replica (``closed``: the disconnect closed it)."""
    with httpx.Client(base_url=PROXY, timeout=30) as streaming:
        with streaming.stream("POST", "/drip", json={"marker": marker}) as answer:
            next(answer.iter_raw())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(marker, encoding="utf-8") as file:
                return file.read()
        except FileNotFoundError:
            time.sleep(0.1)
    return "still running"


def replica_actors() -> set[str]:
    return {
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["name"].startswith("SERVE_REPLICA::")
    }


def kill_a_replica_running_a_job(client: httpx.Client, count: int, started: str) -> dict[str, object]:
    """Submit `count` slow jobs (each writes the process id that starts it into a file of `started`), kill
    the replica that runs the first to start (``ray.kill``: no shutdown, no release of its jobs), then wait
    until Ray replaced it and every accepted job ended; polls that reach no replica are retried."""
    ids = []
    for index in range(count):
        answer = client.post("/job", json={"text": str(index), "sleep": 1, "started": started})
        answer.raise_for_status()
        ids.append(answer.json()["id"])
    before = replica_actors()
    deadline = time.monotonic() + 90
    while not os.listdir(started) and time.monotonic() < deadline:
        time.sleep(0.05)
    with open(os.path.join(started, sorted(os.listdir(started))[0]), encoding="utf-8") as file:
        running_pid = int(file.readline())
    pids = {
        name: ray.get(ray.get_actor(name, namespace="serve").__ray_call__.remote(lambda _: os.getpid()))
        for name in before
    }
    (victim,) = [name for name, pid in pids.items() if pid == running_pid]
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    ends: dict[str, object] = {}
    deadline = time.monotonic() + 90
    while len(ends) < len(ids) and time.monotonic() < deadline:
        for job_id in ids:
            if job_id in ends:
                continue
            try:
                answer = client.get(f"/job/{job_id}")
            except httpx.TransportError:
                continue
            if answer.status_code == 200 and answer.json()["status"] not in ("in_queue", "in_progress"):
                ends[job_id] = answer.json()
        time.sleep(0.2)
    replicas = replica_actors()
    while (victim in replicas or len(replicas) < len(before)) and time.monotonic() < deadline:
        time.sleep(0.2)
        replicas = replica_actors()
    starts = {}
    for name in os.listdir(started):
        with open(os.path.join(started, name), encoding="utf-8") as file:
            starts[name] = [int(line) for line in file]
    return {
        "killed": victim,
        "killed_pid": running_pid,
        "starts": starts,
        "replicas_after": sorted(replicas),
        "jobs": [ends.get(job_id, {"id": job_id, "status": "lost"}) for job_id in ids],
    }


def running_replicas(app_name: str) -> int:
    status = serve.status().applications[app_name].deployments[modelserve.ray.DEFAULT_NAME]
    return sum(number for state, number in status.replica_states.items() if state == "RUNNING")


def autoscale(client: httpx.Client, project: str, count: int) -> dict[str, object]:
    """Deploy `project` as the application ``auto`` (in this Ray session: no second start), keep `count`
    concurrent ``POST /auto/nap`` in flight (each naps) until Serve runs a second replica, or for 90 s at the
    most (a bounded load), and watch Serve's replicas meanwhile. `count` naps sent once were not always enough:
    on a busy machine they were all answered before the new replica had started."""
    serve.run(modelserve.ray.app({"project": project}), name="auto", route_prefix="/auto")
    before = running_replicas("auto")
    most = before
    deadline = time.monotonic() + 90
    answers: list[httpx.Response] = []
    with ThreadPoolExecutor(count) as pool:
        futures = {pool.submit(client.post, "/auto/nap", json={}) for _ in range(count)}
        while futures:
            most = max(most, running_replicas("auto"))
            done = {future for future in futures if future.done()}
            futures -= done
            answers += [future.result() for future in done]
            if most < 2 and time.monotonic() < deadline:  # the load goes on: a nap for each one answered
                futures |= {pool.submit(client.post, "/auto/nap", json={}) for _ in done}
            time.sleep(0.1)
    return {
        "replicas_before": before,
        "replicas_most": most,
        "statuses": [answer.status_code for answer in answers],
        "pids": sorted({answer.json()["pid"] for answer in answers if answer.status_code == 200}),
    }


def exported_replicas(client: httpx.Client) -> list[str]:
    """The replicas whose count of ``POST /who`` answered 200 reached Ray's metrics export (waits for two)."""
    pattern = re.compile(r'^ray_modelserve_requests_total\{(?=[^}]*api="who")(?=[^}]*code="200")[^}]*replica="([^"]+)"')
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while len(seen) < 2 and time.monotonic() < deadline:
        text = client.get(METRICS).text
        seen = {match.group(1) for line in text.splitlines() if (match := pattern.match(line))}
        time.sleep(0.5)
    return sorted(seen)


if __name__ == "__main__":
    main()
