"""Cancellation latency: from the client closing its socket to the user code's `finally`.

Serves a small project with four kinds of slow work (an async predict, an async generator, a sync generator
advanced in the thread pool, and a sync stage polling `modelserve.is_cancelled()`), drops the connection
mid-work many times, and prints the latency percentiles per kind.

    python benchmarks/cancellation.py [--trials 30]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx
from _harness import free_port

MODEL = """
import asyncio, time
from pathlib import Path
import modelserve

def done(case):
    with Path("finally.log").open("a") as f:
        f.write(f"{case} {time.time()!r}\\n")

class Model:
    async def predict(self, inputs):
        case = inputs["case"]
        if case == "async_predict":
            try:
                await asyncio.sleep(30)
            finally:
                done(case)
        if case == "async_stream":
            return self.astream(case)
        if case == "sync_stream":
            return self.sstream(case)

    async def astream(self, case):
        try:
            while True:
                yield "x"
                await asyncio.sleep(0.01)
        finally:
            done(case)

    def sstream(self, case):
        try:
            while True:
                yield "x"
                time.sleep(0.01)
        finally:
            done(case)
"""

SYNC_MODEL = """
import time
from pathlib import Path
import modelserve

class Model:
    def predict(self, inputs):
        try:
            while not modelserve.is_cancelled():
                time.sleep(0.001)
        finally:
            with Path("finally.log").open("a") as f:
                f.write(f"sync_stage {time.time()!r}\\n")
        return None
"""

CASES = ["async_predict", "async_stream", "sync_stream", "sync_stage"]


def start(project: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "modelserve", str(project), "--port", str(port), "--log-level", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz").status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    process.kill()
    raise RuntimeError("server did not start")


def one_trial(url: str, project: Path, case: str) -> float:
    log = project / "finally.log"

    def finished() -> list[str]:
        return [line for line in log.read_text().splitlines() if line.split()[0] == case] if log.exists() else []

    before = len(finished())
    port = int(url.rsplit(":", 1)[1])
    body = f'{{"case": "{case}"}}'.encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    if "stream" in case:
        sock.recv(1024)  # the stream has started
    time.sleep(0.1)  # the work is under way
    closed = time.time()
    sock.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        lines = finished()
        if len(lines) > before:
            return float(lines[-1].split()[1]) - closed
        time.sleep(0.001)
    raise RuntimeError(f"{case}: finally never ran")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, source, cases in (("async", MODEL, CASES[:3]), ("sync", SYNC_MODEL, CASES[3:])):
            project = Path(tmp, name)
            project.mkdir()
            (project / "model.py").write_text(textwrap.dedent(source))
            process, url = start(project)
            try:
                for case in cases:
                    latencies = sorted(one_trial(url, project, case) * 1000 for _ in range(args.trials))
                    p90 = latencies[int(0.9 * len(latencies)) - 1]
                    rows.append((case, statistics.median(latencies), p90, latencies[-1]))
            finally:
                process.terminate()
                process.wait(10)
    print(f"cancellation latency over {args.trials} trials (ms, client close -> user finally), cpu={os.cpu_count()}")
    print(f"{'case':<14}{'p50':>8}{'p90':>8}{'max':>8}")
    for case, p50, p90, worst in rows:
        print(f"{case:<14}{p50:>8.1f}{p90:>8.1f}{worst:>8.1f}")


if __name__ == "__main__":
    main()
