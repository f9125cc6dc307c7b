"""Async jobs: submits per second, submit latency, completions per second, for each job store.

A trivial async API (a sync ``handle_async`` returning its payload; ``max_concurrency`` 4 by default,
``max_queue_length`` 100,000) is served by ``python -m modelserve DIR --no-access-log --jobs-store STORE``
for each store: ``memory``, ``sqlite`` (a file in a temporary folder) and ``redis`` (a ``redis-server`` this
script starts on a free loopback port, without persistence; skipped with a note when ``modelserve.jobs.redis``
or ``redis-server`` is missing). For each:

* **submits/s, p50, p99**: wrk posts a small JSON body (no X-Request-ID, so the server makes the ids) from
  ``--connections`` connections for ``--duration`` seconds; the worker runs the jobs meanwhile, as it would
  in production. The latency is wrk's, from request to ``{"id": ...}``.
* **completions/s**: the jobs of that run over the time from its first submit until
  ``modelserve_jobs_total{status="completed"}`` (from ``/metrics``) counts them all: the end-to-end rate,
  submitting and running together. Beside it, the completion rate while wrk submitted and the rate at which
  the backlog drained afterwards.
* **idle pick-up** (``--pickup`` jobs, 15 by default): jobs submitted one at a time to the idle server, each on
  a new connection; the median and the longest time from the submit's answer to the job's start (the
  handler's clock). The process that took a submit is woken by it; with ``--workers N`` another one may
  claim the job first, at its next poll of the store (every 20 ms for SQLite and Redis).
* **memory per retained result** (memory store only, ``--retained`` jobs, 100,000 by default): the server's
  RSS (``VmRSS`` of ``/proc/<pid>/status``) before submitting and once every job has completed, the
  difference divided by the number of jobs (their records are kept for ``result_ttl``, 7 days by default).

    python benchmarks/jobs.py [--duration 5] [--connections 64] [--retained 100000]
                              [--stores memory,sqlite,redis] [--max-concurrency 4] [--workers 1] [--pin]
                              [--pickup 15]

``--pin`` (the default on machines with 2 or more cores) runs the server on CPU 0 and wrk (and redis-server)
on CPU 1, so that the load generator does not steal the server's core. ``--workers 2`` serves the durable
stores with two processes (unpinned; the memory store is refused with more than one).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from _harness import free_port
from _harness import wrk as harness_wrk

REPO = Path(__file__).resolve().parent.parent
BODY = '{"text": "hello world", "values": [1, 2, 3, 4], "flag": true}'

HANDLER = """
import time


class Handler:
    def handle_async(self, payload):
        if "pickup" in payload:  # the idle pick-up's jobs: when the job started
            return {"started": time.time()}
        return payload
"""

PROJECT = """
apis:
  - name: echo
    kind: async
    handler: {path: handler.py}
    max_concurrency: {max_concurrency}
    max_queue_length: 100000
"""

# `limit` stops the run after that many answers (0: run for the whole duration).
LUA = """
wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
local limit = %d
local answered = 0

