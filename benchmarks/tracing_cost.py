"""What tracing costs over HTTP (issue #34): the ONNX iris request with tracing off and on, side by side.

One project, one model API like examples/iris but over an ONNX model built here (x float32 [N, 4] -> MatMul +
Add + Softmax, as `onnx_overhead.iris_model`; a hook file turns ``{"inputs": [[...]]}`` into the tensor and the
tensor back into ``{"outputs": [...]}``), served three ways, each its own process on a free loopback port,
access lines off:

* ``off``: this checkout, tracing off;
* ``on``: this checkout, ``MODELSERVE_TRACING=1`` with ``OTEL_TRACES_SAMPLER=always_on`` (every request
  traced), exporting over OTLP/HTTP to a receiver on the loopback that reads each post and discards it (a
  process of its own, on wrk's CPU);
* ``on-1%``: the same, sampling one trace in a hundred (``parentbased_traceidratio``, ``0.01``): what the
  requests that are not sampled cost;
* ``before`` (with ``--baseline DIR``, a checkout from before tracing existed, e.g. ``git worktree add
  /tmp/before-tracing 7fc688f^``): the same project served by that checkout's modelserve.

The targets take turns within a round (runs seconds apart, so drift hits them alike), in an order that rotates
from round to round; each cell is the median over the rounds, each ratio the median over the rounds of the ratio
within a round. ``cpu us`` is the CPU time the server process spent per request, its export thread included; the
cost of tracing per request is ``on``'s minus ``off``'s. After the runs the ``on`` server's
``modelserve_spans_dropped_total`` is printed: a span dropped is a span not exported, so the cost is only the
whole cost when it is 0. The machine's load average is printed before and after.

    python benchmarks/tracing_cost.py --baseline /tmp/before-tracing            # 1/16/64 connections, 5 rounds of 3 s
    python benchmarks/tracing_cost.py --quick                                   # 1 round of 1 s: a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

import httpx
import numpy as np
import onnxruntime
import orjson
from _harness import Run, ServerProcess, cpus, measure, median_run, paired_ratios, write_wrk_script, wrk
from onnx_overhead import iris_model
from serving_matrix import HOOKS_PY  # the matrix's model API hooks, the same request

MS_YAML = """
apis:
  - name: iris
    model: {path: model.onnx, intra_op_threads: 1, inter_op_threads: 1}
    handler: {path: hooks.py}
