"""Run inside a private network namespace by tests/deploy/test_ray.py: a local Ray instance, the project of
argv[1] deployed through ``modelserve.ray:app`` with the arguments of argv[2] (JSON), and the requests of
argv[3] (JSON: ``[method, path, body or null, headers]``) sent through Ray's HTTP proxy on 127.0.0.1.

Prints one JSON line, ``RESULT {...}``: each answer's status, content type and body; the process ids that
``POST /who`` answered from (at most 60 tries to see two); and an async job's end, when the project has one.
Not a test itself (pytest collects ``test_*.py`` only).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
import time

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
        result["phases"] = phases  # seconds since the start, for a reader of a slow run
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        ray.shutdown()  # the replicas and the proxy with it (and whatever is left, with the namespace)
        shutil.rmtree(temp_dir, ignore_errors=True)


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
