"""GPU-grade batching (issue 19): batched Model classes against the HTTP floor of one process and the model alone.

Always, a CPU stand-in for a GPU model, served by a Model class: per batched call, whatever its size, a 2 ms
busy-wait holding the GIL (Python launching kernels), then ``time.sleep(0.003)`` (the device computing, GIL
released); ``preprocess`` is ``np.asarray(ids, dtype=np.int64)``, ``predict`` returns one 768-float32 vector
per row, ``postprocess`` answers ``{"embedding": row.tolist()}``. wrk posts 128 ids as JSON.

Servers, each its own process on a free loopback port, access log off, taking turns cell by cell:

* ``floor``: a bare Starlette route on uvicorn doing the same decode/encode with no model (the HTTP floor of
  one process: what its stack can carry at best);
* ``floor-batched``: the same bare route batching with the fewest steps a batcher can take (a list of
  waiting requests and a future each, the batch formed at the end of the loop's turn and run, preprocess,
  predict and postprocess, on one long-lived thread): what batching on the floor's stack carries, the
  reference for how much of the floor a batched server can keep with this model;
* ``unbatched``: ``python -m modelserve`` with the stand-in called once per request;
* ``batched``: ``batching: {max_batch_size: 64, max_wait_ms: 0}``;
* ``batched-w2``: the same with ``--workers 2`` (``batched-w4``, only when named in ``--servers``: ``--workers 4``);
* ``batched-nomodel`` (only when named in ``--servers``): ``batched`` with a ``predict`` that costs nothing,
  what modelserve's own batched path costs a request beside the floor's; ``floor-batched-nomodel`` (the same
  way) is ``floor-batched`` with that ``predict``, what batching itself costs a request on the floor's stack.

``--ops N`` splits the stand-in's 2 ms of GIL into N pieces, each followed by a call that lets go of the GIL and
takes it back at once (``select`` with no timeout), as eager PyTorch does around each op it launches.

Pinned by default (``--no-pin`` to stop it): the servers on CPU 0, wrk on CPU 1, so that a server's CPU is
one core it does not share with the load generator, as for the issue's targets on 2 cores.

When ``torch`` with CUDA is available, the same servers for BERT-base (``transformers`` ``BertConfig()``, random
weights, fp16, 128 token ids in, the 768-float [CLS] embedding out) and ResNet-50 (``torchvision``,
``weights=None``, fp16, a 224x224x3 uint8 image in as octet-stream, the top-5 ids out), with the model alone
(host arrays in, lists out, no HTTP) measured in the same run.

Each cell is the median over the rounds; each ratio the median over the rounds of the ratio within a round.
``batch`` is the mean batch size of a cell (from the server's ``modelserve_batch_size`` histogram), and the
stand-in's cost model is printed under its table: per request, the floor's CPU, the batched server's, and
the model's 2 ms of GIL per call divided by the batch size.

    python benchmarks/gpu_serving.py [--duration 3] [--repeats 3] [--concurrency 1,64,256] [--models standin]
                                     [--ops 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
from _harness import Run, ServerProcess, measure, median_run, paired_ratios, write_wrk_script, wrk

STANDIN = '''
import os
import select
import time

import numpy as np

WIDTH = 768
ROW = np.random.default_rng(0).standard_normal(WIDTH).astype(np.float32)
#: In how many pieces the 2 ms are held, each followed by a call that lets go of the GIL (--ops).
OPS = int(os.environ.get("GPU_SERVING_OPS") or 1)


def device_call():
    """One call of the stand-in: 2 ms holding the GIL, then 3 ms without it."""
    if OPS > 1:  # as eager PyTorch launches: each op some Python, then C++ without the GIL
        for _ in range(OPS):
            end = time.perf_counter() + 0.002 / OPS
            while time.perf_counter() < end:
                pass
            select.select([], [], [], 0)  # lets go of the GIL and takes it back, without sleeping
    else:
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


class NoModel(Batched):
    def predict(self, batch):
        return list(embed(len(batch)))
'''

#: The stand-in's GIL time per model call, whatever the batch size (its busy-wait).
STANDIN_GIL_S = 0.002

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


FLOOR_BATCHED = """
import asyncio
from concurrent.futures import ThreadPoolExecutor

import orjson
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from model import {cls} as Batched

