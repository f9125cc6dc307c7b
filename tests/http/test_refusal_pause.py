"""The refusal pause through a real server and raw keep-alive sockets: after a 503 because the line was full,
the connection's next request is not read sooner than ``--refusal-pause`` seconds after it; it is then read
and answered (nothing is dropped), and other connections, a request that comes later anyway, the request
after a success and ``--refusal-pause 0`` are not held."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import read_http_answer, write_project

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: slow
            handler: {path: model.py}
            max_concurrency: 1
            max_queue_length: 0
    """,
    "model.py": """
        import os
        import time

        class Model:
            def predict(self, inputs):
                while "gate" in inputs and not os.path.exists(inputs["gate"]):  # held until the test makes it
                    time.sleep(0.005)
                time.sleep(inputs["sleep"])
                return {"slept": inputs["sleep"]}
    """,
}

PAUSE = 0.6


def request(path: str = "/slow", sleep: float = 0.0, gate: Path | None = None) -> bytes:
    body = json.dumps({"sleep": sleep} | ({"gate": str(gate)} if gate else {})).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def wait_running(server: Any) -> None:
    """Wait until the server's gauge shows the only slot taken (a fixed sleep bets on how soon a busy machine
    reads the request)."""
    deadline = time.monotonic() + 30
    while 'modelserve_requests_in_flight{api="slow"} 1.0' not in httpx.get(server.url + "/metrics").text:
        assert time.monotonic() < deadline, server.log
        time.sleep(0.01)


def start(start_server: Any, tmp_path: Path, pause: float) -> Any:
    server = start_server(write_project(tmp_path, PROJECT), "--refusal-pause", str(pause))
    server.wait_ready()
    return server


@pytest.mark.slow
def test_a_connection_refused_for_a_full_line_is_read_again_after_the_pause(start_server: Any, tmp_path: Path) -> None:
    server = start(start_server, tmp_path, PAUSE)
    gate = tmp_path / "gate"
    with connect(server.port) as busy, connect(server.port) as refused, connect(server.port) as other:
        # Holds the only slot until the paused connection was refused again (a sleep of 3 pauses ran out
        # first on a busy machine, and the paused request was served).
        busy.sendall(request(gate=gate))
        wait_running(server)
        refused.sendall(request())
        assert read_http_answer(refused).startswith(b"HTTP/1.1 503"), "the line is full"
        answered = time.monotonic()
        refused.sendall(request())  # sent at once: waits in the connection, unread, for the pause
        # Another connection is not paused: its request is read and answered while the first one waits.
        other.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_http_answer(other).startswith(b"HTTP/1.1 200")
        assert time.monotonic() - answered < PAUSE, "the other connection's answer came after the pause"
        again = read_http_answer(refused)
        assert time.monotonic() - answered >= PAUSE * 0.9, "the paused connection was read before its pause ended"
        assert again.startswith(b"HTTP/1.1 503"), "the slot is still held: refused again, not dropped"
        gate.touch()
        assert read_http_answer(busy).startswith(b"HTTP/1.1 200")
        # Once the slot is free the same connection's request is served; it comes a pause after the last
        # refusal, so it is not held.
        time.sleep(PAUSE)
        began = time.monotonic()
        refused.sendall(request())
        assert read_http_answer(refused).startswith(b"HTTP/1.1 200")
        assert time.monotonic() - began < PAUSE / 2
        began = time.monotonic()
        for _ in range(5):  # a success is not followed by a pause
            refused.sendall(request())
            assert read_http_answer(refused).startswith(b"HTTP/1.1 200")
        assert time.monotonic() - began < 5 * PAUSE / 2


@pytest.mark.slow
def test_a_pause_of_zero_leaves_refused_connections_read_at_once(start_server: Any, tmp_path: Path) -> None:
    server = start(start_server, tmp_path, 0)
    gate = tmp_path / "gate"
    with connect(server.port) as busy, connect(server.port) as refused:
        busy.sendall(request(gate=gate))  # holds the only slot until the refusals are done
        wait_running(server)
        began = time.monotonic()
        for _ in range(20):  # 20 refusals in a row take far less than 20 pauses would
            refused.sendall(request())
            assert read_http_answer(refused).startswith(b"HTTP/1.1 503")
        assert time.monotonic() - began < 20 * PAUSE / 2
        gate.touch()
        assert read_http_answer(busy).startswith(b"HTTP/1.1 200")


def test_the_refusal_pause_must_be_a_short_time(tmp_path: Path) -> None:
    root = write_project(tmp_path, PROJECT)
    for value in ("-1", "5"):
        done = subprocess.run(
            [sys.executable, "-m", "modelserve", str(root), "--refusal-pause", value],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert "argument --refusal-pause: expected a number of seconds from 0 to 1" in done.stderr
