"""Every way modelserve runs an ONNX model, side by side with bare Starlette routes (issue #31's matrix).

Three models, built here with the onnx helper API, the same onnxruntime options everywhere (CPU provider, one
intra-op and one inter-op thread):

* ``iris``: x float32 [N, 4] -> MatMul + Add + Softmax -> [N, 3] (microseconds a call);
* ``mlp``: x float32 [N, 256] -> 3 x (256x256 MatMul + Relu) -> [N, 10] (the small MLP);
* ``heavy``: x float32 [N, 1024] -> 4 x (1024x1024 MatMul + Relu) -> [N, 10] (where batching pays).

Servers, each its own process on a free loopback port, access logs off; wrk posts ``{"inputs": [[...]]}`` (one
row) or its V2 form, every server's answer checked against onnxruntime before any run:

* ``bare``: one Starlette app (uvicorn, httptools, uvloop) with three routes: ``bare-inline`` (``orjson.loads``
  -> ``np.asarray`` -> ``session.run`` on the loop -> ``.tolist()`` -> ``orjson.dumps``), ``bare-thread`` (the
  same, ``session.run`` through ``run_in_threadpool``) and ``bare-v2`` (a V2 route parsing inline);
* ``modelserve``: one project with four APIs: ``class-sync`` and ``class-async`` (a Model class whose
  ``load()`` builds the session and whose sync or async ``predict`` does the bare route's work), ``model-api``
  (``model: {path: model.onnx}`` with a hook file: ``pre_inference`` returns ``{"x": np.asarray(...)}``,
  ``post_inference`` returns ``{"outputs": prediction[0].tolist()}``), ``batched`` (that API with ``batching:
  {max_batch_size: 32}``, everything else default), and ``v2-route`` (``POST /v2/models/model-api/infer``);
* with ``--baseline DIR`` (a checkout, e.g. a ``git worktree`` of an earlier commit), the same project served
  by that checkout's modelserve: its targets are suffixed ``@base``.

The targets take turns within a round (runs seconds apart, so drift hits them alike); each cell is the median
over the rounds, each ratio the median over the rounds of the ratio within a round. ``cpu us`` is the CPU time
the server process spent per request (steadier than req/s on a shared machine). The machine's load average
is printed before and after.

    python benchmarks/serving_matrix.py                     # 3 models, 1/16/64 connections, 3 rounds of 3 s
    python benchmarks/serving_matrix.py --quick             # iris and heavy, 1 round of 1 s: a smoke run
    python benchmarks/serving_matrix.py --baseline /tmp/ms-before --models iris,mlp
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
from pathlib import Path

import httpx
import numpy as np
import onnxruntime
import orjson
from _harness import Run, ServerProcess, cpus, measure, median_run, paired_ratios, write_wrk_script, wrk
from onnx_overhead import iris_model, mlp_model

WIDTHS = {"iris": 4, "mlp": 256, "heavy": 1024}

SERVERS = """
import sys

import numpy as np
import onnxruntime
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response
from starlette.routing import Route

from v2_bare import make_v2_route

options = onnxruntime.SessionOptions()
options.intra_op_num_threads = 1
options.inter_op_num_threads = 1
session = onnxruntime.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
run = session.run


async def inline(request):
    x = np.asarray(orjson.loads(await request.body())["inputs"], dtype=np.float32)
    return Response(orjson.dumps({"outputs": run(None, {"x": x})[0].tolist()}), media_type="application/json")


async def thread(request):
    x = np.asarray(orjson.loads(await request.body())["inputs"], dtype=np.float32)
    (out,) = await run_in_threadpool(run, None, {"x": x})
    return Response(orjson.dumps({"outputs": out.tolist()}), media_type="application/json")


routes = [Route("/inline", inline, methods=["POST"]), Route("/thread", thread, methods=["POST"])]
app = Starlette(routes=routes + [make_v2_route(session)])
settings = {"access_log": False, "log_level": "warning", "http": "httptools", "loop": "uvloop"}
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), **settings)
"""

V2_BARE = """
import numpy as np
import orjson
from starlette.responses import Response
from starlette.routing import Route