KIND = "{kind}"
MAX_BATCH = {batch}
SAMPLE = bytes(224 * 224 * 3) if KIND == "resnet" else {{"ids": [0] * 128}}

model = Batched()
if hasattr(model, "load"):
    model.load()
waiting = []
state = {{"running": False, "scheduled": False, "requests": 0, "batches": 0}}


def run(items):
    rows = [model.preprocess(item) for item in items]
    return [model.postprocess(row) for row in model.predict(rows)]


thread = ThreadPoolExecutor(1)  # one long-lived thread for every batch, warmed here
thread.submit(run, [SAMPLE]).result()


def dispatch():
    state["scheduled"] = False
    if state["running"] or not waiting:
        return
    batch = waiting[:MAX_BATCH]
    del waiting[:MAX_BATCH]
    state["running"] = True
    state["requests"] += len(batch)
    state["batches"] += 1
    done = asyncio.get_running_loop().run_in_executor(thread, run, [item for item, _ in batch])
    done.add_done_callback(lambda done: finish(batch, done))


def finish(batch, done):
    state["running"] = False
    error = done.exception()
    for index, (_, answer) in enumerate(batch):
        if answer.done():  # its client left
            continue
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(done.result()[index])
    dispatch()


async def route(request):
    body = await request.body()
    answer = asyncio.get_running_loop().create_future()
    waiting.append((body if KIND == "resnet" else orjson.loads(body), answer))
    if not state["running"] and not state["scheduled"]:
        state["scheduled"] = True
        asyncio.get_running_loop().call_soon(dispatch)  # at the end of this turn of the loop
    return Response(orjson.dumps(await answer), media_type="application/json")


async def batches(request):
    return JSONResponse({{"requests": state["requests"], "batches": state["batches"]}})


app = Starlette(routes=[Route("/model", route, methods=["POST"]), Route("/batches", batches)])
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
    """name -> (command, cwd) of the servers of one model (``batched-nomodel`` for the stand-in only)."""
    source = {"standin": STANDIN, "bert": BERT, "resnet": RESNET}[model]
    floor = STANDIN_FLOOR if model == "standin" else MODEL_FLOOR.format(kind=model)
    base = root / model
    base.mkdir()
    (base / "model.py").write_text(textwrap.dedent(source).lstrip())
    (base / "floor.py").write_text(textwrap.dedent(floor).lstrip())
    for file, cls in (("floor_batched.py", "Batched"), ("floor_batched_nomodel.py", "NoModel")):
        (base / file).write_text(FLOOR_BATCHED.format(kind=model, batch=batch, cls=cls).lstrip())
    uvicorn = [sys.executable, "-m", "uvicorn", "floor:app", "--port", "{port}", "--no-access-log", "--log-level"]
    modelserve = [sys.executable, "-m", "modelserve"]
    flags = ["--port", "{port}", "--no-access-log", "--log-level", "warning"]
    return {
        "floor": ([*uvicorn, "warning"], base),
        "floor-batched": ([*uvicorn[:3], "floor_batched:app", *uvicorn[4:], "warning"], base),
        "unbatched": ([*modelserve, str(project(base, "single", source, "Single", None)), *flags], base),
        "batched": ([*modelserve, str(project(base, "batched", source, "Batched", batch)), *flags], base),
        "batched-w2": (
            [*modelserve, str(project(base, "batched2", source, "Batched", batch)), *flags, "--workers", "2"],
            base,
        ),
        "batched-w4": (
            [*modelserve, str(project(base, "batched4", source, "Batched", batch)), *flags, "--workers", "4"],
            base,
        ),
        **(
            {
                "batched-nomodel": (
                    [*modelserve, str(project(base, "nomodel", source, "NoModel", batch)), *flags],
                    base,
                ),
                "floor-batched-nomodel": ([*uvicorn[:3], "floor_batched_nomodel:app", *uvicorn[4:], "warning"], base),
            }
            if model == "standin"
            else {}
        ),
    }


#: The servers run when --servers names none.
DEFAULT_SERVERS = ("floor", "floor-batched", "unbatched", "batched", "batched-w2")


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


_BATCH_SUM = re.compile(rb'^modelserve_batch_size_sum\{api="model"\} (\S+)$', re.M)
_BATCH_COUNT = re.compile(rb'^modelserve_batch_size_count\{api="model"\} (\S+)$', re.M)