response = function(status, headers, body)
  answered = answered + 1
  if limit > 0 and answered >= limit then wrk.thread:stop() end
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %%d %%d %%d %%d %%d %%d\\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), e.status, e.connect + e.read + e.write + e.timeout))
end
"""

_JOBS = re.compile(r'^modelserve_jobs_total\{api="echo",status="(\w+)"\} ([0-9.e+]+)$', re.MULTILINE)


@dataclass
class Submits:
    rate: float
    p50_ms: float
    p99_ms: float


@dataclass
class Row:
    store: str
    submits: Submits | None = None
    #: Jobs submitted over the time from the first submit until all of them completed.
    completions: float | None = None
    #: Jobs completed per second while wrk submitted, and afterwards while the backlog drained.
    during: float | None = None
    drain: float | None = None
    jobs: int = 0
    note: str = ""
    #: Milliseconds from a submit's answer to its job's start on an idle server (`pickup`).
    pickup_ms: list[float] | None = None


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


class Redis:
    """A throwaway redis-server on a free loopback port, without persistence."""

    def __init__(self, pin: str | None) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        prefix = ["taskset", "-c", pin] if pin else []
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen([*prefix, *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not listen within 10 s")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


class Server:
    """``python -m modelserve`` serving the trivial async API on a free loopback port."""

    def __init__(self, project: Path, store: str, workers: int, pin: str | None, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        prefix = ["taskset", "-c", pin] if pin else []
        # The repository first on the path, so that a checkout runs without being installed.
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        command = [sys.executable, "-m", "modelserve", str(project), "--port", str(self.port), "--no-access-log"]
        command += ["--log-level", "warning", "--jobs-store", store, "--workers", str(workers)]
        self._log = log.open("wb")
        self.log = log
        self.process = subprocess.Popen(
            [*prefix, *command], env={**os.environ, "PYTHONPATH": path}, stdout=self._log, stderr=subprocess.STDOUT
        )
        self.client = httpx.Client(base_url=self.url, timeout=10)

    def wait_ready(self) -> None:
        """Wait until /readyz answers 200, on fresh connections 20 times in a row (so from every worker)."""
        deadline = time.monotonic() + 60
        streak = 0
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log.read_text()}")
            try:
                streak = streak + 1 if httpx.get(self.url + "/readyz").status_code == 200 else 0
            except httpx.TransportError:
                streak = 0
            if streak >= 20:
                return
            time.sleep(0.05 if streak == 0 else 0.01)
        raise RuntimeError(f"server was not ready within 60 s:\n{self.log.read_text()}")

    def jobs(self) -> dict[str, int]:
        """modelserve_jobs_total by status, summed over the workers."""
        text = self.client.get("/metrics").text
        return {status: int(float(value)) for status, value in _JOBS.findall(text)}

    def wait_completed(self, target: int, timeout: float) -> float:
        """Poll /metrics until `target` jobs completed; the moment they had (time.perf_counter)."""
        deadline = time.monotonic() + timeout
        while True:
            counts = self.jobs()
            moment = time.perf_counter()
            if counts.get("completed", 0) >= target:
                return moment
            if counts.get("failed", 0):
                raise RuntimeError(f"{counts['failed']} job(s) failed:\n{self.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {counts.get('completed', 0)} of {target} jobs completed within {timeout} s")
            time.sleep(0.01)

    def stop(self) -> None:
        self.client.close()
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


def wrk(url: str, script: Path, connections: int, seconds: float, pin: str | None) -> tuple[int, Submits]:
    """Run wrk against the submit route; the requests it made and their rate and latency."""
    run = harness_wrk(url + "/echo", script, connections, seconds, pin)
    return run.requests, Submits(rate=run.rps, p50_ms=run.p50_ms, p99_ms=run.p99_ms)


def write_script(root: Path) -> Path:
    script = root / "submit.lua"
    script.write_text(LUA % (BODY, 0))
    return script


def write_project(root: Path, max_concurrency: int = 4) -> Path:
    project = root / "project"
    project.mkdir()
    (project / "handler.py").write_text(HANDLER.lstrip())
    (project / "modelserve.yaml").write_text(PROJECT.replace("{max_concurrency}", str(max_concurrency)).lstrip())
    return project


def measure(server: Server, script: Path, args: argparse.Namespace, pin: str | None) -> Row:
    url = server.url
    wrk(url, script, 16, 1.0, pin)  # warm up
    server.wait_completed(server.jobs().get("in_queue", 0), timeout=300)

    before = server.jobs()
    started = time.perf_counter()
    _, submits = wrk(url, script, args.connections, args.duration, pin)
    submitted_at = time.perf_counter()
    after = server.jobs()
    submitted = after.get("in_queue", 0) - before.get("in_queue", 0)
    done = before.get("completed", 0) + submitted
    ended = server.wait_completed(done, timeout=600)
    during = (after.get("completed", 0) - before.get("completed", 0)) / (submitted_at - started)
    drain = (done - after.get("completed", 0)) / max(ended - submitted_at, 1e-9)
    return Row("", submits, submitted / (ended - started), during, drain, submitted)


def pickup(server: Server, count: int) -> list[float]:
    """Milliseconds from each submit's answer to its job's start, `count` jobs submitted one at a time to the
    idle server, each on a new connection (with ``--workers N``, to any worker: the one that took the submit is
    woken by it, the others poll the store). Negative: the job started before the answer reached the client."""
    delays = []
    for n in range(count):
        time.sleep(0.1)  # idle again
        with httpx.Client(base_url=server.url, timeout=10) as client:
            job_id = client.post("/echo", json={"pickup": n}).json()["id"]
        answered = time.time()
        deadline = time.monotonic() + 30
        while True:
            job = server.client.get(f"/echo/{job_id}").json()
            if job["status"] == "completed":
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job_id} did not complete within 30 s: {job}")
            time.sleep(0.005)
        delays.append((job["result"]["started"] - answered) * 1000)
    return delays


def retained_memory(project: Path, root: Path, count: int, pin: str | None, connections: int) -> tuple[float, int]:
    """Bytes of RSS per completed job kept by the memory store, and the RSS growth in KiB."""
    server = Server(project, "memory", 1, pin, root / "memory-retained.log")
    try:
        server.wait_ready()
        wrk(server.url, root / "submit.lua", 16, 1.0, pin)  # warm up: imports, caches, first allocations
        first = server.jobs().get("in_queue", 0)
        server.wait_completed(first, timeout=300)
        before = rss_kib(server.process.pid)
        # wrk runs for its whole duration even when the script stops sending: submit in 5 s rounds, each
        # stopping at what is left to submit (minus the requests still in flight when it stops).
        submitted = 0
        while submitted < count:
            script = root / "retain.lua"
            script.write_text(LUA % (BODY, max(1, count - submitted - connections)))
            wrk(server.url, script, min(connections, count - submitted), 5, pin)
            submitted = server.jobs().get("in_queue", 0) - first
            server.wait_completed(first + submitted, timeout=600)  # keep the queue short: measure results only
        after = rss_kib(server.process.pid)
    finally:
        server.stop()
    return (after - before) * 1024 / submitted, after - before


def redis_available() -> str | None:
    """None when the redis store can run here, else why not."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # a checkout runs without being installed
    try:
        import redis  # noqa: F401

        import modelserve.jobs.redis  # noqa: F401
    except ImportError as exc:
        return f"skipped: cannot import the redis store ({exc})"
    if shutil.which("redis-server") is None:
        return "skipped: redis-server is not installed (apt-get install redis-server)"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5, help="seconds of the submit run (default 5)")
    parser.add_argument("--connections", type=int, default=64, help="wrk connections (default 64)")
    parser.add_argument("--retained", type=int, default=100000, help="jobs of the memory run (0 to skip)")
    parser.add_argument("--stores", default="memory,sqlite,redis", help="comma-separated")
    parser.add_argument("--max-concurrency", type=int, default=4, help="of the API (default 4)")
    parser.add_argument("--workers", type=int, default=1, help="server processes for sqlite and redis (default 1)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None, help="server on CPU 0, wrk on 1")
    parser.add_argument("--pickup", type=int, default=15, help="jobs of the idle pick-up, one at a time (0 to skip)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    pin = args.pin if args.pin is not None else (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None
    pin = pin and args.workers == 1
    server_cpu, client_cpu = ("0", "1") if pin else (None, None)

    # Other processes on the machine skew every figure: the load average is printed with the table.
    load_before = os.getloadavg()[0]
    rows: list[Row] = []
    retained: tuple[float, int] | None = None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        project = write_project(root, args.max_concurrency)
        script = write_script(root)
        for store in args.stores.split(","):
            workers = 1 if store == "memory" else args.workers
            label = store if workers == 1 else f"{store} x{workers}"
            redis: Redis | None = None
            if store == "redis":
                reason = redis_available()
                if reason is not None:
                    rows.append(Row(label, note=reason))
                    continue
                redis = Redis(client_cpu)
                url = redis.url
            elif store == "sqlite":
                url = "sqlite"
                shutil.rmtree(project / ".modelserve", ignore_errors=True)
            else:
                url = store
            server = Server(project, url, workers, server_cpu, root / f"{store}.log")
            try:
                server.wait_ready()
                row = measure(server, script, args, client_cpu)
                row.store = label
                if args.pickup:
                    row.pickup_ms = pickup(server, args.pickup)
                rows.append(row)
            finally:
                server.stop()
                if redis is not None:
                    redis.stop()
        if args.retained and "memory" in args.stores.split(","):
            retained = retained_memory(project, root, args.retained, server_cpu, args.connections)

    print(
        f"modelserve async jobs: trivial sync handler, max_concurrency {args.max_concurrency}, "
        f"wrk -c{args.connections} for {args.duration:g} s; cpu={os.cpu_count()}, pinned={'yes' if pin else 'no'}, "
        f"python {sys.version.split()[0]}, load average before {load_before:.1f}, after {os.getloadavg()[0]:.1f}"
    )
    header = (
        f"{'store':<12}{'submits/s':>10}{'p50 ms':>8}{'p99 ms':>8}{'jobs':>8}"
        f"{'completions/s':>15}{'(while submitting':>19}{'draining)':>11}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        if row.submits is None or row.completions is None:
            print(f"{row.store:<12}  {row.note}")
            continue
        s = row.submits
        print(
            f"{row.store:<12}{s.rate:>10.0f}{s.p50_ms:>8.2f}{s.p99_ms:>8.2f}{row.jobs:>8}"
            f"{row.completions:>15.0f}{row.during:>19.0f}{row.drain:>11.0f}"
        )
    picked = [row for row in rows if row.pickup_ms]
    if picked:
        print(f"\nidle pick-up, {args.pickup} jobs one at a time: ms from the submit's answer to the job's start")
        print(f"{'store':<12}{'median':>8}{'max':>8}")
        for row in picked:
            delays = sorted(row.pickup_ms or [])
            print(f"{row.store:<12}{delays[len(delays) // 2]:>8.1f}{delays[-1]:>8.1f}")
    if retained is not None:
        per_job, growth = retained
        print(
            f"memory store, {args.retained} completed jobs retained: RSS +{growth / 1024:.1f} MiB, "
            f"{per_job:.0f} bytes per job"
        )


if __name__ == "__main__":
    main()
