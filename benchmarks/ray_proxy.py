"""Ray Serve's proxy: the iris API through ``modelserve.ray`` against ``python -m modelserve`` on the same cores.

Four targets serve the same project (``--project``, default examples/iris-onnx: a JSON body of four features,
an ONNX model, a label and probabilities; examples/iris is the same API with a Python linear model), each with
its defaults (access logs on, as a user would run them):

* ``modelserve``: ``python -m modelserve PROJECT``, one process (the baseline);
* ``modelserve-w2``: ``python -m modelserve PROJECT --workers 2``, two processes behind one port;
* ``ray-1``: ``modelserve.ray:app`` with one replica, through Ray Serve's HTTP proxy (``/one/iris``);
* ``ray-2``: the same with two replicas (``/two/iris``);
* ``ray-floor``: the least Ray Serve does per request, for scale: one replica of a deployment whose
  ``__call__`` returns a fixed answer (no body read, no ASGI app; ``/floor``).

Both Ray applications run in one local Ray instance that this script starts (``ray.init(num_cpus=4)``: a
logical count, so that three replicas fit; the machine's cores are what they are), together with the two
modelserve servers, all idle but the one wrk loads. Nothing is pinned: the servers, Ray's proxy, its replicas
and wrk share every core, as they would on one machine.

wrk posts the README's body from 16 connections for a few seconds per run; the targets take turns (a round);
each cell is the median over the rounds, and the ratio is a target's requests/s over ``modelserve``'s in the
same round, the median over the rounds (the load of a shared machine drifts over minutes).

Ray's services talk over the machine's non-loopback address; the script runs itself again inside private
network and PID namespaces holding only loopback (``unshare``, as root), so that everything stays on
127.0.0.1 and ends with the namespace::

    python benchmarks/ray_proxy.py [--project examples/iris-onnx] [--duration 5] [--rounds 5] [--connections 16]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
from _harness import REPO, Run, ServerProcess, median_run, write_wrk_script, wrk

BODY = json.dumps({"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2})
PROXY = "http://127.0.0.1:8000"


class Floor:
    """Ray Serve's simplest HTTP deployment: the proxy hands it the request, it answers a constant."""

    async def __call__(self, request: object) -> dict[str, object]:
        return {"label": "setosa", "probabilities": [1.0, 0.0, 0.0]}


def _ready(url: str) -> bool:
    return httpx.post(url, content=BODY, headers={"content-type": "application/json"}).status_code == 200


def _in_namespace(argv: list[str]) -> int:
    """Run this script again inside fresh network and PID namespaces (loopback up); its exit status."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        sys.exit("this benchmark runs Ray in a private network namespace: run it as root, with unshare")
    script = 'ip link set lo up && exec "$0" "$@"'
    command = ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script]
    return subprocess.run([*command, sys.executable, __file__, "--inside", *argv]).returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, default=REPO / "examples" / "iris-onnx", help="an iris project")
    parser.add_argument("--duration", type=float, default=5, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=5, help="runs of every target, taking turns")
    parser.add_argument("--connections", type=int, default=16, help="wrk's connections")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if not options.inside:
        sys.exit(_in_namespace(sys.argv[1:]))

    import ray
    from ray import serve

    sys.path.insert(0, str(REPO))
    import modelserve.ray

    project = str(options.project.resolve())

    temp = Path(tempfile.mkdtemp(prefix="ray-"))  # short: Ray's socket paths under it must fit in 107 bytes
    command = [sys.executable, "-m", "modelserve", project]
    servers = [
        ServerProcess("modelserve", command, REPO, None),
        ServerProcess("modelserve-w2", [*command, "--workers", "2"], REPO, None),
    ]
    try:
        ray.init(_temp_dir=str(temp), num_cpus=4, include_dashboard=False, log_to_driver=False)
        serve.run(modelserve.ray.app({"project": project, "num_replicas": 1}), name="one", route_prefix="/one")
        serve.run(modelserve.ray.app({"project": project, "num_replicas": 2}), name="two", route_prefix="/two")
        serve.run(serve.deployment(Floor).bind(), name="floor", route_prefix="/floor")
        urls = {server.name: server.url + "/iris" for server in servers}
        urls |= {"ray-1": PROXY + "/one/iris", "ray-2": PROXY + "/two/iris", "ray-floor": PROXY + "/floor"}
        for server in servers:
            server.wait_ready(lambda url: _ready(url + "/iris"))
        for url in urls.values():
            if not _ready(url):
                sys.exit(f"{url} does not answer the README's request")
        load_before = os.getloadavg()
        script = write_wrk_script(temp / "iris.lua", BODY)
        runs: dict[str, list[Run]] = {name: [] for name in urls}
        for _ in range(options.rounds):
            for name, url in urls.items():
                runs[name].append(wrk(url, script, options.connections, options.duration, None))
        load = os.getloadavg()
    finally:
        for server in servers:
            server.stop()
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)

    print(f"{Path(project).name}, {options.connections} connections, {options.rounds} rounds of {options.duration:g} s")
    before = " ".join(f"{value:.2f}" for value in load_before)
    after = " ".join(f"{value:.2f}" for value in load)
    print(f"cores: {os.cpu_count()}, load average before: {before}, after: {after}\n")
    print("| target | req/s | p50 ms | p99 ms | req/s ratio to modelserve |")
    print("|---|---:|---:|---:|---:|")
    for name, target_runs in runs.items():
        cell = median_run(target_runs)
        ratio = statistics.median(r.rps / b.rps for r, b in zip(target_runs, runs["modelserve"], strict=True))
        print(f"| {name} | {cell.rps:,.0f} | {cell.p50_ms:.1f} | {cell.p99_ms:.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