def make_v2_route(session):
    outputs = [o.name for o in session.get_outputs()]

    async def infer(request):
        header = orjson.loads(await request.body())
        feeds = {}
        for tensor in header["inputs"]:
            feeds[tensor["name"]] = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        described = [
            {"name": name, "datatype": "FP32", "shape": list(array.shape), "data": array.reshape(-1)}
            for name, array in zip(outputs, session.run(outputs, feeds))
        ]
        answer = {"model_name": "model-api", "model_version": "1", "outputs": described}
        return Response(orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json")

    return Route("/v2/models/model-api/infer", infer, methods=["POST"])
"""

MODEL_PY = """
import numpy as np
import onnxruntime


def new_session():
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession("model.onnx", options, providers=["CPUExecutionProvider"])


class Sync:
    def load(self):
        self.run = new_session().run

    def predict(self, inputs):
        x = np.asarray(inputs["inputs"], dtype=np.float32)
        return {"outputs": self.run(None, {"x": x})[0].tolist()}


class Async:
    def load(self):
        self.run = new_session().run

    async def predict(self, inputs):
        x = np.asarray(inputs["inputs"], dtype=np.float32)
        return {"outputs": self.run(None, {"x": x})[0].tolist()}
"""

HOOKS_PY = """
import numpy as np


def pre_inference(sample, signature, metadata):
    return {"x": np.asarray(sample["inputs"], dtype=np.float32)}


def post_inference(prediction, signature, metadata):
    return {"outputs": prediction[0].tolist()}
"""

MS_YAML = """
apis:
  - name: class-sync
    handler: {path: model.py, class: Sync}
  - name: class-async
    handler: {path: model.py, class: Async}
  - name: model-api
    model: {path: model.onnx, intra_op_threads: 1, inter_op_threads: 1}
    handler: {path: hooks.py}
  - name: batched
    model: {path: model.onnx, intra_op_threads: 1, inter_op_threads: 1}
    handler: {path: hooks.py}
    batching: {max_batch_size: 32}
"""

V2_PATH = "/v2/models/model-api/infer"
#: (target, server, path, body kind, models it runs for)
TARGETS = [
    ("bare-inline", "bare", "/inline", "native", ("iris", "mlp", "heavy")),
    ("bare-thread", "bare", "/thread", "native", ("iris", "mlp", "heavy")),
    ("bare-v2", "bare", V2_PATH, "v2", ("iris", "mlp")),
    ("class-sync", "ms", "/class-sync", "native", ("iris", "mlp")),
    ("class-async", "ms", "/class-async", "native", ("iris", "mlp")),
    ("model-api", "ms", "/model-api", "native", ("iris", "mlp", "heavy")),
    ("v2-route", "ms", V2_PATH, "v2", ("iris", "mlp")),
    ("batched", "ms", "/batched", "native", ("iris", "mlp", "heavy")),
]
#: (label, target, base): the issue's targets.
RATIOS = [
    ("model-api / class-sync", "model-api", "class-sync"),
    ("v2-route / class-sync", "v2-route", "class-sync"),
    ("model-api / bare-inline", "model-api", "bare-inline"),
    ("v2-route / bare-v2", "v2-route", "bare-v2"),
    ("batched / model-api", "batched", "model-api"),
]


def build(model: str, path: Path) -> Path:
    if model == "iris":
        return iris_model(path)
    if model == "mlp":
        return mlp_model(path, width=256, layers=3)
    return mlp_model(path, width=1024, layers=4)


def bodies(model: str) -> tuple[np.ndarray, dict[str, bytes]]:
    row = np.random.default_rng(1).standard_normal((1, WIDTHS[model])).astype(np.float32).round(3)
    v2 = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, WIDTHS[model]], "data": row.reshape(-1).tolist()}]}
    return row, {"native": orjson.dumps({"inputs": row.tolist()}), "v2": orjson.dumps(v2)}


def answer_of(url: str, body: bytes) -> np.ndarray:
    answer = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=10)
    answer.raise_for_status()
    document = answer.json()
    if isinstance(document["outputs"], list) and document["outputs"] and isinstance(document["outputs"][0], dict):
        return np.asarray(document["outputs"][0]["data"], np.float32).reshape(-1)
    return np.asarray(document["outputs"], np.float32).reshape(-1)


def load_average() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=3, help="seconds per wrk run (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are shown (default 3)")
    parser.add_argument("--concurrency", default="1,16,64", help="wrk connections, comma-separated")
    parser.add_argument("--models", default="iris,mlp,heavy", help="models, comma-separated (iris, mlp, heavy)")
    parser.add_argument("--targets", default="", help="only these targets, comma-separated (default all)")
    parser.add_argument("--baseline", type=Path, help="a checkout whose modelserve serves the @base targets")
    parser.add_argument("--quick", action="store_true", help="iris and heavy, 1 round of 1 s, 1 and 64 connections")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None, help="servers on CPU 0, wrk on 1")
    args = parser.parse_args()
    if args.quick:
        args.duration, args.rounds, args.concurrency, args.models = 1, 1, "1,64", "iris,heavy"
    server_cpu, wrk_cpu = cpus(args.pin)
    levels = [int(c) for c in args.concurrency.split(",")]
    models = args.models.split(",")
    only = set(args.targets.split(",")) - {""}
    started_load = load_average()

    results: dict[tuple[str, str, int], list[Run]] = {}
    order: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "servers.py").write_text(textwrap.dedent(SERVERS).lstrip())
        (root / "v2_bare.py").write_text(textwrap.dedent(V2_BARE).lstrip())
        for model in models:
            project = root / model
            project.mkdir()
            onnx_file = build(model, project / "model.onnx")
            (project / "model.py").write_text(textwrap.dedent(MODEL_PY).lstrip())
            (project / "hooks.py").write_text(textwrap.dedent(HOOKS_PY).lstrip())
            (project / "modelserve.yaml").write_text(textwrap.dedent(MS_YAML).lstrip())
            row, texts = bodies(model)
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = 1
            expected = onnxruntime.InferenceSession(str(onnx_file), options).run(None, {"x": row})[0].reshape(-1)
            scripts = {kind: write_wrk_script(root / f"{model}-{kind}.lua", body) for kind, body in texts.items()}
            ms = [sys.executable, "-m", "modelserve", str(project), "--no-access-log", "--log-level", "warning"]
            commands = {"bare": [sys.executable, str(root / "servers.py"), str(onnx_file), "{port}"], "ms": ms}
            if args.baseline is not None:
                commands["base"] = ["env", f"PYTHONPATH={args.baseline.resolve()}", *ms]
            servers = {
                name: ServerProcess(name, command, root, server_cpu, log=root / f"{name}-{model}.log")
                for name, command in commands.items()
            }
            targets = []
            for name, server, path, kind, runs_for in TARGETS:
                if model not in runs_for or (only and name not in only):
                    continue
                targets.append((name, servers[server], path, kind))
                if server == "ms" and "base" in servers:
                    targets.append((f"{name}@base", servers["base"], path, kind))
            order[model] = [name for name, *_ in targets]
            try:
                native = texts["native"]
                for name, server in servers.items():
                    if name == "bare":
                        server.wait_ready(lambda url, body=native: httpx.post(f"{url}/inline", content=body).is_success)
                    else:
                        server.wait_ready(lambda url: httpx.get(f"{url}/readyz", timeout=5).status_code == 200)
                for name, server, path, kind in targets:  # the same work: the same answer
                    got = answer_of(server.url + path, texts[kind])
                    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=f"{model} {name}")
                    wrk(server.url + path, scripts[kind], 16, 1.0, wrk_cpu)  # warm up
                for _ in range(args.rounds):
                    for connections in levels:
                        for name, server, path, kind in targets:
                            run = measure(server, server.url + path, scripts[kind], connections, args.duration, wrk_cpu)
                            results.setdefault((model, name, connections), []).append(run)
            finally:
                for server in servers.values():
                    server.stop()

    print(
        f"Serving matrix: wrk {args.duration} s x {args.rounds} rounds (medians), cpu={os.cpu_count()}, "
        f"pinned={'yes' if server_cpu else 'no'}, python {sys.version.split()[0]}, onnxruntime "
        f"{onnxruntime.__version__}; load average {started_load} before, {load_average()} after"
    )
    header = f"{'model':<6}{'conn':>5}  {'target':<18}{'req/s':>8}{'p50 ms':>8}{'p99 ms':>8}{'cpu us':>8}"
    header += f"{'/bare-inline':>13}"
    print(header)
    print("-" * len(header))
    for model in models:
        for connections in levels:
            base = results.get((model, "bare-inline", connections))
            for i, name in enumerate(order[model]):
                runs = results[(model, name, connections)]
                run = median_run(runs)
                ratio = f"{paired_ratios(runs, base)[0]:.2f}x" if base else "-"
                label = (model, str(connections)) if i == 0 else ("", "")
                print(
                    f"{label[0]:<6}{label[1]:>5}  {name:<18}{run.rps:>8.0f}{run.p50_ms:>8.2f}{run.p99_ms:>8.2f}"
                    f"{run.cpu_us:>8.0f}{ratio:>13}"
                )
    print()
    print(
        f"{'ratio (req/s, median of rounds)':<34}" + "".join(f"{m + ' ' + str(c):>12}" for m in models for c in levels)
    )
    pairs = list(RATIOS)
    if args.baseline is not None:
        pairs += [(f"{name} / {name}@base", name, f"{name}@base") for name, server, *_ in TARGETS if server == "ms"]
    for label, target, base_name in pairs:
        cells = []
        for model in models:
            for connections in levels:
                runs = results.get((model, target, connections))
                base_runs = results.get((model, base_name, connections))
                cells.append(f"{paired_ratios(runs, base_runs)[0]:.2f}x" if runs and base_runs else "-")
        print(f"{label:<34}" + "".join(f"{cell:>12}" for cell in cells))


if __name__ == "__main__":
    main()
