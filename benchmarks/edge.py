"""The edge beyond one core's HTTP floor (issue #31 item 3): granian against uvicorn, and the ceiling of a
multi-process front, on the CPU stand-in of `gpu_serving.py`.

The stand-in, its floor and its batched project are `gpu_serving.py`'s (a Model class whose batched call holds
the GIL 2 ms and sleeps 3 ms; wrk posts 128 ids as JSON, the answer is 768 floats). Servers, each its own
process on a free loopback port, access log off, taking turns cell by cell, wrk always on CPU 1:

* ``floor``: the bare Starlette route on uvicorn, on CPU 0: the one-process floor the targets are against;
* ``floor-granian``: the same route served by granian, on CPU 0 (granian's Rust threads share that core);
* ``batched``: ``python -m modelserve`` with ``batching: {max_batch_size: 64, max_wait_ms: 0}``, on CPU 0;
* ``batched-2cpu``: the same, not pinned (its threads may run on the second core, which wrk shares);
* ``batched-granian``: the same with ``--server granian``, on CPU 0;
* ``batched-granian-2cpu``: the same, not pinned: granian's Rust I/O thread may run on the second core (which
  wrk shares);
* ``floor-w2``: the bare route with ``--workers 2``, not pinned: two processes each doing the floor's
  decode/encode on both cores. A multi-process front (N HTTP processes decoding and encoding, one model
  process batching for them through shared memory) does at least this work per request in its HTTP
  processes, plus the hand-over to the model process: this is its ceiling on this machine;
* ``front-2``: a prototype of that front, not pinned: two uvicorn workers decode the ids and encode the answer,
  one model process (the stand-in's model, batches of up to 64 from both) answers each request's row over a
  Unix socket per worker.

Each cell is the median over the rounds; each ratio the median over the rounds of the ratio within a round.

    python benchmarks/edge.py [--duration 3] [--repeats 3] [--concurrency 64,256] [--servers floor,batched,...]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from functools import partial
from pathlib import Path

from _harness import Run, ServerProcess, measure, median_run, paired_ratios, write_wrk_script, wrk
from gpu_serving import answers, body, project
from gpu_serving import servers as gpu_servers

#: name -> pinned to CPU 0 (the server's core) or free to use both.
PINNED = {
    "floor": True,
    "floor-granian": True,
    "batched": True,
    "batched-2cpu": False,
    "batched-granian": True,
    "batched-granian-2cpu": False,
    "floor-w2": False,
    "front-2": False,
}


FRONT_MODEL = """
import sys
import threading
from multiprocessing.connection import Listener

import numpy as np

from model import ROW, device_call

MAX_BATCH = int(sys.argv[2])
waiting = []
ready = threading.Condition()


def serve(connection):
    while True:
        try:
            message = connection.recv_bytes()
        except EOFError:
            return
        with ready:
            waiting.append((connection, message[:8]))
            ready.notify()


def batches():
    while True:
        with ready:
            while not waiting:
                ready.wait()
            batch = waiting[:MAX_BATCH]
            del waiting[:MAX_BATCH]
        device_call()
        rows = np.repeat(ROW[None, :], len(batch), axis=0)
        for (connection, key), row in zip(batch, rows):
            connection.send_bytes(key + row.tobytes())


threading.Thread(target=batches, daemon=True).start()
with Listener(sys.argv[1], "AF_UNIX") as listener:
    while True:
        threading.Thread(target=serve, args=(listener.accept(),), daemon=True).start()
"""

FRONT_HTTP = """
import asyncio
import itertools
import os
import struct
import time
from contextlib import asynccontextmanager
from multiprocessing.connection import Client

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

SOCKET = os.environ["FRONT_SOCKET"]
pending = {}
keys = itertools.count()
link = {}


def answered():
    connection = link["connection"]
    while connection.poll():
        message = connection.recv_bytes()
        future = pending.pop(message[:8], None)
        if future is not None and not future.done():
            future.set_result(np.frombuffer(message, dtype=np.float32, offset=8))


@asynccontextmanager
async def lifespan(app):
    for _ in range(600):
        try:
            link["connection"] = Client(SOCKET, "AF_UNIX")
            break
        except OSError:
            time.sleep(0.05)
    asyncio.get_running_loop().add_reader(link["connection"].fileno(), answered)
    os.set_blocking(link["connection"].fileno(), True)  # the loop made it non-blocking; a full buffer waits
    yield


async def route(request):
    ids = np.asarray(orjson.loads(await request.body())["ids"], dtype=np.int64)
    key = struct.pack("<Q", next(keys))
    future = asyncio.get_running_loop().create_future()
    pending[key] = future
    link["connection"].send_bytes(key + ids.tobytes())
    row = await future
    return Response(orjson.dumps({"embedding": row.tolist()}), media_type="application/json")


