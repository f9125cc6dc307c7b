"""Goodput under overload: a 50 ms API (capacity 20/s) flooded far beyond what it can serve.

One API with ``max_concurrency: 1`` and ``max_queue_length: 10``, its predict 50 ms of ``time.sleep`` (sync),
of ``asyncio.sleep`` (async) or of pure-Python arithmetic (cpu). Two floods:

- ``open``: open-loop, a fixed arrival rate (200 req/s, 10x capacity) whatever the answers, on keep-alive
  connections (a new one when none is idle);
- ``closed``: 150 keep-alive clients, each sending its next request as soon as its answer (200 or 503) came.

For each server it prints goodput (200s per second as a share of the capacity), the accepted requests' wait
(from the client sending the request to predict starting, read from the answer), 503s per second, the
server's peak RSS, and the CPU the client spent. The server runs on CPU 0 and the client on CPU 1
(``--server-cpu``/``--client-cpu``), so that the load generator does not take the server's core::

    python benchmarks/overload.py [--rounds 3] [--seconds 8] [--compare seed=/tmp/seed-worktree ...]

``--compare NAME=PATH`` adds a server run from another checkout (a ``git worktree`` of an older commit) in
the same rounds; the current checkout is ``this``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from _harness import REPO, ServerProcess

MODEL = """
import asyncio, time

def spin(seconds):
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n

class Sync:
    def predict(self, inputs):
        started = time.time()
        time.sleep(0.05)
        return {"started": started}

class Async:
    async def predict(self, inputs):
        started = time.time()
        await asyncio.sleep(0.05)
        return {"started": started}

class Cpu:
    def predict(self, inputs):
        started = time.time()
        spin(0.05)
        return {"started": started}
"""

CONFIG = """
apis:
  - name: overload
    handler: {path: model.py, class: %s}
    max_concurrency: 1
    max_queue_length: 10
