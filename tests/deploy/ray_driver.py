"""Run inside a private network namespace by tests/deploy/test_ray.py: a local Ray instance, the project of
argv[1] deployed through ``modelserve.ray:app`` with the arguments of argv[2] (JSON), and the requests of
argv[3] (JSON: ``[method, path, body or null, headers]``) sent through Ray's HTTP proxy on 127.0.0.1.

Prints one JSON line, ``RESULT {...}``: each answer's status, content type and body; the process ids that
``POST /who`` answered from (at most 60 tries to see two); and an async job's end, when the project has one.
Not a test itself (pytest collects ``test_*.py`` only).
"""

from __future__ import annotations

import json
import sys
import time

import httpx
import ray
from ray import serve

import modelserve.ray

PROXY = "http://127.0.0.1:8000"


def main() -> None:
    project, args, requests = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.run(modelserve.ray.app({"project": project, **args}))
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
        print("RESULT " + json.dumps(result), flush=True)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
