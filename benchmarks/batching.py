"""Dynamic batching of an ONNX model: modelserve unbatched, batched, and LitServe batched, under the same load.

The model is a compute-heavy MLP, built with the onnx helper API into a temporary folder: ``x`` float32
[batch, 1024] -> four 1024x1024 layers (MatMul + Relu) -> a 1024x10 output layer -> ``logits`` [batch, 10].
One row reads 16 MB of weights; 32 rows read them once too, which is why batching pays.

Servers, each its own process on a free loopback port, access log off, one onnxruntime session with the same
options (CPU provider, ``--threads`` intra-op threads, 1 by default), taking turns cell by cell:

* ``unbatched``: ``python -m modelserve`` without ``batching``;
* ``batched-0``: ``batching: {max_batch_size: 32, max_wait_ms: 0}`` (greedy: a lone request never waits);
* ``batched-5``: ``batching: {max_batch_size: 32, max_wait_ms: 5}``;
* ``litserve``: LitServe with ``max_batch_size=32`` and ``batch_timeout=0.005`` (skipped when not installed).

wrk posts one row as JSON (``{"x": [[...1024 numbers]]}``) at each concurrency for a few seconds; every
cell is the median over the rounds, and every ratio the median over the rounds of the ratio within a round
(runs seconds apart). It prints req/s, p50 and p99, and the ratios issue 9 targets.

    python benchmarks/batching.py [--duration 4] [--repeats 3] [--concurrency 1,16,64] [--threads 1] [--pin]

The servers are not pinned by default: a batched model runs in a worker thread, where it releases the GIL,
so its calls overlap the event loop's HTTP and JSON work on another core; pinned to one core
(``--pin``: servers on CPU 0, wrk on CPU 1) the two take turns and batching can only save the model's time.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
import numpy as np
from _harness import Run, ServerProcess, measure, median_run, paired_ratios, write_wrk_script, wrk
from onnx_overhead import mlp_model

WIDTH, LAYERS, CLASSES = 1024, 4, 10

LITSERVE = """
import sys

import litserve as ls
import numpy as np
import onnxruntime as ort


class MLP(ls.LitAPI):
    def setup(self, device):
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(sys.argv[3])
        self.session = ort.InferenceSession(sys.argv[2], options, providers=["CPUExecutionProvider"])

    def decode_request(self, request):
        return np.asarray(request["x"][0], dtype=np.float32)

    def batch(self, inputs):
        return np.stack(inputs)

    def predict(self, x):
        return self.session.run(None, {"x": x})[0]

    def unbatch(self, output):
        return list(output)

    def encode_response(self, output):
        return {"logits": [output.tolist()]}


if __name__ == "__main__":
    api = MLP(max_batch_size=32, batch_timeout=0.005, api_path="/mlp")
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1)
    server.run(host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", generate_client_file=False,
               access_log=False)
"""


def model_alone(path: Path, threads: int) -> str:
    """The model's own speed, in this process: what batching can gain before any HTTP cost."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    else:
        from modelserve.runtimes.onnx import default_intra_op_threads

        options.intra_op_num_threads = default_intra_op_threads()
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    parts = []
    for rows in (1, 32):
        x = np.zeros((rows, WIDTH), dtype=np.float32)
        session.run(None, {"x": x})
        calls = 0
        started = time.perf_counter()
        while time.perf_counter() - started < 1.0:
            session.run(None, {"x": x})
            calls += 1
        seconds = (time.perf_counter() - started) / calls
        parts.append(f"{rows} row(s) {seconds * 1000:.2f} ms/call = {rows / seconds:.0f} rows/s")
    return "model alone (no HTTP): " + "; ".join(parts)


def body() -> str:
    row = np.random.default_rng(1).uniform(-1, 1, WIDTH).round(3)
    return '{"x": [[' + ",".join(f"{v:g}" for v in row) + "]]}"


def project_yaml(batching: str | None, threads: int, model: Path) -> str:
    """The project of one server; `threads` 0 leaves intra_op_threads to modelserve's default."""
    setting = f", intra_op_threads: {threads}" if threads else ""
    text = f"""
        apis:
          - name: mlp
            model: {{path: {model}{setting}}}
            max_queue_length: 1000
    """
    if batching is not None:
        text += f"        batching: {batching}\n"
    return textwrap.dedent(text).lstrip()


def commands(root: Path, threads: int) -> dict[str, tuple[list[str], Path]]:
    modelserve = [sys.executable, "-m", "modelserve"]
    flags = ["--port", "{port}", "--no-access-log", "--log-level", "warning"]
    servers: dict[str, tuple[list[str], Path]] = {}
    for name, batching in (
        ("unbatched", None),
        ("batched-0", "{max_batch_size: 32, max_wait_ms: 0}"),
        ("batched-5", "{max_batch_size: 32, max_wait_ms: 5}"),
    ):
        project = root / name
        project.mkdir()
        (project / "modelserve.yaml").write_text(project_yaml(batching, threads, root / "mlp.onnx"))
        servers[name] = ([*modelserve, str(project), *flags], root)
    if importlib.util.find_spec("litserve") is not None:
        (root / "lit.py").write_text(textwrap.dedent(LITSERVE).lstrip())
        servers["litserve"] = ([sys.executable, "lit.py", "{port}", str(root / "mlp.onnx"), str(threads)], root)
    return servers