%s"""

CAPACITY = 20.0  # answers per second of a 50 ms call, one at a time
BODY = b'{"x": 1}'
REQUEST = (
    b"POST /overload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
)


# --- the client (run as a subprocess on its own CPU) -------------------------------------------------------


async def _exchange(conn: list, record: list) -> None:
    reader, writer = conn
    sent = time.time()
    writer.write(REQUEST)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    close = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"connection" and value.strip().lower() == b"close":
            close = True
    body = await reader.readexactly(length) if length else b""
    done = time.time()
    started = json.loads(body)["started"] if status == 200 else 0.0
    record.append((sent, done, status, started))
    if close:
        writer.close()
        conn[:] = await asyncio.open_connection("127.0.0.1", _PORT)


_PORT = 0


async def _closed(clients: int, seconds: float, record: list) -> None:
    deadline = time.monotonic() + seconds

    async def client() -> None:
        conn = list(await asyncio.open_connection("127.0.0.1", _PORT))
        while time.monotonic() < deadline:
            await _exchange(conn, record)
        conn[1].close()

    await asyncio.wait_for(asyncio.gather(*(client() for _ in range(clients))), seconds + 20)


async def _open(rate: float, seconds: float, record: list) -> None:
    idle: list[list] = []
    tasks: set[asyncio.Task] = set()
    start = time.monotonic()
    n = int(rate * seconds)

    async def one() -> None:
        conn = idle.pop() if idle else list(await asyncio.open_connection("127.0.0.1", _PORT))
        await _exchange(conn, record)
        idle.append(conn)

    for i in range(n):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.wait(tasks, timeout=30) if tasks else None
    for conn in idle:
        conn[1].close()


def client_main(args: argparse.Namespace) -> None:
    global _PORT
    _PORT = args.port
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    record: list = []
    started = time.time()
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    if args.flood == "closed":
        asyncio.run(_closed(args.clients, args.seconds, record))
    else:
        asyncio.run(_open(args.rate, args.seconds, record))
    after = resource.getrusage(resource.RUSAGE_SELF)
    used = after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime
    json.dump({"t0": started, "cpu": used, "record": record}, sys.stdout)


# --- the driver --------------------------------------------------------------------------------------------


@dataclass
class Result:
    goodput: float  # share of CAPACITY answered with 200
    p50_wait: float
    p99_wait: float
    refused: float  # 503s per second
    other: int  # answers that were neither 200 nor 503
    rss_mib: float
    client_cpu: float  # share of one CPU the client used


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def flood(server: ServerProcess, flood: str, seconds: float, warmup: float, pin: str | None) -> Result:
    prefix = ["taskset", "-c", pin] if pin else []
    command = [*prefix, sys.executable, __file__, "--client", "--port", str(server.port), "--flood", flood]
    command += ["--seconds", str(seconds + warmup)]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=seconds + warmup + 60)
    data = json.loads(out.stdout)
    begin = data["t0"] + warmup
    end = data["t0"] + warmup + seconds
    window = [r for r in data["record"] if begin <= r[1] < end]
    ok = [r for r in window if r[2] == 200]
    waits = [r[3] - r[0] for r in ok]
    return Result(
        goodput=len(ok) / seconds / CAPACITY,
        p50_wait=_percentile(waits, 0.5),
        p99_wait=_percentile(waits, 0.99),
        refused=sum(1 for r in window if r[2] == 503) / seconds,
        other=sum(1 for r in window if r[2] not in (200, 503)),
        rss_mib=_peak_rss_mib(server.process.pid),
        client_cpu=data["cpu"] / (seconds + warmup),
    )


def start(name: str, checkout: Path, project: Path, pin: str | None) -> ServerProcess:
    command = [sys.executable, "-m", "modelserve", str(project), "--no-access-log", "--log-level", "warning"]
    # cwd first on the path: `python -m modelserve` imports the checkout's package, not this one's.
    server = ServerProcess(name, command, cwd=checkout, pin=pin)
    server.wait_ready(lambda url: httpx.get(f"{url}/readyz").status_code == 200)
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--flood", default="closed", choices=["open", "closed"], help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=10 * CAPACITY, help="open loop: requests per second")
    parser.add_argument("--clients", type=int, default=150, help="closed loop: keep-alive clients")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per flood")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of flood before measuring")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="sync,async,cpu")
    parser.add_argument("--floods", default="open,closed")
    parser.add_argument("--compare", action="append", default=[], help="NAME=PATH of another checkout")
    parser.add_argument("--server-cpu", default="0")
    parser.add_argument("--client-cpu", default="1")
    parser.add_argument(
        "--extra", default="", help="more API keys for this checkout, as YAML (e.g. max_queue_wait: 0.5)"
    )
    args = parser.parse_args()
    if args.client:
        client_main(args)
        return

    checkouts = [(name, Path(path)) for name, path in (c.split("=", 1) for c in args.compare)]
    checkouts.append(("this", REPO))
    results: dict[tuple[str, str, str], list[Result]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.modes.split(","):
            for name, _ in checkouts:
                project = Path(tmp) / f"{mode}-{name}"
                project.mkdir()
                (project / "model.py").write_text(MODEL)
                extra = "".join(f"    {line.strip()}\n" for line in args.extra.split(";") if line.strip())
                (project / "modelserve.yaml").write_text(CONFIG % (mode.capitalize(), extra if name == "this" else ""))
        for round_ in range(args.rounds):
            for mode in args.modes.split(","):
                for name, checkout in checkouts:
                    for kind in args.floods.split(","):
                        # a fresh server for each flood: peak RSS is the flood's own
                        server = start(name, checkout, Path(tmp) / f"{mode}-{name}", args.server_cpu)
                        try:
                            result = flood(server, kind, args.seconds, args.warmup, args.client_cpu)
                        finally:
                            os.killpg(server.process.pid, signal.SIGKILL)  # no graceful shutdown to wait for
                            server.process.wait()
                        results.setdefault((mode, kind, name), []).append(result)
                        print(f"round {round_ + 1} {mode:5} {kind:6} {name:6} {result}", file=sys.stderr, flush=True)

    print(f"\nmax_concurrency 1, max_queue_length 10, 50 ms predict (capacity {CAPACITY:g}/s); ")
    print(f"open: {args.rate:g} req/s fixed arrival; closed: {args.clients} keep-alive clients; ")
    print(f"median of {args.rounds} rounds of {args.seconds:g} s (after {args.warmup:g} s of warm-up)\n")
    print("| predict | flood | server | goodput | accepted p50 wait | p99 wait | 503/s | peak RSS | client CPU |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (mode, kind, name), runs in results.items():

        def med(field: str, runs: list[Result] = runs) -> float:
            return statistics.median(getattr(r, field) for r in runs)

        other = sum(r.other for r in runs)
        print(
            f"| {mode} | {kind} | {name} | {med('goodput'):.0%} | {med('p50_wait') * 1000:.0f} ms"
            f" | {med('p99_wait') * 1000:.0f} ms | {med('refused'):.0f} | {med('rss_mib'):.0f} MiB"
            f" | {med('client_cpu'):.0%} |" + (f" ({other} other answers)" if other else "")
        )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