def batches(server: ServerProcess) -> tuple[float, float]:
    """(requests, batches) so far: a modelserve server's batch size histogram, a floor-batched server's own
    counts; zeros for the floor."""
    if server.name == "floor":
        return 0.0, 0.0
    if server.name.startswith("floor-batched"):
        counts = httpx.get(server.url + "/batches", timeout=10).json()
        return float(counts["requests"]), float(counts["batches"])
    text = httpx.get(server.url + "/metrics", timeout=10).content
    total, count = _BATCH_SUM.search(text), _BATCH_COUNT.search(text)
    return (float(total.group(1)), float(count.group(1))) if total and count else (0.0, 0.0)


@dataclass
class Cell:
    """One wrk run of one server, with the mean size of the batches it made (0: not batched, or not known)."""

    run: Run
    batch: float


def measure_cell(server: ServerProcess, script: Path, connections: int, seconds: float, pin: str | None) -> Cell:
    before = batches(server)
    run = measure(server, server.url + "/model", script, connections, seconds, pin)
    after = batches(server)
    count = after[1] - before[1]
    # With --workers N each scrape reads one worker: the difference of two scrapes means nothing.
    workers = re.search(r"-w\d+$", server.name) is not None
    return Cell(run, (after[0] - before[0]) / count if count > 0 and not workers else 0.0)


def answers(url: str, payload: str | bytes, headers: dict[str, str]) -> bool:
    if httpx.get(url + "/readyz", timeout=10).status_code == 503:  # modelserve: a worker is loading (floors: 404)
        return False
    content_type = headers.get("Content-Type", "application/json")
    answer = httpx.post(url + "/model", content=payload, headers={"content-type": content_type}, timeout=10)
    return answer.status_code == 200


