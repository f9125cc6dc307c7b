"""The Open Inference Protocol's cost: modelserve's V2 routes (JSON, binary) and its native route, against a bare
Starlette route doing the same V2 parsing inline.

Two ONNX models, built with `onnx_overhead`'s builders:

* ``iris``: x float32 [N, 4] -> probabilities float32 [N, 3] (microseconds a call);
* ``mlp``: x float32 [N, 1024] -> one 1024x1024 MatMul + Relu -> logits float32 [N, 10] (1,024 floats in).

Two server processes per model, the same onnxruntime options (CPU provider, one intra-op and one inter-op
thread), access logs off:

* ``modelserve``: ``python -m modelserve DIR``, the model served directly; wrk posts one row to
  ``native`` (``POST /predict``, the body ``[[...]]``), ``v2-json`` (``POST /v2/models/predict/infer``, the
  row as JSON ``data``, a JSON answer) and ``v2-binary`` (the row as binary data after a JSON header,
  ``binary_data_output``: the answer's tensors as binary too);
* ``bare``: a Starlette route at the same V2 path that parses the request inline (orjson, `np.asarray` of
  ``data`` or `np.frombuffer` of the binary part), calls ``session.run`` and writes the V2 answer, with none of
  modelserve's checks (``bare-json``, ``bare-binary``).

Every cell is the median of the rounds (the targets take turns within a round, runs seconds apart); every
ratio the median over the rounds of the ratio within a round. The targets of issue 18: ``v2-binary`` at least
``native`` for the MLP, ``v2-json`` at least 0.9x ``bare-json``.

    python benchmarks/v2.py [--duration 2] [--repeats 3] [--concurrency 1,16,64] [--models iris,mlp] [--pin]

``--pin`` (the default on machines with 2 or more cores) runs the servers on CPU 0 and wrk on CPU 1.
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
import orjson
from _harness import Run, ServerProcess, cpus, measure, median_run, paired_ratios, write_wrk_script, wrk
from onnx_overhead import iris_model, mlp_model

PATH = "/v2/models/predict/infer"
WIDTHS = {"iris": 4, "mlp": 1024}

#: The bare route: `make_app(model path)` (run as a server by `BARE`, called in one process by v2_inprocess.py).
BARE_APP = """
import numpy as np
import onnxruntime
import orjson
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

DTYPES = {"FP32": np.dtype(np.float32), "FP64": np.dtype(np.float64), "INT64": np.dtype(np.int64)}
NAMES = {dtype.str: name for name, dtype in DTYPES.items()}


def make_app(model):
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]

    async def infer(request):
        body = await request.body()
        length = request.headers.get("inference-header-content-length")
        header = orjson.loads(body if length is None else body[: int(length)])
        offset = len(body) if length is None else int(length)
        feeds = {}
        for tensor in header["inputs"]:
            dtype = DTYPES[tensor["datatype"]]
            size = (tensor.get("parameters") or {}).get("binary_data_size")
            if size is None:
                feeds[tensor["name"]] = np.asarray(tensor["data"], dtype=dtype).reshape(tensor["shape"])
            else:
                array = np.frombuffer(body, dtype, count=size // dtype.itemsize, offset=offset)
                feeds[tensor["name"]] = array.reshape(tensor["shape"])
                offset += size
        binary = (header.get("parameters") or {}).get("binary_data_output", False)
        described, blobs = [], []
        for name, array in zip(outputs, session.run(outputs, feeds)):
            tensor = {"name": name, "datatype": NAMES[array.dtype.str], "shape": list(array.shape)}
            if binary:
                tensor["parameters"] = {"binary_data_size": array.nbytes}
                blobs.append(array.tobytes())
            else:
                tensor["data"] = array.reshape(-1)
            described.append(tensor)
        answer = {"model_name": "predict", "model_version": "1", "outputs": described}
        head = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
        if not blobs:
            return Response(head, media_type="application/json")
        headers = {"inference-header-content-length": str(len(head))}
        return Response(head + b"".join(blobs), media_type="application/octet-stream", headers=headers)

    return Starlette(routes=[Route("/v2/models/predict/infer", infer, methods=["POST"])])
"""

BARE = (
    BARE_APP
    + """

if __name__ == "__main__":
    import sys

    import uvicorn

    app = make_app(sys.argv[1])
    settings = {"access_log": False, "log_level": "warning", "http": "httptools", "loop": "uvloop"}
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), **settings)
"""
)

MS_YAML = """
apis:
  - name: predict
    model: {path: model.onnx, intra_op_threads: 1, inter_op_threads: 1}
