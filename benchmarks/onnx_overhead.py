"""ONNX serving overhead: modelserve against bare Starlette routes (and LitServe, FastAPI) running the same model.

Two models, built here with the onnx helper API:

* ``iris``: x float32 [N, 4] -> MatMul + Add + Softmax -> probabilities float32 [N, 3] (microseconds a call);
* ``mlp``: x float32 [N, 256] -> 3 x (256x256 MatMul + Relu) -> MatMul -> logits float32 [N, 10].

For each model, these servers, each its own process on a free loopback port, access logs off, the same
onnxruntime session options (CPU provider, one intra-op thread, one inter-op thread):

* ``modelserve``: ``python -m modelserve DIR --no-access-log``, the model served directly (no hooks);
* ``bare-inline``: a Starlette route that parses the body with orjson and calls ``session.run`` inline on the
  event loop (the baseline: the least a Python server can do);
* ``bare-thread``: the same route calling ``session.run`` through ``run_in_threadpool``;
* ``fastapi``: a FastAPI route doing the bare-inline work (when fastapi is installed);
* ``litserve``: a LitAPI doing the same work (when litserve is installed; its own server and worker processes).

Every server answers ``{"<output>": [[...]]}`` for a body ``[[...]]`` (one row). wrk posts the body (a lua
script) at each concurrency, a few seconds per run, the servers taking turns (a round); every cell is the
median over the rounds. The ratio is each server's requests/s over bare-inline's in the same round (runs
seconds apart), the median over the rounds: the load of a shared machine drifts over minutes and swings
single runs by up to 40%, so side-by-side ratios are steadier than the ratio of two medians.

On a machine that other jobs share, requests/s and latencies swing with their load. The last two columns
are steadier: the CPU time the server's processes (all of them, for LitServe) spent per request, read from
/proc before and after each run, and bare-inline's CPU time per request over each server's: the
throughput ratio one would see on a core of its own.

    python benchmarks/onnx_overhead.py [--duration 2] [--repeats 5] [--concurrency 1,16,64] [--pin]

``--pin`` (the default on machines with 2 or more cores) runs the servers on CPU 0 and wrk on CPU 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import textwrap
from pathlib import Path

import httpx
import numpy as np
import onnx
from _harness import Run, ServerProcess, cpus, measure, median_run, paired_ratios, write_wrk_script, wrk
from onnx import TensorProto, helper, numpy_helper

API = "predict"

# ------------------------------------------------------------------------------------------------
# the models


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def iris_model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("Add", ["h", "B"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
        ],
        "iris",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["N", 3])],
        [
            numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W"),
            numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "B"),
        ],
    )
    return _save(graph, path)


def mlp_model(path: Path, width: int = 256, layers: int = 3, classes: int = 10) -> Path:
    rng = np.random.default_rng(0)
    nodes, weights, current = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"W{i}"))
        nodes += [
            helper.make_node("MatMul", [current, f"W{i}"], [f"h{i}"]),
            helper.make_node("Relu", [f"h{i}"], [f"r{i}"]),
        ]
        current = f"r{i}"
    weights.append(numpy_helper.from_array((rng.standard_normal((width, classes)) / 16).astype(np.float32), "W_out"))
    nodes.append(helper.make_node("MatMul", [current, "W_out"], ["logits"]))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        weights,
    )
    return _save(graph, path)


def bodies() -> dict[str, str]:
    rng = np.random.default_rng(1)
    mlp_row = ", ".join(f"{v:.3f}" for v in rng.standard_normal(256))
    return {"iris": "[[5.1, 3.5, 1.4, 0.2]]", "mlp": f"[[{mlp_row}]]"}


# ------------------------------------------------------------------------------------------------
# the servers: one script, `python servers.py KIND MODEL_PATH PORT`

SERVERS = """
import sys

import numpy as np
import onnxruntime
import orjson

KIND, MODEL, PORT = sys.argv[1], sys.argv[2], int(sys.argv[3])
OPTIONS = {"option": orjson.OPT_SERIALIZE_NUMPY}


def new_session():
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(MODEL, options, providers=["CPUExecutionProvider"])


def starlette_app(threaded):
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    session = new_session()
    name, outputs = session.get_inputs()[0].name, [o.name for o in session.get_outputs()]
    run = session.run

    async def inline(request: Request) -> Response:
        x = np.asarray(orjson.loads(await request.body()), dtype=np.float32)
        result = dict(zip(outputs, run(None, {name: x})))
        return Response(orjson.dumps(result, **OPTIONS), media_type="application/json")

    async def thread(request: Request) -> Response:
        x = np.asarray(orjson.loads(await request.body()), dtype=np.float32)
        result = dict(zip(outputs, await run_in_threadpool(run, None, {name: x})))
        return Response(orjson.dumps(result, **OPTIONS), media_type="application/json")

    return Starlette(routes=[Route("/predict", thread if threaded else inline, methods=["POST"])])


def fastapi_app():
    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    session = new_session()
    name, outputs = session.get_inputs()[0].name, [o.name for o in session.get_outputs()]
    app = FastAPI()

    @app.post("/predict")
    async def predict(request: Request) -> Response:
        x = np.asarray(orjson.loads(await request.body()), dtype=np.float32)
        result = dict(zip(outputs, session.run(None, {name: x})))
        return Response(orjson.dumps(result, **OPTIONS), media_type="application/json")

    return app


if KIND == "litserve":  # at module level: LitServe's worker process (spawned) imports this class by name
    import litserve as ls

    class OnnxAPI(ls.LitAPI):
        def setup(self, device):
            self.session = new_session()
            self.name = self.session.get_inputs()[0].name
            self.outputs = [o.name for o in self.session.get_outputs()]

        def decode_request(self, request):
            return np.asarray(request, dtype=np.float32)

        def predict(self, x):
            return dict(zip(self.outputs, self.session.run(None, {self.name: x})))

        def encode_response(self, output):
            return {key: value.tolist() for key, value in output.items()}


