"""What tracing costs a request in-process (issue #34): the ONNX iris request with tracing off and on, the app
called directly, one request at a time, the CPU time of the process per request, its export thread included.

Each target is a process of its own (pinned to CPU 0 when taskset is there), with the project of
`tracing_cost.py` loaded by ``modelserve.create_app`` and its ASGI app called in a loop (no sockets, no HTTP
parsing: the component, not the machine's network):

* ``off``: this checkout, tracing off; ``on``: every request traced (``always_on``); ``on-1%``: one in a hundred
  (``parentbased_traceidratio`` at ``0.01``); the traced ones export over OTLP/HTTP to a loopback receiver
  that discards what it gets, and each round ends by flushing the export, so its encoding is counted;
* with ``--baseline DIR`` (a checkout, e.g. ``git worktree add /tmp/tracing-before HEAD``), the same three
  served by that checkout's modelserve: ``before-off``, ``before-on``, ``before-1%``.

The targets take turns within a round, in an order that rotates from round to round (drift hits them alike); the
times are medians over the rounds, the cost over off and the ratio to the baseline medians of the same within
each round.

    python benchmarks/tracing_inprocess.py --baseline /tmp/tracing-before     # 2000 requests x 7 rounds
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import httpx
import numpy as np
import orjson
from _harness import REPO, ServerProcess
from onnx_overhead import iris_model
from serving_matrix import HOOKS_PY
from tracing_cost import MS_YAML, RECEIVER, load_average

#: One target: loads the project, then runs a round of `sys.argv[2]` requests per line read, printing its
#: CPU time per request in microseconds.
CHILD = """
import asyncio
import sys
import time

import modelserve

app = modelserve.create_app(sys.argv[1])
count = int(sys.argv[2])
body = sys.argv[3].encode()
scope = {
    "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
    "path": "/iris", "raw_path": b"/iris", "root_path": "", "query_string": b"",
    "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()), (b"user-agent", b"bench")],
    "server": ("127.0.0.1", 8888), "client": ("127.0.0.1", 50000),
}
statuses = []


def receiver():
    # A request's receive: its body, then nothing until the request is over, as a server's (a disconnect
    # watch waits on it rather than spinning).
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()

    return receive


async def send(message):
    if message["type"] == "http.response.start":
        statuses.append(message["status"])


def flush():
    if "opentelemetry" in sys.modules:
        from opentelemetry import trace

        trace.get_tracer_provider().force_flush()


async def main():
    await app.server.wait_loaded()
    for _ in range(300):
        await app(dict(scope), receiver(), send)
    flush()
    for _ in sys.stdin:
        statuses.clear()
        started = time.process_time()
        for _ in range(count):
            await app(dict(scope), receiver(), send)
        flush()
        spent = time.process_time() - started
        assert statuses == [200] * count, set(statuses)
        print(spent / count * 1e6, flush=True)


asyncio.run(main())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds; medians are shown (default 7)")
    parser.add_argument("--baseline", type=Path, help="a checkout to compare with, its targets prefixed 'before-'")
    args = parser.parse_args()
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") and (os.cpu_count() or 1) >= 2 else []
    started_load = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        project = root / "iris"
        project.mkdir()
        iris_model(project / "model.onnx")
        (project / "hooks.py").write_text(textwrap.dedent(HOOKS_PY).lstrip())
        (project / "modelserve.yaml").write_text(textwrap.dedent(MS_YAML).lstrip())
        (root / "receiver.py").write_text(textwrap.dedent(RECEIVER).lstrip())
        (root / "child.py").write_text(CHILD)
        row = np.random.default_rng(1).standard_normal((1, 4)).astype(np.float32).round(3)
        body = orjson.dumps({"inputs": row.tolist()}).decode()
        receiver = ServerProcess("receiver", [sys.executable, str(root / "receiver.py"), "{port}"], root, None)
        off = {"MODELSERVE_TRACING": "0"}
        on = {
            "MODELSERVE_TRACING": "1",
            "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        }
        sampled = {**on, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"}
        checkouts = {"": REPO} | ({"before-": args.baseline.resolve()} if args.baseline else {})
        children: dict[str, subprocess.Popen[str]] = {}
        try:
            receiver.wait_ready(lambda url: httpx.get(url, timeout=5).status_code == 200)
            for prefix, checkout in checkouts.items():
                for name, extra in (("off", off), ("on", on), ("1%" if prefix else "on-1%", sampled)):
                    env = {**os.environ, **extra, "PYTHONPATH": str(checkout)}
                    command = [*pin, sys.executable, str(root / "child.py"), str(project), str(args.requests), body]
                    children[prefix + name] = subprocess.Popen(
                        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=root
                    )
            results: dict[str, list[float]] = {name: [] for name in children}
            order = list(children)
            for turn in range(args.rounds):
                # The order rotates from round to round: no target always runs right after the same one (this
                # machine moves between two speeds, and a target's neighbour in time shares its speed most).
                shift = turn % len(order)
                for name in order[shift:] + order[:shift]:
                    child = children[name]
                    assert child.stdin is not None and child.stdout is not None
                    child.stdin.write("go\n")
                    child.stdin.flush()
                    line = child.stdout.readline()
                    if not line:
                        sys.exit(f"{name} stopped")
                    results[name].append(float(line))
        finally:
            for child in children.values():
                child.kill()
            receiver.stop()
    print(
        f"Tracing cost in-process: ONNX iris model API, {args.requests} requests x {args.rounds} rounds (medians), "
        f"pinned={'yes' if pin else 'no'}, python {sys.version.split()[0]}; "
        f"load average {started_load} before, {load_average()} after"
    )
    # Within a round the targets ran minutes apart at most, at one of the machine's speeds: the cost over off and
    # the ratio to the baseline are taken within each round, then their median (the columns of absolute times
    # alone move with the machine by 10-40% between rounds).
    print(f"{'target':<12}{'cpu us/request':>16}{'cost vs off':>14}{'/ before':>10}")
    for name, values in results.items():
        off_values = results["before-off" if name.startswith("before-") else "off"]
        cost = statistics.median(value - base for value, base in zip(values, off_values, strict=True))
        twin = "before-" + name.replace("on-1%", "1%")
        ratio = ""
        if not name.startswith("before-") and twin in results:
            ratio = f"{statistics.median(v / b for v, b in zip(values, results[twin], strict=True)):.3f}x"
        print(f"{name:<12}{statistics.median(values):>16.1f}{cost:>14.1f}{ratio:>10}")


if __name__ == "__main__":
    main()