"""


def requests_of(width: int) -> dict[str, tuple[bytes, dict[str, str]]]:
    """The body and headers of each kind of request, for one row of `width` floats."""
    row = np.random.default_rng(1).standard_normal((1, width)).astype(np.float32).round(3)
    as_json = {"name": "x", "datatype": "FP32", "shape": [1, width], "data": row.reshape(-1).tolist()}
    as_binary = {"name": "x", "datatype": "FP32", "shape": [1, width], "parameters": {"binary_data_size": row.nbytes}}
    header = orjson.dumps({"inputs": [as_binary], "parameters": {"binary_data_output": True}})
    binary_headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}
    return {
        "native": (orjson.dumps(row.tolist()), {}),
        "json": (orjson.dumps({"inputs": [as_json]}), {}),
        "binary": (header + row.tobytes(), binary_headers),
    }


#: (target, server, path, kind of request)
TARGETS = [
    ("native", "modelserve", "/predict", "native"),
    ("v2-json", "modelserve", PATH, "json"),
    ("v2-binary", "modelserve", PATH, "binary"),
    ("bare-json", "bare", PATH, "json"),
    ("bare-binary", "bare", PATH, "binary"),
]
#: (ratio, target, base)
RATIOS = [
    ("v2-json / bare-json", "v2-json", "bare-json"),
    ("v2-binary / bare-binary", "v2-binary", "bare-binary"),
    ("v2-binary / native", "v2-binary", "native"),
    ("v2-json / native", "v2-json", "native"),
]


def answer_of(url: str, body: bytes, headers: dict[str, str]) -> np.ndarray:
    """The first output of an answer, native or V2 (JSON or binary), as an array."""
    answer = httpx.post(url, content=body, headers={"content-type": "application/json", **headers}, timeout=5)
    answer.raise_for_status()
    length = answer.headers.get("inference-header-content-length")
    if length is None:
        document = answer.json()
        if "outputs" not in document:  # the native answer: {"<output>": [[...]]}
            (values,) = document.values()
            return np.asarray(values, np.float32).reshape(-1)
        return np.asarray(document["outputs"][0]["data"], np.float32)
    document_size = int(length)
    document = orjson.loads(answer.content[:document_size])
    size = document["outputs"][0]["parameters"]["binary_data_size"]
    return np.frombuffer(answer.content, np.float32, count=size // 4, offset=document_size)


def model_folder(root: Path, model: str) -> Path:
    """A modelserve project serving `model` (iris or mlp) as the API ``predict``, under `root`."""
    folder = root / model
    folder.mkdir()
    if model == "iris":
        iris_model(folder / "model.onnx")
    else:
        mlp_model(folder / "model.onnx", width=WIDTHS["mlp"], layers=1)
    (folder / "modelserve.yaml").write_text(textwrap.dedent(MS_YAML).lstrip())
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=2, help="seconds per wrk run (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per cell; medians are shown (default 3)")
    parser.add_argument("--concurrency", default="1,16,64", help="wrk connections, comma-separated")
    parser.add_argument("--models", default="iris,mlp", help="models, comma-separated (iris, mlp)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None, help="servers on CPU 0, wrk on 1")
    args = parser.parse_args()
    server_cpu, wrk_cpu = cpus(args.pin)
    levels = [int(c) for c in args.concurrency.split(",")]
    models = args.models.split(",")

    results: dict[tuple[str, str, int], list[Run]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "bare.py").write_text(textwrap.dedent(BARE).lstrip())
        for model in models:
            folder = model_folder(root, model)
            requests = requests_of(WIDTHS[model])
            scripts = {
                kind: write_wrk_script(root / f"{model}-{kind}.lua", body, headers)
                for kind, (body, headers) in requests.items()
            }
            ms_command = [sys.executable, "-m", "modelserve", str(folder), "--no-access-log", "--log-level", "warning"]
            bare_command = [sys.executable, str(root / "bare.py"), str(folder / "model.onnx"), "{port}"]
            servers = {
                "modelserve": ServerProcess("modelserve", [*ms_command, "--port", "{port}"], root, server_cpu),
                "bare": ServerProcess("bare", bare_command, root, server_cpu),
            }
            try:
                body = requests["json"][0]
                for server in servers.values():
                    server.wait_ready(lambda url, body=body: httpx.post(url + PATH, content=body).status_code == 200)
                answers = {
                    target: answer_of(servers[server_name].url + path, *requests[kind])
                    for target, server_name, path, kind in TARGETS
                }
                for target, answer in answers.items():  # the same work: the same answer
                    np.testing.assert_allclose(answer, answers["bare-json"], rtol=1e-5, atol=1e-6, err_msg=target)
                for _, server_name, path, kind in TARGETS:  # warm up
                    wrk(servers[server_name].url + path, scripts[kind], 16, 1.0, wrk_cpu)
                for _ in range(args.repeats):
                    for connections in levels:
                        for target, server_name, path, kind in TARGETS:
                            server = servers[server_name]
                            run = measure(server, server.url + path, scripts[kind], connections, args.duration, wrk_cpu)
                            results.setdefault((model, target, connections), []).append(run)
            finally:
                for server in servers.values():
                    server.stop()

    import onnxruntime

    print(
        f"V2 (Open Inference Protocol) overhead: wrk {args.duration:g} s x {args.repeats} (median), "
        f"cpu={os.cpu_count()}, pinned={'yes' if server_cpu else 'no'}, python {sys.version.split()[0]}, "
        f"onnxruntime {onnxruntime.__version__}"
    )
    header = f"{'model':<6}{'conc':>5}  {'target':<12}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'cpu us/req':>12}"
    print(header)
    print("-" * len(header))
    for model in models:
        for connections in levels:
            for i, (target, *_) in enumerate(TARGETS):
                run = median_run(results[(model, target, connections)])
                label = (model, str(connections)) if i == 0 else ("", "")
                print(
                    f"{label[0]:<6}{label[1]:>5}  {target:<12}{run.rps:>9.0f}{run.p50_ms:>9.2f}{run.p99_ms:>9.2f}"
                    f"{run.cpu_us:>12.0f}"
                )
    print()
    header = f"{'model':<6}{'conc':>5}  " + "".join(f"{name:>26}" for name, *_ in RATIOS)
    print(header + "   (req/s ratio, cpu ratio)")
    print("-" * len(header))
    for model in models:
        for connections in levels:
            cells = []
            for _, target, base in RATIOS:
                rps, cpu = paired_ratios(results[(model, target, connections)], results[(model, base, connections)])
                cells.append(f"{rps:.2f}x / {cpu:.2f}x")
            print(f"{model:<6}{connections:>5}  " + "".join(f"{cell:>26}" for cell in cells))


if __name__ == "__main__":
    main()