def report(runs: dict[tuple[str, int], list[Run]], names: list[str], levels: list[int]) -> None:
    """The table (medians over the rounds) and the targets; ratios are the median of the ratios within a round."""
    results = {key: median_run(value) for key, value in runs.items()}

    def ratio(name: str, other: str, connections: int) -> float:
        return paired_ratios(runs[(name, connections)], runs[(other, connections)])[0]

    def p50_ratio(name: str, other: str, connections: int) -> float:
        pairs = zip(runs[(name, connections)], runs[(other, connections)], strict=True)
        return statistics.median(run.p50_ms / base.p50_ms for run, base in pairs)

    header = (
        f"{'conc':>5}  {'server':<11}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'vs unbatched':>14}"
        f"{'cpu us/req':>12}{'cpu vs unb.':>13}"
    )
    print(header)
    print("-" * len(header))
    for connections in levels:
        base = "unbatched" if "unbatched" in names else names[0]
        for i, name in enumerate(names):
            run = results[(name, connections)]
            rps, cpu = paired_ratios(runs[(name, connections)], runs[(base, connections)])
            print(
                f"{connections if i == 0 else '':>5}  {name:<11}{run.rps:>9.0f}{run.p50_ms:>9.2f}{run.p99_ms:>9.2f}"
                f"{rps:>13.2f}x{run.cpu_us:>12.0f}{cpu:>12.2f}x"
            )
    print("\ntargets (issue 9), medians of the ratios within a round:")

    def check(text: str, value: float, ok: bool) -> None:
        print(f"  {text:<58}{value:>7.2f}  {'ok' if ok else 'MISSED'}")

    top = max(levels)
    for name in [n for n in ("batched-0", "batched-5") if n in names and "unbatched" in names]:
        value = ratio(name, "unbatched", top)
        check(f"{name} / unbatched req/s at c={top} (>= 3)", value, value >= 3)
    if 1 in levels and {"batched-0", "unbatched"} <= set(names):
        value = p50_ratio("batched-0", "unbatched", 1)
        check("batched-0 / unbatched p50 at c=1 (<= 1.10)", value, value <= 1.10)
    if "litserve" in names:
        for connections in [c for c in levels if c >= 16]:
            for name in [n for n in ("batched-0", "batched-5") if n in names]:
                value = ratio(name, "litserve", connections)
                check(f"{name} / litserve req/s at c={connections} (>= 2)", value, value >= 2)
    elif importlib.util.find_spec("litserve") is None:
        print("  litserve is not installed (pip install litserve): its comparison is skipped")


def answers_logits(url: str, payload: str) -> bool:
    answer = httpx.post(url + "/mlp", content=payload, headers={"content-type": "application/json"}, timeout=5)
    if answer.status_code != 200:
        return False
    assert len(answer.json()["logits"][0]) == CLASSES, answer.text
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=4, help="seconds per wrk run (default 4)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell; the median is shown (default 3)")
    parser.add_argument("--concurrency", default="1,16,64", help="wrk connections, comma-separated")
    parser.add_argument(
        "--threads", type=int, default=0, help="onnxruntime intra-op threads (default 0: modelserve's default)"
    )
    parser.add_argument("--servers", default=None, help="only these servers, comma-separated (default all)")
    parser.add_argument(
        "--pin", action=argparse.BooleanOptionalAction, default=False, help="servers on CPU 0, wrk on CPU 1"
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    levels = [int(c) for c in args.concurrency.split(",")]
    pin = args.pin and shutil.which("taskset") is not None
    server_cpu, wrk_cpu = ("0", "1") if pin else (None, None)

    runs: dict[tuple[str, int], list[Run]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        mlp_model(root / "mlp.onnx", WIDTH, LAYERS, CLASSES)
        alone = model_alone(root / "mlp.onnx", args.threads)
        payload = body()
        script = root / "post.lua"
        write_wrk_script(script, payload)
        servers = commands(root, args.threads)
        if args.servers:
            servers = {name: servers[name] for name in args.servers.split(",")}
        # All servers run at once (an idle one costs nothing) and take turns cell by cell, so that the load of
        # a shared machine, which drifts over minutes, hits them alike.
        started = [ServerProcess(name, command, cwd, server_cpu) for name, (command, cwd) in servers.items()]
        try:
            for server in started:
                server.wait_ready(lambda base: answers_logits(base, payload))
                wrk(server.url + "/mlp", script, max(levels), 1.0, wrk_cpu)  # warm up
            for _ in range(args.repeats):
                for connections in levels:
                    for server in started:
                        url = server.url + "/mlp"
                        run = measure(server, url, script, connections, args.duration, wrk_cpu)
                        runs.setdefault((server.name, connections), []).append(run)
        finally:
            for server in started:
                server.stop()

    print(
        f"dynamic batching: ONNX MLP {LAYERS}x{WIDTH}x{WIDTH}, one row per request, wrk {args.duration} s x "
        f"{args.repeats} (median), intra-op threads {args.threads}, cpu={os.cpu_count()}, "
        f"pinned={'yes' if pin else 'no'}, python {sys.version.split()[0]}\n"
    )
    print(alone + "\n")
    report(runs, list(servers), levels)


if __name__ == "__main__":
    main()