if __name__ == "__main__":
    if KIND == "litserve":
        server = ls.LitServer(OnnxAPI(), accelerator="cpu", workers_per_device=1, timeout=False)
        server.run(host="127.0.0.1", port=PORT, log_level="warning", generate_client_file=False)
    else:
        import uvicorn

        app = {"bare-inline": lambda: starlette_app(False), "bare-thread": lambda: starlette_app(True),
               "fastapi": fastapi_app}[KIND]()
        uvicorn.run(app, host="127.0.0.1", port=PORT, access_log=False, log_level="warning",
                    http="httptools", loop="uvloop")
"""

MS_YAML = """
apis:
  - name: predict
    model: {path: model.onnx, intra_op_threads: 1, inter_op_threads: 1}
"""


def server_commands(root: Path, model: str) -> dict[str, list[str]]:
    project = root / model
    script = str(root / "servers.py")
    onnx_file = str(project / "model.onnx")
    commands = {
        "modelserve": [sys.executable, "-m", "modelserve", str(project), "--no-access-log", "--log-level", "warning"],
        "bare-inline": [sys.executable, script, "bare-inline", onnx_file],
        "bare-thread": [sys.executable, script, "bare-thread", onnx_file],
    }
    for optional in ("fastapi", "litserve"):
        if importlib.util.find_spec(optional) is not None:
            commands[optional] = [sys.executable, script, optional, onnx_file]
    commands["modelserve"] += ["--port", "{port}"]
    for name in commands:
        if name != "modelserve":
            commands[name].append("{port}")
    return commands


def prepare(root: Path) -> dict[str, str]:
    (root / "servers.py").write_text(textwrap.dedent(SERVERS).lstrip())
    texts = bodies()
    for model, build in (("iris", iris_model), ("mlp", mlp_model)):
        (root / model).mkdir()
        build(root / model / "model.onnx")
        (root / model / "modelserve.yaml").write_text(textwrap.dedent(MS_YAML).lstrip())
        write_wrk_script(root / f"{model}.lua", texts[model])
    return texts


def answer_of(server: ServerProcess, body: str) -> np.ndarray:
    """Wait until the server answers `body`; its answer (the model's single output) as an array."""
    answers: list[np.ndarray] = []

    def probe(url: str) -> bool:
        answer = httpx.post(f"{url}/{API}", content=body, headers={"content-type": "application/json"}, timeout=5)
        if answer.status_code != 200:
            return False
        (values,) = answer.json().values()
        answers.append(np.asarray(values))
        return True

    server.wait_ready(probe)
    return answers[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=2, help="seconds per wrk run (default 2)")
    parser.add_argument("--repeats", type=int, default=5, help="rounds per cell; medians are shown (default 5)")
    parser.add_argument("--concurrency", default="1,16,64", help="wrk connections, comma-separated")
    parser.add_argument("--models", default="iris,mlp", help="models to serve, comma-separated (iris, mlp)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None, help="servers on CPU 0, wrk on 1")
    args = parser.parse_args()
    server_cpu, wrk_cpu = cpus(args.pin)
    levels = [int(c) for c in args.concurrency.split(",")]
    models = args.models.split(",")

    results: dict[tuple[str, str, int], list[Run]] = {}
    names: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        texts = prepare(root)
        for model in models:
            commands = server_commands(root, model)
            names[model] = list(commands)
            servers = [
                ServerProcess(name, command, root, server_cpu, log=root / f"{name}-{model}.log")
                for name, command in commands.items()
            ]
            try:
                answers = {server.name: answer_of(server, texts[model]) for server in servers}
                for name, answer in answers.items():  # the same work: the same answer
                    np.testing.assert_allclose(answer, answers["bare-inline"], rtol=1e-4, atol=1e-6, err_msg=name)
                for server in servers:
                    wrk(f"{server.url}/{API}", root / f"{model}.lua", 16, 1.0, wrk_cpu)  # warm up
                for _ in range(args.repeats):
                    for connections in levels:
                        for server in servers:  # the servers take turns, so drift hits them alike
                            url, script = f"{server.url}/{API}", root / f"{model}.lua"
                            run = measure(server, url, script, connections, args.duration, wrk_cpu)
                            results.setdefault((model, server.name, connections), []).append(run)
            finally:
                for server in servers:
                    server.stop()

    import onnxruntime

    print(
        f"ONNX serving overhead: wrk {args.duration:g} s x {args.repeats} (median), cpu={os.cpu_count()}, "
        f"pinned={'yes' if server_cpu else 'no'}, python {sys.version.split()[0]}, "
        f"onnxruntime {onnxruntime.__version__}"
    )
    header = (
        f"{'model':<6}{'conc':>5}  {'server':<12}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'ratio':>8}"
        f"{'cpu us/req':>12}{'cpu ratio':>11}"
    )
    print(header)
    print("-" * len(header))
    for model in models:
        for connections in levels:
            base = results[(model, "bare-inline", connections)]
            for i, name in enumerate(names[model]):
                runs = results[(model, name, connections)]
                run = median_run(runs)
                ratio, cpu_ratio = paired_ratios(runs, base)
                label = (model, str(connections)) if i == 0 else ("", "")
                print(
                    f"{label[0]:<6}{label[1]:>5}  {name:<12}{run.rps:>9.0f}{run.p50_ms:>9.2f}{run.p99_ms:>9.2f}"
                    f"{ratio:>7.2f}x{run.cpu_us:>12.0f}{cpu_ratio:>10.2f}x"
                )


if __name__ == "__main__":
    main()
