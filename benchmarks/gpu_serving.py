"""GPU-grade batching (issue 19): batched Model classes against the HTTP floor of one process and the model alone.

Always, a CPU stand-in for a GPU model, served by a Model class: per batched call, whatever its size, a 2 ms
busy-wait holding the GIL (Python launching kernels), then ``time.sleep(0.003)`` (the device computing, GIL
released); ``preprocess`` is ``np.asarray(ids, dtype=np.int64)``, ``predict`` returns one 768-float32 vector
per row, ``postprocess`` answers ``{"embedding": row.tolist()}``. wrk posts 128 ids as JSON.

Servers, each its own process on a free loopback port, access log off, taking turns cell by cell:

* ``floor``: a bare Starlette route on uvicorn doing the same decode/encode with no model (the HTTP floor of
  one process: what its stack can carry at best);
* ``unbatched``: ``python -m modelserve`` with the stand-in called once per request;
* ``batched``: ``batching: {max_batch_size: 64, max_wait_ms: 0}``;
* ``batched-w2``: the same with ``--workers 2``.

When ``torch`` with CUDA is available, the same four for BERT-base (``transformers`` ``BertConfig()``, random
weights, fp16, 128 token ids in, the 768-float [CLS] embedding out) and ResNet-50 (``torchvision``,
``weights=None``, fp16, a 224x224x3 uint8 image in as octet-stream, the top-5 ids out), with the model alone
(host arrays in, lists out, no HTTP) measured in the same run.

Each cell is the median over the rounds; each ratio the median over the rounds of the ratio within a round.

    python benchmarks/gpu_serving.py [--duration 3] [--repeats 3] [--concurrency 1,64,256] [--models standin]
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
from functools import partial
from pathlib import Path

import httpx
from _harness import Run, ServerProcess, measure, median_run, paired_ratios, write_wrk_script, wrk

STANDIN = '''
import time

import numpy as np

WIDTH = 768
ROW = np.random.default_rng(0).standard_normal(WIDTH).astype(np.float32)


def device_call():
    """One call of the stand-in: 2 ms holding the GIL, then 3 ms without it."""
    end = time.perf_counter() + 0.002
    while time.perf_counter() < end:
        pass
    time.sleep(0.003)


def embed(rows):
    return np.repeat(ROW[None, :], rows, axis=0)


class Batched:
    def preprocess(self, inputs):
        return np.asarray(inputs["ids"], dtype=np.int64)

    def predict(self, batch):
        device_call()
        return list(embed(len(batch)))

    def postprocess(self, row):
        return {"embedding": row.tolist()}


class Single(Batched):
    def predict(self, ids):
        device_call()
        return embed(1)[0]
'''

STANDIN_FLOOR = """
import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from model import embed


async def route(request):
    ids = np.asarray(orjson.loads(await request.body())["ids"], dtype=np.int64)
    row = embed(1)[0]
    return Response(orjson.dumps({"embedding": row.tolist(), "n": len(ids)}), media_type="application/json")


app = Starlette(routes=[Route("/model", route, methods=["POST"])])
"""

BERT = """
import numpy as np
import torch
from transformers import BertConfig, BertModel

torch.backends.cuda.matmul.allow_tf32 = True


class Batched:
    def load(self):
        self.model = BertModel(BertConfig()).half().cuda().eval()

    def preprocess(self, inputs):
        return np.asarray(inputs["ids"], dtype=np.int64)

    @torch.inference_mode()
    def predict(self, batch):
        ids = torch.from_numpy(np.stack(batch)).cuda(non_blocking=True)
        return list(self.model(input_ids=ids).last_hidden_state[:, 0].float().cpu().numpy())

    def postprocess(self, row):
        return {"embedding": row.tolist()}


class Single(Batched):
    def predict(self, ids):
        return Batched.predict(self, [ids])[0]
"""

RESNET = """
import numpy as np
import torch
from torchvision.models import resnet50


class Batched:
    def load(self):
        self.model = resnet50(weights=None).half().cuda().eval().to(memory_format=torch.channels_last)

    def preprocess(self, body):
        return np.frombuffer(body, dtype=np.uint8).reshape(224, 224, 3)

    @torch.inference_mode()
    def predict(self, batch):
        x = torch.from_numpy(np.stack(batch)).cuda(non_blocking=True).permute(0, 3, 1, 2).half().div_(255)
        return list(self.model(x.contiguous(memory_format=torch.channels_last)).topk(5).indices.cpu().numpy())

    def postprocess(self, top):
        return {"top5": top.tolist()}


