"""Lingering close through real servers and raw sockets: a client whose upload is refused before its body is
read (a 503 because the line is full, a 413) reads the whole answer, Retry-After included, and then the end of
the connection, never a reset, however it goes on sending the body it had begun. The lingering ends: after
`linger_time`, after `linger_size` bytes, under uvicorn's h11 protocol too (servers in the test's process,
with limits of the test's own)."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import modelserve
from modelserve.http._protocol import LingeringH11Protocol, TransportConfig, TransportLimits
from tests.conftest import free_port, read_http_answer, serve_in_thread, write_project

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: held
            handler: {path: model.py}
            max_concurrency: 1
            max_queue_length: 0
          - name: small
            handler: {path: model.py}
            max_body_size: 1048576
    """,
    "model.py": """
        import time
        from pathlib import Path

        class Model:
            def predict(self, inputs):
                if inputs.get("hold"):
                    Path("started").touch()
                    deadline = time.monotonic() + 60
                    while not Path("release").exists() and time.monotonic() < deadline:
                        time.sleep(0.01)
                return {"ok": True}
    """,
}

BODY = int(9.9 * 1024 * 1024)  # as in the report: 9.9 MiB uploads, under the default max_body_size of 10 MiB
CLIENTS = 8


@pytest.fixture(scope="module")
def held_server(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> Iterator[Any]:
    """A server whose `held` API has its only slot taken (and no line) for as long as the tests run."""
    root = write_project(tmp_path_factory.mktemp("linger"), PROJECT)
    server = start_server_module(root)
    server.wait_ready()
    holder = connect(server.port)
    holder.sendall(request("/held", b'{"hold": true}'))
    deadline = time.monotonic() + 30
    while not (root / "started").exists():
        assert time.monotonic() < deadline, server.log
        time.sleep(0.02)
    yield server
    (root / "release").touch()
    assert read_http_answer(holder).startswith(b"HTTP/1.1 200")
    holder.close()


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=30)


def request(path: str, body: bytes, length: int | None = None) -> bytes:
    length = len(body) if length is None else length
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {length}\r\n\r\n"
    return head.encode() + body


def upload_then_read(port: int, path: str) -> bytes:
    """A client that writes its whole request before it reads (as most HTTP clients do): the whole answer,
    then the connection's end (a reset fails the test)."""
    with connect(port) as sock:
        sock.sendall(request(path, b" " * BODY))
        answer = read_http_answer(sock)
        assert sock.recv(65536) == b"", "the server sent more after its answer"
    return answer


def assert_refused(answer: bytes, status: bytes) -> None:
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 " + status), answer[:300]
    assert b"\r\nconnection: close" in head
    if status == b"503":
        assert b"\r\nretry-after: " in head


def run_clients(count: int, client: Any) -> list[Any]:
    """`client()` in `count` threads at once; their results, or the exception one of them raised."""
    results: list[Any] = [None] * count

    def run(index: int) -> None:
        try:
            results[index] = client()
        except BaseException as exc:  # noqa: B036 - handed to the test
            results[index] = exc

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results


@pytest.mark.slow
@pytest.mark.parametrize(("path", "status"), [("/held", b"503"), ("/small", b"413")], ids=["503", "413"])
def test_clients_uploading_a_refused_body_read_their_answer(held_server: Any, path: str, status: bytes) -> None:
    answers = run_clients(CLIENTS, lambda: upload_then_read(held_server.port, path))
    for answer in answers:
        assert isinstance(answer, bytes), f"{answer!r}"  # not ConnectionResetError or BrokenPipeError
        assert_refused(answer, status)


@pytest.mark.slow
def test_a_client_that_goes_on_sending_slowly_after_the_answer_reads_it(held_server: Any) -> None:
    with connect(held_server.port) as sock:
        sock.sendall(request("/held", b" " * 256 * 1024, length=BODY))
        readable, _, _ = select.select([sock], [], [], 30)
        assert readable, "no answer"
        for _ in range(20):  # more of the body, after the answer came and before it is read
            sock.sendall(b" " * 64 * 1024)
            time.sleep(0.01)
        answer = read_http_answer(sock)
        assert_refused(answer, b"503")
        assert sock.recv(65536) == b""