app = Starlette(routes=[Route("/model", route, methods=["POST"])], lifespan=lifespan)
"""


def front(base: Path, batch: int, processes: int) -> list[str]:
    """A prototype of the multi-process front: `processes` uvicorn workers decoding and encoding, one model
    process batching the requests of all of them (a Unix socket per worker; the stand-in's model)."""
    (base / "front_model.py").write_text(FRONT_MODEL.lstrip())
    (base / "front_http.py").write_text(FRONT_HTTP.lstrip())
    sock = base / f"front-{processes}.sock"
    http = f"{sys.executable} -m uvicorn front_http:app --workers {processes} --no-access-log --log-level warning"
    script = f"{sys.executable} front_model.py {sock} {batch} & FRONT_SOCKET={sock} exec {http} --port {{port}}"
    return ["sh", "-c", script]


def commands(root: Path, batch: int) -> dict[str, tuple[list[str], Path]]:
    """name -> (command, cwd) of every server of `PINNED`."""
    stock = gpu_servers(root, "standin", batch)
    base = root / "standin"
    source = (base / "model.py").read_text()
    flags = ["--port", "{port}", "--no-access-log", "--log-level", "warning"]
    modelserve = [sys.executable, "-m", "modelserve"]
    granian_project = project(base, "batched_granian", source, "Batched", batch)
    floor_command, _ = stock["floor"]
    granian_floor = [sys.executable, "-m", "granian", "--interface", "asgi", "--no-ws", "--http", "1"]
    return {
        "floor": stock["floor"],
        "floor-granian": ([*granian_floor, "--log-level", "warning", "--port", "{port}", "floor:app"], base),
        "batched": stock["batched"],
        "batched-2cpu": stock["batched"],
        "batched-granian": ([*modelserve, str(granian_project), *flags, "--server", "granian"], base),
        "batched-granian-2cpu": ([*modelserve, str(granian_project), *flags, "--server", "granian"], base),
        "floor-w2": ([*floor_command, "--workers", "2"], base),
        "front-2": (front(base, batch, 2), base),
    }


def report(runs: dict[tuple[str, int], list[Run]], names: list[str], levels: list[int]) -> None:
    results = {key: median_run(value) for key, value in runs.items()}
    header = f"{'conc':>5}  {'server':<22}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'of floor':>10}{'cpu us/req':>12}"
    print(header)
    print("-" * len(header))
    for connections in levels:
        for i, name in enumerate(names):
            run = results[(name, connections)]
            of_floor = (
                paired_ratios(runs[(name, connections)], runs[("floor", connections)])[0]
                if "floor" in names
                else float("nan")
            )
            print(
                f"{connections if i == 0 else '':>5}  {name:<22}{run.rps:>9.0f}{run.p50_ms:>9.2f}{run.p99_ms:>9.2f}"
                f"{of_floor:>9.0%} {run.cpu_us:>11.0f}"
            )
    if "floor" not in names or 256 not in levels:
        return
    print("\ntargets (stand-in, 256 connections), medians of the ratios within a round:")
    for name, what in (
        ("batched-2cpu", "uvicorn, two cores"),
        ("batched-granian", "granian edge, one core"),
        ("batched-granian-2cpu", "granian edge, two cores"),
        ("floor-w2", "ceiling of a multi-process front"),
        ("front-2", "a multi-process front's prototype"),
    ):
        if name in names:
            value = paired_ratios(runs[(name, 256)], runs[("floor", 256)])[0]
            verdict = "ok" if value >= 1.2 else "MISSED"
            print(f"  {f'{name} / floor req/s ({what}) (>= 1.2)':<68}{value:>7.2f}  {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=3, help="seconds per wrk run (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; each cell is the median (default 3)")
    parser.add_argument("--concurrency", default="64,256", help="wrk connections, comma-separated (default 64,256)")
    parser.add_argument("--servers", default=",".join(PINNED), help="these servers, comma-separated (default: all)")
    parser.add_argument("--batch", type=int, default=64, help="max_batch_size of the batched servers (default 64)")
    args = parser.parse_args()
    names = args.servers.split(",")
    unknown = [name for name in names if name not in PINNED]
    if unknown:
        sys.exit(f"unknown servers: {', '.join(unknown)} (known: {', '.join(PINNED)})")
    levels = [int(c) for c in args.concurrency.split(",")]
    print(
        f"edge: wrk {args.duration} s x {args.repeats} rounds, cpu={os.cpu_count()}, "
        f"load average {os.getloadavg()[0]:.1f}, python {sys.version.split()[0]}, wrk on CPU 1\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        every = commands(root, args.batch)
        payload, headers = body("standin")
        script = write_wrk_script(root / "standin.lua", payload, headers)
        started = [ServerProcess(name, *every[name], "0" if PINNED[name] else None) for name in names]
        runs: dict[tuple[str, int], list[Run]] = {}
        try:
            for server in started:
                server.wait_ready(partial(answers, payload=payload, headers=headers), timeout=300)
                wrk(server.url + "/model", script, max(levels), 1.0, "1")  # warm up
            for _ in range(args.repeats):
                for connections in levels:
                    for server in started:
                        run = measure(server, server.url + "/model", script, connections, args.duration, "1")
                        runs.setdefault((server.name, connections), []).append(run)
        finally:
            for server in started:
                server.stop()
        report(runs, names, levels)
        print(f"\nload average now {os.getloadavg()[0]:.1f}; median batch sizes are in gpu_serving.py's table")


if __name__ == "__main__":
    main()
