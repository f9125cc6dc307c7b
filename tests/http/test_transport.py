"""Transport limits through a real server and raw sockets: header size, header and body deadlines, and a 413
that closes the connection after dropping at most `LINGER_SIZE` of the rest of a chunked body (the lingering
close, `tests/http/test_lingering_close.py`) instead of reading all of it. The limits reach the protocol through
`TransportConfig`, in every worker of ``--workers``."""

from __future__ import annotations

import pickle
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from modelserve.http._protocol import LINGER_SIZE, TransportConfig, TransportLimits, transport_protocol
from tests.conftest import read_http_answer, write_project

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: echo
            handler: {path: model.py}
            max_body_size: 1048576
          - name: small  # a body over its limit is over it at the first chunk, long before the body timeout
            handler: {path: model.py}
            max_body_size: 65536
    """,
    "model.py": """
        class Model:
            def predict(self, inputs):
                return inputs
    """,
}

TIMEOUT = 1.0
#: A connection cut off by its deadline is closed after TIMEOUT, and before this: far from the end of a trickle
#: (a byte every 0.2 s: 20 s) or of the client's own socket timeout (10 s), and leaving a busy machine 7 s.
CUT_OFF = TIMEOUT + 7


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> Any:
    root = write_project(tmp_path_factory.mktemp("transport"), PROJECT)
    args = ["--header-timeout", str(TIMEOUT), "--body-timeout", str(TIMEOUT), "--max-header-size", "8192"]
    started = start_server_module(root, *args)
    started.wait_ready()
    return started


def connect(server: Any) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def trickle(sock: socket.socket, data: bytes, every: float, stop: threading.Event) -> threading.Thread:
    """Send `data` a byte every `every` seconds until it is sent, the server closes, or `stop` is set."""

    def run() -> None:
        for byte in data:
            if stop.wait(every):
                return
            try:
                sock.send(bytes([byte]))
            except OSError:
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def headers(length: int | None = None, extra: str = "", path: str = "/echo") -> bytes:
    framing = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}{framing}\r\n".encode()


def test_requests_within_the_limits_are_served_on_one_connection(server: Any) -> None:
    with connect(server) as sock:
        for _ in range(3):
            sock.sendall(headers(2) + b"{}")
            answer = read_http_answer(sock)
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"{}"), answer


@pytest.mark.parametrize("at_once", [0, 38], ids=["from-the-first-byte", "after-the-first-line"])
def test_a_client_slow_to_send_its_headers_is_cut_off_after_the_timeout(server: Any, at_once: int) -> None:
    stop = threading.Event()
    request = b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100
    with connect(server) as sock:
        started = time.monotonic()
        sock.sendall(request[:at_once])
        trickle(sock, request[at_once:], 0.2, stop)  # a byte every 0.2 s: never done in time
        answer = read_until_closed(sock)
        elapsed = time.monotonic() - started
        stop.set()
    assert answer == b""
    assert TIMEOUT * 0.9 < elapsed < CUT_OFF


def test_an_idle_keep_alive_connection_with_half_a_request_is_closed(server: Any) -> None:
    with connect(server) as sock:
        sock.sendall(headers(2) + b"{}")
        assert read_http_answer(sock).startswith(b"HTTP/1.1 200")
        started = time.monotonic()
        sock.sendall(b"POST /echo HTTP/1.1\r\n")  # the next request's first line, and nothing more
        assert read_until_closed(sock) == b""
        assert time.monotonic() - started < CUT_OFF


def test_a_client_slow_to_send_its_body_is_cut_off_after_the_timeout(server: Any) -> None:
    stop = threading.Event()
    with connect(server) as sock:
        sock.sendall(headers(100) + b'{"x": "')
        started = time.monotonic()
        trickle(sock, b"a" * 100, 0.2, stop)
        answer = read_until_closed(sock)
        elapsed = time.monotonic() - started
        stop.set()
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer
    assert TIMEOUT * 0.9 < elapsed < CUT_OFF


def test_a_chunked_body_over_the_limit_gets_413_and_the_rest_is_not_all_read(server: Any) -> None:
    # To /small (64 KiB): with /echo's 1 MiB, a busy machine may take longer than the 1 s body timeout to read a
    # MiB of chunks (seen with granian's edge: a 408).
    chunk = b"%x\r\n%s\r\n" % (64 * 1024, b" " * (64 * 1024))
    sent = 0
    with connect(server) as sock:
        sock.settimeout(10)
        sock.sendall(headers(None, path="/small"))
        try:
            for _ in range(200 * 16):  # 200 MiB, unless the server stops reading
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:  # reset, broken pipe, or a full window that never drains (timeout)
            pass
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"connection: close" in answer.lower()
    # The limit (64 KiB), what the lingering close drops and what the kernels' buffers hold on loopback;
    # draining would take all 200 MiB.
    assert sent < LINGER_SIZE + 32 * 1024 * 1024, sent


def test_a_declared_length_over_the_limit_gets_413_and_closes(server: Any) -> None:
    with connect(server) as sock:
        sock.sendall(headers(50 * 1024 * 1024))
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"connection: close" in answer.lower()


def test_an_oversized_header_block_is_refused(server: Any) -> None:
    with connect(server) as sock:
        sock.sendall(headers(2, extra="X-Big: " + "a" * 20_000 + "\r\n") + b"{}")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]


def test_headers_still_arriving_past_the_limit_are_cut_off(server: Any) -> None:
    sent = 0
    with connect(server) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        try:
            for i in range(8000):  # 8000 headers of 1 KiB: 8 MiB, never ended
                sock.sendall(b"X-H%d: %s\r\n" % (i, b"a" * 1024))
                sent += 1024
        except OSError:
            pass
        answer = read_until_closed(sock)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 4"), answer[:200]
    # Cut off long before the end. What the client could send before the close reached it depends on the kernel's
    # buffers (the server's receive buffer grows while it reads), not on the server: measured 0.1-1.2 MiB.
    assert sent < 4 * 1024 * 1024, sent


def test_the_limits_and_the_protocol_travel_with_the_config_to_the_workers() -> None:
    limits = TransportLimits(max_header_size=1000, header_timeout=2.0, linger_size=10)
    config = TransportConfig("modelserve.launch:worker_app", limits=limits, factory=True, log_config=None)
    copy = pickle.loads(pickle.dumps(config))  # as uvicorn hands it to each worker process
    assert copy.transport_limits == limits
    assert copy.http is transport_protocol()
    assert copy.h11_max_incomplete_event_size == 1000  # the header limit under h11 too


def test_each_worker_applies_the_limits_of_the_command(tmp_path: Path, start_server: Any) -> None:
    server = start_server(write_project(tmp_path, PROJECT), "--workers", "2", "--max-header-size", "8192")
    server.wait_ready()
    for _ in range(4):  # new connections, spread over the workers
        with connect(server) as sock:
            sock.sendall(headers(2, extra="X-Big: " + "a" * 20_000 + "\r\n") + b"{}")  # under the default limit
            answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    with connect(server) as sock:
        sock.sendall(headers(2) + b"{}")
        assert read_http_answer(sock).startswith(b"HTTP/1.1 200")