class Single(Batched):
    def predict(self, image):
        return Batched.predict(self, [image])[0]
"""

MODEL_FLOOR = """
import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

KIND = "{kind}"


async def route(request):
    body = await request.body()
    if KIND == "bert":
        np.asarray(orjson.loads(body)["ids"], dtype=np.int64)
        answer = {{"embedding": np.zeros(768, dtype=np.float32).tolist()}}
    else:
        np.frombuffer(body, dtype=np.uint8).reshape(224, 224, 3)
        answer = {{"top5": [1, 2, 3, 4, 5]}}
    return Response(orjson.dumps(answer), media_type="application/json")


app = Starlette(routes=[Route("/model", route, methods=["POST"])])
"""


def project(root: Path, name: str, source: str, cls: str, batch: int | None) -> Path:
    folder = root / name
    folder.mkdir()
    (folder / "model.py").write_text(textwrap.dedent(source).lstrip())
    text = f"apis:\n  - name: model\n    handler: {{path: model.py, class: {cls}}}\n    max_queue_length: 2000\n"
    if batch is not None:
        text += f"    batching: {{max_batch_size: {batch}, max_wait_ms: 0}}\n"
    (folder / "modelserve.yaml").write_text(text)
    return folder


def servers(root: Path, model: str, batch: int) -> dict[str, tuple[list[str], Path]]:
    """name -> (command, cwd) of the four servers of one model."""
    source = {"standin": STANDIN, "bert": BERT, "resnet": RESNET}[model]
    floor = STANDIN_FLOOR if model == "standin" else MODEL_FLOOR.format(kind=model)
    base = root / model
    base.mkdir()
    (base / "model.py").write_text(textwrap.dedent(source).lstrip())
    (base / "floor.py").write_text(textwrap.dedent(floor).lstrip())
    uvicorn = [sys.executable, "-m", "uvicorn", "floor:app", "--port", "{port}", "--no-access-log", "--log-level"]
    modelserve = [sys.executable, "-m", "modelserve"]
    flags = ["--port", "{port}", "--no-access-log", "--log-level", "warning"]
    return {
        "floor": ([*uvicorn, "warning"], base),
        "unbatched": ([*modelserve, str(project(base, "single", source, "Single", None)), *flags], base),
        "batched": ([*modelserve, str(project(base, "batched", source, "Batched", batch)), *flags], base),
        "batched-w2": (
            [*modelserve, str(project(base, "batched2", source, "Batched", batch)), *flags, "--workers", "2"],
            base,
        ),
    }


def body(model: str) -> tuple[str | bytes, dict[str, str]]:
    if model == "resnet":
        return bytes(range(256)) * (224 * 224 * 3 // 256), {"Content-Type": "application/octet-stream"}
    return '{"ids": [' + ",".join(str(101 + i * 7 % 30000) for i in range(128)) + "]}", {}


def model_alone(root: Path, model: str, batch: int) -> float:
    """Items per second of the batched Model class called directly (host arrays in, lists out, no HTTP)."""
    sys.path.insert(0, str(root / model))
    try:
        module = importlib.import_module("model")
    finally:
        sys.path.pop(0)
    instance = module.Batched()
    if hasattr(instance, "load"):
        instance.load()
    payload, _ = body(model)
    raw = payload if isinstance(payload, bytes) else {"ids": list(range(128))}
    items = [instance.preprocess(raw) for _ in range(batch)]
    for _ in range(3):
        instance.predict(items)
    calls, started = 0, time.perf_counter()
    while time.perf_counter() - started < 2.0:
        [instance.postprocess(row) for row in instance.predict(items)]
        calls += 1
    sys.modules.pop("model", None)
    return calls * batch / (time.perf_counter() - started)


def answers(url: str, payload: str | bytes, headers: dict[str, str]) -> bool:
    content_type = headers.get("Content-Type", "application/json")
    answer = httpx.post(url + "/model", content=payload, headers={"content-type": content_type}, timeout=10)
    return answer.status_code == 200


def report(
    model: str, runs: dict[tuple[str, int], list[Run]], names: list[str], levels: list[int], limit: float
) -> None:
    results = {key: median_run(value) for key, value in runs.items()}

    def ratio(name: str, other: str, connections: int) -> float:
        return paired_ratios(runs[(name, connections)], runs[(other, connections)])[0]

    def latency_ratio(name: str, other: str, connections: int, field: str) -> float:
        pairs = zip(runs[(name, connections)], runs[(other, connections)], strict=True)
        return statistics.median(getattr(run, field) / getattr(base, field) for run, base in pairs)

    header = (
        f"{'conc':>5}  {'server':<11}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'of floor':>10}{'of model':>10}"
        f"{'cpu us/req':>12}"
    )
    print(header)
    print("-" * len(header))
    for connections in levels:
        for i, name in enumerate(names):
            run = results[(name, connections)]
            of_floor = ratio(name, "floor", connections) if "floor" in names else float("nan")
            print(
                f"{connections if i == 0 else '':>5}  {name:<11}{run.rps:>9.0f}{run.p50_ms:>9.2f}{run.p99_ms:>9.2f}"
                f"{of_floor:>9.0%} {run.rps / limit:>9.0%} {run.cpu_us:>11.0f}"
            )
    print(f"\ntargets ({model}), medians of the ratios within a round:")

    def check(text: str, value: float, ok: bool) -> None:
        print(f"  {text:<58}{value:>7.2f}  {'ok' if ok else 'MISSED'}")

    if {"batched", "floor"} <= set(names):
        for connections, target in ((256, 0.75), (64, 0.70)):
            if connections in levels:
                value = ratio("batched", "floor", connections)
                check(f"batched / floor req/s at c={connections} (>= {target})", value, value >= target)
    if 1 in levels and {"batched", "unbatched"} <= set(names):
        value = latency_ratio("batched", "unbatched", 1, "p50_ms")
        check("batched / unbatched p50 at c=1 (<= 1.10)", value, value <= 1.10)
        value = latency_ratio("batched", "unbatched", 1, "p99_ms")
        check("batched / unbatched p99 at c=1 (<= 1.50)", value, value <= 1.50)


def has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=3, help="seconds per wrk run (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; each cell is the median (default 3)")
    parser.add_argument("--concurrency", default="1,64,256", help="wrk connections, comma-separated")
    parser.add_argument("--models", default=None, help="standin,bert,resnet (default: standin, and both with CUDA)")
    parser.add_argument("--servers", default=None, help="only these servers, comma-separated (default all)")
    parser.add_argument("--batch", type=int, default=64, help="max_batch_size of the batched servers (default 64)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    levels = [int(c) for c in args.concurrency.split(",")]
    cuda = has_cuda()
    models = args.models.split(",") if args.models else ["standin", *(["bert", "resnet"] if cuda else [])]
    print(
        f"gpu_serving: wrk {args.duration} s x {args.repeats} rounds, cpu={os.cpu_count()}, "
        f"load average {os.getloadavg()[0]:.1f}, python {sys.version.split()[0]}, "
        f"cuda={'yes' if cuda else 'no (torch with CUDA not available: the stand-in only)'}\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for model in models:
            commands = servers(root, model, args.batch)
            if args.servers:
                commands = {name: commands[name] for name in args.servers.split(",")}
            limit = model_alone(root, model, args.batch)
            payload, headers = body(model)
            script = write_wrk_script(root / f"{model}.lua", payload, headers)
            started = [ServerProcess(name, command, cwd, None) for name, (command, cwd) in commands.items()]
            runs: dict[tuple[str, int], list[Run]] = {}
            try:
                for server in started:
                    server.wait_ready(partial(answers, payload=payload, headers=headers), timeout=300)
                    wrk(server.url + "/model", script, max(levels), 1.0, None)  # warm up
                for _ in range(args.repeats):
                    for connections in levels:
                        for server in started:
                            run = measure(server, server.url + "/model", script, connections, args.duration, None)
                            runs.setdefault((server.name, connections), []).append(run)
            finally:
                for server in started:
                    server.stop()
            print(
                f"{model}: model alone at batch {args.batch}: {limit:,.0f} items/s (no HTTP)  "
                f"load average now {os.getloadavg()[0]:.1f}"
            )
            report(model, runs, list(commands), levels, limit)
            print()


if __name__ == "__main__":
    main()