@pytest.mark.slow
def test_a_chunked_body_over_the_limit_gets_its_413_read(held_server: Any) -> None:
    chunk = b"%x\r\n%s\r\n" % (64 * 1024, b" " * (64 * 1024))
    head = b"POST /small HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    with connect(held_server.port) as sock:
        sock.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 48 + b"0\r\n\r\n")  # 3 MiB
        answer = read_http_answer(sock)
        assert_refused(answer, b"413")
        assert sock.recv(65536) == b""


@pytest.mark.slow
def test_a_refused_upload_leaves_the_server_serving(held_server: Any) -> None:
    """A client that sends its headers and never its body is let go (the lingering is bounded in time), and
    other requests are answered meanwhile."""
    with connect(held_server.port) as silent:
        silent.sendall(request("/small", b"", length=BODY))  # declared too large: refused before any body
        assert_refused(read_http_answer(silent), b"413")
        with connect(held_server.port) as other:
            other.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert read_http_answer(other).startswith(b"HTTP/1.1 200")
        assert silent.recv(65536) == b""  # our side was shut down after the answer


# --------------------------------------------------------------------------------------------------
# servers in the test's process: the bounds, and uvicorn's h11 protocol


class Echo:
    def predict(self, inputs: Any) -> Any:
        return inputs


@contextlib.contextmanager
def in_process(protocol: str, limits: TransportLimits) -> Iterator[int]:
    """A uvicorn server with modelserve's httptools or h11 protocol and `limits`, in a thread; its port."""
    app = modelserve.create_app(handler=Echo, name="small", max_body_size=1024 * 1024)
    port = free_port()
    settings: dict[str, Any] = {} if protocol == "httptools" else {"http": LingeringH11Protocol}
    config = TransportConfig(app, limits=limits, host="127.0.0.1", port=port, log_level="warning", **settings)
    with serve_in_thread(config, ready=True):
        yield port


def send_until_closed(sock: socket.socket, limit: int) -> int:
    """Send up to `limit` bytes in 64 KiB pieces until the server closes; how many were sent."""
    sent = 0
    piece = b" " * 64 * 1024
    with contextlib.suppress(OSError):  # reset, broken pipe, or a window that never drains (timeout)
        while sent < limit:
            sock.sendall(piece)
            sent += len(piece)
    return sent


@pytest.mark.parametrize("protocol", ["httptools", "h11"])
def test_clients_uploading_a_refused_body_read_their_answer_under_each_protocol(protocol: str) -> None:
    with in_process(protocol, TransportLimits()) as port:
        answers = run_clients(CLIENTS, lambda: upload_then_read(port, "/small"))
    for answer in answers:
        assert isinstance(answer, bytes), f"{answer!r}"
        assert_refused(answer, b"413")


@pytest.mark.parametrize("protocol", ["httptools", "h11"])
def test_the_lingering_ends_after_linger_size_bytes(protocol: str) -> None:
    declared = 512 * 1024 * 1024
    with in_process(protocol, TransportLimits(linger_size=1024 * 1024)) as port, connect(port) as sock:
        sock.sendall(request("/small", b"", length=declared))
        assert_refused(read_http_answer(sock), b"413")
        sent = send_until_closed(sock, declared)
    assert sent < 64 * 1024 * 1024, sent  # 1 MiB dropped, and what the kernels' buffers held


@pytest.mark.parametrize("protocol", ["httptools", "h11"])
def test_the_lingering_ends_after_linger_time(protocol: str) -> None:
    with in_process(protocol, TransportLimits(linger_time=0.2)) as port, connect(port) as sock:
        sock.sendall(request("/small", b"", length=BODY))
        assert_refused(read_http_answer(sock), b"413")
        stop = time.monotonic() + 60  # the test's own bound, so that a lingering that never ends fails it
        with contextlib.suppress(OSError):
            while time.monotonic() < stop:  # 1 KiB every 20 ms: the declared body would take minutes
                sock.sendall(b" " * 1024)
                time.sleep(0.02)
        assert time.monotonic() < stop, "the server still reads a refused body"
