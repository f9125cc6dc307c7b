"""What the HTTP benchmarks share: servers on free loopback ports, wrk runs, and their results.

Each benchmark starts every server it compares as its own process (`ServerProcess`), loads it with wrk
(`wrk`, through a lua script from `write_wrk_script` that posts one JSON body and prints a parsable
result line), and reports the median of its runs (`median_run`) with the CPU time the server's processes
spent per request (`ServerProcess.cpu_seconds`), steadier than req/s on a machine other work shares.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_LUA = """
wrk.method = "POST"
%s
%s
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %%d %%d %%d %%d %%d %%d\\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(99), e.status, e.connect + e.read + e.write + e.timeout))
end
"""
_RESULT = re.compile(r"RESULT (\d+) (\d+) (\d+) (\d+) (\d+) (\d+)")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpus(pin: bool | None) -> tuple[str | None, str | None]:
    """(server CPU, wrk CPU) for a benchmark's ``--pin``: None picks pinning on machines with 2 or more cores
    and taskset. Exits when wrk is missing (every caller needs it)."""
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    if pin is None:
        pin = (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None
    return ("0", "1") if pin else (None, None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Run:
    rps: float
    p50_ms: float
    p99_ms: float
    #: CPU time the server's processes spent per answered request (user + system), in microseconds.
    cpu_us: float = 0.0
    requests: int = 0


def write_wrk_script(path: Path, body: str | bytes, headers: dict[str, str] | None = None) -> Path:
    """A wrk lua script that posts `body` (as JSON unless `headers` say otherwise) and prints the result line
    `wrk` reads. A bytes body is written beside the script, which reads it back (lua strings hold any byte)."""
    if isinstance(body, bytes):
        path.with_suffix(".body").write_bytes(body)
        source = f'local file = io.open("{path.with_suffix(".body")}", "rb")\nwrk.body = file:read("*a")\nfile:close()'
    else:
        source = f"wrk.body = '{body}'"
    lines = [
        f'wrk.headers["{key}"] = "{value}"'
        for key, value in ({"Content-Type": "application/json"} | (headers or {})).items()
    ]
    path.write_text(_LUA % (source, "\n".join(lines) + "\n"))
    return path


def wrk(url: str, script: Path, connections: int, seconds: float, pin: str | None) -> Run:
    """One wrk run (one thread, on CPU `pin` when given); a non-2xx answer or a socket error is an error."""
    prefix = ["taskset", "-c", pin] if pin else []
    command = [*prefix, "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--timeout", "10s"]
    command += ["-s", str(script), url]
    output = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 30, check=True).stdout
    match = _RESULT.search(output)
    if match is None:
        raise RuntimeError(f"wrk printed no result:\n{output}")
    requests, micros, p50, p99, bad_status, socket_errors = map(int, match.groups())
    if bad_status or socket_errors:
        raise RuntimeError(f"{url}: {bad_status} non-2xx answers and {socket_errors} socket errors:\n{output}")
    return Run(rps=requests / (micros / 1e6), p50_ms=p50 / 1000, p99_ms=p99 / 1000, requests=requests)


def median_run(runs: list[Run]) -> Run:
    return Run(
        rps=statistics.median(r.rps for r in runs),
        p50_ms=statistics.median(r.p50_ms for r in runs),
        p99_ms=statistics.median(r.p99_ms for r in runs),
        cpu_us=statistics.median(r.cpu_us for r in runs),
    )


def paired_ratios(runs: list[Run], base: list[Run]) -> tuple[float, float]:
    """(req/s ratio, CPU ratio) of `runs` to `base`, each the median over the rounds of the ratio within a round.

    The runs of one round are seconds apart, those of different rounds minutes: on a shared machine whose
    load drifts, the ratio of two runs side by side is steadier than the ratio of two medians.
    """
    rps = statistics.median(run.rps / other.rps for run, other in zip(runs, base, strict=True))
    cpu = statistics.median(other.cpu_us / run.cpu_us for run, other in zip(runs, base, strict=True) if run.cpu_us)
    return rps, cpu


def session_cpu_seconds(session: int) -> float:
    """User + system CPU seconds of every live process of a session (a server and what it started; Linux)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # the process ended meanwhile
            continue
        if int(fields[3]) == session:  # after the name: state, ppid, pgrp, session, ...; utime and stime
            total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


class ServerProcess:
    """A server process on a free loopback port, in a session of its own (stopped with all it started).

    ``{port}`` in `command` is replaced by the port; without one, ``--port PORT`` is appended. The repository
    comes first on the path, so that a checkout runs without being installed. Output goes to `log` (a file)
    when given, else is discarded (stderr is kept for the error message of a server that exits early).
    """

    def __init__(self, name: str, command: list[str], cwd: Path, pin: str | None, log: Path | None = None) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        port = str(self.port)
        if any("{port}" in part for part in command):
            command = [part.replace("{port}", port) for part in command]
        else:
            command = [*command, "--port", port]
        prefix = ["taskset", "-c", pin] if pin else []
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
        self.log = log
        self._log_file = open(log, "wb") if log is not None else None  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [*prefix, *command],
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": path},
            stdout=self._log_file or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if self._log_file else subprocess.PIPE,
            start_new_session=True,  # LitServe starts processes of its own: stop() ends the whole group
        )

    def output(self) -> str:
        if self.log is not None:
            return self.log.read_text(errors="replace")[-3000:]
        return self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""

    def wait_ready(self, probe: Callable[[str], bool], timeout: float = 120) -> None:
        """Call `probe(url)` until it returns True (transport errors count as not yet)."""
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.output()}")
            try:
                if probe(self.url):
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not answer within {timeout:g} s")

    def cpu_seconds(self) -> float:
        return session_cpu_seconds(self.process.pid)

    def stop(self) -> None:
        for sig in (15, 9):  # SIGTERM, then whatever of the group is left
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            if sig == 15:
                try:
                    self.process.wait(15)
                except subprocess.TimeoutExpired:
                    pass
        self.process.wait()
        if self._log_file is not None:
            self._log_file.close()


def measure(server: ServerProcess, url: str, script: Path, connections: int, seconds: float, pin: str | None) -> Run:
    """One wrk run against `url`, with the server's CPU time per request."""
    cpu_before = server.cpu_seconds()
    run = wrk(url, script, connections, seconds, pin)
    run.cpu_us = (server.cpu_seconds() - cpu_before) / max(run.requests, 1) * 1e6
    return run