def report(
    model: str, cells: dict[tuple[str, int], list[Cell]], names: list[str], levels: list[int], limit: float
) -> None:
    runs = {key: [cell.run for cell in value] for key, value in cells.items()}
    results = {key: median_run(value) for key, value in runs.items()}
    sizes = {key: statistics.median(cell.batch for cell in value) for key, value in cells.items()}

    def ratio(name: str, other: str, connections: int) -> float:
        return paired_ratios(runs[(name, connections)], runs[(other, connections)])[0]

    def latency_ratio(name: str, other: str, connections: int, field: str) -> float:
        pairs = zip(runs[(name, connections)], runs[(other, connections)], strict=True)
        return statistics.median(getattr(run, field) / getattr(base, field) for run, base in pairs)

    header = (
        f"{'conc':>5}  {'server':<22}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'of floor':>10}{'of model':>10}"
        f"{'cpu us/req':>12}{'batch':>7}"
    )
    print(header)
    print("-" * len(header))
    for connections in levels:
        for i, name in enumerate(names):
            run, size = results[(name, connections)], sizes[(name, connections)]
            of_floor = ratio(name, "floor", connections) if "floor" in names else float("nan")
            print(
                f"{connections if i == 0 else '':>5}  {name:<22}{run.rps:>9.0f}{run.p50_ms:>9.2f}{run.p99_ms:>9.2f}"
                f"{of_floor:>9.0%} {run.rps / limit:>9.0%} {run.cpu_us:>11.0f}"
                f"{f'{size:.1f}' if size else '-':>7}"
            )
    if model == "standin" and {"floor", "batched"} <= set(names):
        # The bound: a server doing the floor's work per request plus the model's GIL time shared by a batch.
        print(
            "\ncost model (stand-in), CPU us per request, medians: the model holds the GIL 2 ms a call, so "
            "2000 / batch a request;\nbound = the share of the floor left with nothing beside the model but "
            "the floor's own work, floor / (floor + 2000 / batch)"
        )
        print(f"{'conc':>5}  {'floor':>7}{'batched':>9}{'no model':>10}{'batch':>7}{'model/req':>11}{'bound':>7}")
        for connections in levels:
            floor, batched = results[("floor", connections)].cpu_us, results[("batched", connections)].cpu_us
            size = sizes[("batched", connections)] or 1.0
            model_share = STANDIN_GIL_S * 1e6 / size
            bare = results.get(("batched-nomodel", connections))
            print(
                f"{connections:>5}  {floor:>7.0f}{batched:>9.0f}{f'{bare.cpu_us:.0f}' if bare else '-':>10}"
                f"{size:>7.1f}{model_share:>11.0f}{floor / (floor + model_share):>7.0%}"
            )
    print(f"\ntargets ({model}), medians of the ratios within a round:")

    def check(text: str, value: float, ok: bool) -> None:
        print(f"  {text:<68}{value:>7.2f}  {'ok' if ok else 'MISSED'}")

    if {"batched", "floor"} <= set(names):
        for connections, target in ((256, 0.75), (64, 0.70)):
            if connections in levels:
                value = ratio("batched", "floor", connections)
                check(f"batched / floor req/s at c={connections} (>= {target})", value, value >= target)
    for ours, leanest in (("batched", "floor-batched"), ("batched-nomodel", "floor-batched-nomodel")):
        if {ours, leanest} <= set(names):
            for connections in levels:
                value = ratio(ours, leanest, connections)
                print(f"  {f'{ours} / {leanest} req/s at c={connections} (reference)':<68}{value:>7.2f}")
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
    parser.add_argument(
        "--servers", default=None, help=f"these servers, comma-separated (default {','.join(DEFAULT_SERVERS)})"
    )
    parser.add_argument("--batch", type=int, default=64, help="max_batch_size of the batched servers (default 64)")
    parser.add_argument(
        "--ops",
        type=int,
        default=1,
        help="the stand-in's 2 ms of GIL in this many pieces, each followed by a GIL release (default 1)",
    )
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="servers on CPU 0, wrk on CPU 1 (default; --no-pin on a machine with more cores)",
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    levels = [int(c) for c in args.concurrency.split(",")]
    os.environ["GPU_SERVING_OPS"] = str(args.ops)  # read by the stand-in's module, here and in the servers
    cuda = has_cuda()
    models = args.models.split(",") if args.models else ["standin", *(["bert", "resnet"] if cuda else [])]
    print(
        f"gpu_serving: wrk {args.duration} s x {args.repeats} rounds, cpu={os.cpu_count()}, "
        f"load average {os.getloadavg()[0]:.1f}, python {sys.version.split()[0]}, "
        f"pinned={'yes (servers on CPU 0, wrk on CPU 1)' if args.pin else 'no'}, stand-in ops={args.ops}, "
        f"cuda={'yes' if cuda else 'no (torch with CUDA not available: the stand-in only)'}\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for model in models:
            commands = servers(root, model, args.batch)
            wanted = args.servers.split(",") if args.servers else list(DEFAULT_SERVERS)
            unknown = [name for name in wanted if name not in commands]
            if unknown:
                sys.exit(f"unknown servers for {model}: {', '.join(unknown)} (known: {', '.join(commands)})")
            commands = {name: commands[name] for name in wanted}
            limit = model_alone(root, model, args.batch)
            payload, headers = body(model)
            script = write_wrk_script(root / f"{model}.lua", payload, headers)
            server_cpu, wrk_cpu = ("0", "1") if args.pin else (None, None)
            started = [
                ServerProcess(name, command, cwd, server_cpu, log=root / f"{model}-{name}.log")
                for name, (command, cwd) in commands.items()
            ]
            cells: dict[tuple[str, int], list[Cell]] = {}
            try:
                for server in started:
                    server.wait_ready(partial(answers, payload=payload, headers=headers), timeout=300)
                    try:  # a model's first batches (a new shape each, on a GPU) are what the warm-up is for
                        wrk(server.url + "/model", script, max(levels), 1.0, wrk_cpu)
                    except RuntimeError as error:
                        print(f"{model}/{server.name}: the warm-up was answered with errors:\n{error}")
                        print(f"its log ends:\n{server.output()[-1500:]}")
                for _ in range(args.repeats):
                    for connections in levels:
                        for server in started:
                            try:
                                cell = measure_cell(server, script, connections, args.duration, wrk_cpu)
                            except RuntimeError as error:
                                raise RuntimeError(f"{model}/{server.name}: {error}\n{server.output()}") from None
                            cells.setdefault((server.name, connections), []).append(cell)
            finally:
                for server in started:
                    server.stop()
            print(
                f"{model}: model alone at batch {args.batch}: {limit:,.0f} items/s (no HTTP)  "
                f"load average now {os.getloadavg()[0]:.1f}"
            )
            report(model, cells, list(commands), levels, limit)
            print()


if __name__ == "__main__":
    main()