"""

#: A collector that takes OTLP/HTTP posts and discards them: what an exporter meets at a fast collector.
RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Discard(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the exporter's session reuses its connection

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Discard).serve_forever()
"""


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def dropped(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("modelserve_spans_dropped_total")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=3, help="seconds per wrk run (default 3)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; medians are shown (default 5)")
    parser.add_argument("--concurrency", default="1,16,64", help="wrk connections, comma-separated")
    parser.add_argument("--baseline", type=Path, help="a checkout from before tracing, served as 'before'")
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None, help="servers on CPU 0, wrk on 1")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.rounds = 1, 1
    server_cpu, wrk_cpu = cpus(args.pin)
    levels = [int(c) for c in args.concurrency.split(",")]
    started_load = load_average()

    results: dict[tuple[str, int], list[Run]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        project = root / "iris"
        project.mkdir()
        onnx_file = iris_model(project / "model.onnx")
        (project / "hooks.py").write_text(textwrap.dedent(HOOKS_PY).lstrip())
        (project / "modelserve.yaml").write_text(textwrap.dedent(MS_YAML).lstrip())
        (root / "receiver.py").write_text(textwrap.dedent(RECEIVER).lstrip())
        row = np.random.default_rng(1).standard_normal((1, 4)).astype(np.float32).round(3)
        body = orjson.dumps({"inputs": row.tolist()})
        expected = onnxruntime.InferenceSession(str(onnx_file)).run(None, {"x": row})[0].reshape(-1)
        script = write_wrk_script(root / "iris.lua", body.decode())

        receiver = ServerProcess("receiver", [sys.executable, str(root / "receiver.py"), "{port}"], root, wrk_cpu)
        ms = [sys.executable, "-m", "modelserve", str(project), "--no-access-log", "--log-level", "warning"]
        traced = [
            "env",
            "MODELSERVE_TRACING=1",
            "OTEL_TRACES_SAMPLER=always_on",
            f"OTEL_EXPORTER_OTLP_ENDPOINT={receiver.url}",
            *ms,
        ]
        sampled = [*traced[:2], "OTEL_TRACES_SAMPLER=parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG=0.01"]
        commands = {"off": ["env", "-u", "MODELSERVE_TRACING", *ms], "on": traced, "on-1%": sampled + traced[3:]}
        if args.baseline is not None:
            commands["before"] = ["env", "-u", "MODELSERVE_TRACING", f"PYTHONPATH={args.baseline.resolve()}", *ms]
        servers: dict[str, ServerProcess] = {}
        try:
            receiver.wait_ready(lambda url: httpx.get(url, timeout=5).status_code == 200)
            for name, command in commands.items():
                servers[name] = ServerProcess(name, command, root, server_cpu, log=root / f"{name}.log")
            for name, server in servers.items():
                server.wait_ready(lambda url: httpx.get(f"{url}/readyz", timeout=5).status_code == 200)
                answer = httpx.post(f"{server.url}/iris", content=body, headers={"content-type": "application/json"})
                answer.raise_for_status()
                got = np.asarray(answer.json()["outputs"], np.float32).reshape(-1)
                np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=name)  # the same work
                assert ("traceparent" in answer.headers) == name.startswith("on"), (
                    f"{name}: tracing is not as it should be"
                )
                wrk(f"{server.url}/iris", script, 16, 1.0, wrk_cpu)  # warm up
            for index in range(args.rounds):
                # The targets take turns in an order that rotates from round to round: in a fixed order the last
                # one ('before') always ran after three others, and off/before read 0.93-0.96x where the same two
                # servers in turns read 0.99x (07:07 UTC, 2026-11-27).
                order = [*servers.items()]
                order = order[index % len(order) :] + order[: index % len(order)]
                for connections in levels:
                    for name, server in order:
                        run = measure(server, f"{server.url}/iris", script, connections, args.duration, wrk_cpu)
                        results.setdefault((name, connections), []).append(run)
            spans_dropped = dropped(servers["on"].url)
        finally:
            for server in servers.values():
                server.stop()
            receiver.stop()

    print(
        f"Tracing cost: ONNX iris model API, wrk {args.duration} s x {args.rounds} rounds (medians), "
        f"cpu={os.cpu_count()}, pinned={'yes' if server_cpu else 'no'}, python {sys.version.split()[0]}; "
        f"load average {started_load} before, {load_average()} after"
    )
    header = f"{'conn':>5}  {'target':<8}{'req/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'cpu us':>8}{'/off':>8}"
    print(header)
    print("-" * len(header))
    for connections in levels:
        base = results[("off", connections)]
        for i, name in enumerate(servers):
            runs = results[(name, connections)]
            run = median_run(runs)
            label = str(connections) if i == 0 else ""
            print(
                f"{label:>5}  {name:<8}{run.rps:>8.0f}{run.p50_ms:>8.2f}{run.p99_ms:>8.2f}{run.cpu_us:>8.0f}"
                f"{paired_ratios(runs, base)[0]:>7.2f}x"
            )
    print()
    print(f"{'':<40}" + "".join(f"{str(c) + ' conn':>10}" for c in levels))
    rows = [
        ("off / before (req/s; target >= 0.99x)", "off", "before"),
        ("on / off (req/s)", "on", "off"),
        ("on-1% / off (req/s)", "on-1%", "off"),
    ]
    for label, target, base_name in rows:
        if base_name not in servers:
            continue
        cells = [f"{paired_ratios(results[(target, c)], results[(base_name, c)])[0]:.2f}x" for c in levels]
        print(f"{label:<40}" + "".join(f"{cell:>10}" for cell in cells))
    for name in ("on", "on-1%"):
        pairs = [list(zip(results[(name, c)], results[("off", c)], strict=True)) for c in levels]
        cost_cpu = [statistics.median(on.cpu_us - off.cpu_us for on, off in pair) for pair in pairs]
        cost_time = [statistics.median(1e6 / on.rps - 1e6 / off.rps for on, off in pair) for pair in pairs]
        print(f"{name + ': cost per request, server CPU (us)':<40}" + "".join(f"{cost:>10.1f}" for cost in cost_cpu))
        print(f"{name + ': cost per request, wall time (us)':<40}" + "".join(f"{cost:>10.1f}" for cost in cost_time))
    print(f"spans dropped by the 'on' server (modelserve_spans_dropped_total): {spans_dropped:.0f}")


if __name__ == "__main__":
    main()
