"""Admission before work: a request that will be refused is refused before its body is read (real server)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import write_project

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: busy
            handler: {path: model.py}
            max_concurrency: 1
            max_queue_length: 0
          - name: bytes
            handler: {path: model.py}
            max_concurrency: 1
            max_queue_length: 10
            max_queued_bytes: 1000
          - name: small
            handler: {path: model.py}
            max_body_size: 100
    """,
    "model.py": """
        import asyncio


        class Model:
            async def predict(self, inputs):
                await asyncio.sleep(inputs.get("sleep", 0))
                return {"got": len(inputs.get("pad", ""))}
    """,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> Any:
    root = write_project(tmp_path_factory.mktemp("admission"), PROJECT)
    started = start_server_module(root)
    started.wait_ready()
    return started


def headers_only(url: str, path: str, length: int) -> socket.socket:
    """Send a POST's headers announcing `length` bytes, and none of the body."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n".encode()
    )
    return sock


def read_answer(sock: socket.socket) -> tuple[str, str]:
    """(status line and headers, body) of the answer, read up to its Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
    )
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    return head.decode("latin-1"), body.decode("utf-8")


def wait_gauge(url: str, gauge: str, api: str, value: int) -> None:
    deadline = time.monotonic() + 5
    line = f'modelserve_{gauge}{{api="{api}"}} {float(value)}'
    while time.monotonic() < deadline:
        if line in httpx.get(f"{url}/metrics").text:
            return
        time.sleep(0.02)
    raise AssertionError(f"{line} never showed in /metrics")


def in_background(url: str, api: str, body: dict[str, Any]) -> tuple[threading.Thread, list[httpx.Response]]:
    answers: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answers.append(httpx.post(f"{url}/{api}", json=body, timeout=10)))
    thread.start()
    return thread, answers


def occupy(url: str, api: str, seconds: float) -> threading.Thread:
    """Hold the API's only slot for `seconds` from another thread; returns once the call runs."""
    thread, _ = in_background(url, api, {"sleep": seconds})
    wait_gauge(url, "requests_in_flight", api, 1)
    return thread


def test_a_full_queue_refuses_before_the_body_is_sent(server: Any) -> None:
    holder = occupy(server.url, "busy", 1.5)
    sock = headers_only(server.url, "/busy", 5_000_000)  # 5 MB announced, not a byte sent
    try:
        head, body = read_answer(sock)
    finally:
        sock.close()
    holder.join()
    assert head.startswith("HTTP/1.1 503"), head
    assert "retry-after: 1" in head.lower()
    assert "too many requests waiting" in body


def test_the_bytes_held_by_waiting_requests_are_bounded(server: Any) -> None:
    holder = occupy(server.url, "bytes", 1.5)
    waiter, answers = in_background(server.url, "bytes", {"pad": "x" * 800})  # ~812 bytes wait in line
    wait_gauge(server.url, "requests_waiting", "bytes", 1)
    sock = headers_only(server.url, "/bytes", 300)  # 812 + 300 > max_queued_bytes 1000
    try:
        head, body = read_answer(sock)
    finally:
        sock.close()
    holder.join()
    waiter.join()
    assert head.startswith("HTTP/1.1 503"), head
    assert "max_queued_bytes 1000" in body
    assert answers[0].status_code == 200 and answers[0].json() == {"got": 800}
    answer = httpx.post(server.url + "/bytes", json={"pad": "y" * 1900})
    assert answer.status_code == 200  # nothing waits now: the bound is on bytes waiting, not on one body


def test_a_declared_length_over_the_limit_is_413_before_the_body(server: Any) -> None:
    sock = headers_only(server.url, "/small", 10_000)
    try:
        head, body = read_answer(sock)
    finally:
        sock.close()
    assert head.startswith("HTTP/1.1 413"), head
    assert "larger than the limit of 100 bytes" in body


def test_config_refuses_a_bad_max_queued_bytes(tmp_path: Path) -> None:
    from modelserve.config import parse_project
    from modelserve.errors import ConfigError

    with pytest.raises(ConfigError, match="max_queued_bytes"):
        parse_project({"apis": [{"name": "a", "handler": {"path": "m.py"}, "max_queued_bytes": 0}]}, tmp_path)
