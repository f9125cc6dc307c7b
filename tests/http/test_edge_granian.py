"""The same contract on both edges (``--server uvicorn`` and ``--server granian``, docs/edge.md), through a real
server of each and raw sockets: every transport limit, the disconnect of a long call, streaming, API keys and
the abuse a client may try (oversized, slow or endless headers and bodies, two Host headers, resending at once
after a full line). No test reads a clock: a deadline is shown by a connection closed before its trickle ended.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelserve.http._granian import MIN_HEADER_SIZE, EdgeLimits, _Refusals, check_limits, http1_settings
from modelserve.http._protocol import LINGER_SIZE, TransportLimits
from tests.conftest import REPO, free_port, read_http_answer, write_project

pytest.importorskip("granian")

KEY = "edge-test-key"
TIMEOUT = 1.0
PAUSE = 1.0  # the longest --refusal-pause: the order of two answers shows it

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: echo
            handler: {path: model.py}
            max_body_size: 1048576
          - name: small  # a body over its limit is over it at the first chunk, long before the body timeout
            handler: {path: model.py}
            max_body_size: 65536
          - name: stream
            handler: {path: model.py, class: Stream}
          - name: slow
            handler: {path: model.py, class: Slow}
          - name: busy
            handler: {path: model.py, class: Busy}
            max_concurrency: 1
            max_queue_length: 0
        auth:
          api_keys_env: EDGE_TEST_KEYS
    """,
    "model.py": """
        import asyncio
        import time
        from pathlib import Path

        EVENTS = Path("events.log")


        def note(text):
            with EVENTS.open("a") as f:
                f.write(text + "\\n")


        class Model:
            def predict(self, inputs):
                return inputs


        class Stream:
            async def predict(self, inputs):
                return self.tokens(inputs["n"], Path(inputs["go"]))

            async def tokens(self, n, go):
                yield {"i": 0}
                for _ in range(1200):  # the rest once the test has read the first (bounded: 60 s)
                    if go.exists():
                        break
                    await asyncio.sleep(0.05)
                for i in range(1, n):
                    yield {"i": i}


        class Slow:
            async def predict(self, inputs):
                note("slow started")
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    note("slow cancelled")
                    raise
                return {}


        class Busy:
            def predict(self, inputs):
                note("busy started")
                if inputs.get("hold"):  # until the test releases it (bounded: 60 s)
                    for _ in range(1200):
                        if Path(inputs["hold"]).exists():
                            break
                        time.sleep(0.05)
                return {}
    """,
}

MODEL = "class Model:\n    def predict(self, inputs):\n        return inputs\n"
AUTH = f"Authorization: Bearer {KEY}\r\n"


@pytest.fixture(scope="module", params=["uvicorn", "granian"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> Any:
    root = write_project(tmp_path_factory.mktemp(f"edge-{request.param}"), PROJECT)
    limits = ["--header-timeout", str(TIMEOUT), "--body-timeout", str(TIMEOUT), "--max-header-size", "8192"]
    started = start_server_module(
        root, "--server", request.param, *limits, "--refusal-pause", str(PAUSE), env={"EDGE_TEST_KEYS": KEY}
    )
    started.wait_ready()
    started.root = root
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


class Trickle:
    """Sends `data` a byte every `every` seconds until it is all sent or the server closes; `sent` counts."""

    def __init__(self, sock: socket.socket, data: bytes, every: float = 0.2) -> None:
        self.sent = 0
        self.stop = threading.Event()

        def run() -> None:
            for byte in data:
                if self.stop.wait(every):
                    return
                try:
                    sock.send(bytes([byte]))
                except OSError:
                    return
                self.sent += 1

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()


def head(path: str = "/echo", length: int | None = None, extra: str = "") -> bytes:
    framing = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    request = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{AUTH}{extra}{framing}\r\n"
    return request.encode()


def body_of(answer: bytes) -> bytes:
    return answer.split(b"\r\n\r\n", 1)[1]


def events(server: Any) -> list[str]:
    path = server.root / "events.log"
    return path.read_text().splitlines() if path.exists() else []


def wait_for(condition: Any, what: str) -> None:
    """Wait (bounded, 30 s) until `condition()` is true."""
    done = threading.Event()
    for _ in range(600):
        if condition():
            return
        done.wait(0.05)
    raise AssertionError(f"never happened: {what}")


def test_requests_within_the_limits_are_served_on_one_connection(server: Any) -> None:
    with connect(server) as sock:
        for _ in range(3):
            sock.sendall(head(length=2) + b"{}")
            answer = read_http_answer(sock)
            assert answer.startswith(b"HTTP/1.1 200") and body_of(answer) == b"{}", answer


def test_an_oversized_header_block_is_refused_and_closed(server: Any) -> None:
    with connect(server) as sock:
        sock.sendall(head(length=2, extra="X-Big: " + "a" * 20_000 + "\r\n") + b"{}")
        answer = read_until_closed(sock)
    # 400 from modelserve's protocol, 431 from hyper: a 4xx, and the connection closed after it
    assert answer.startswith(b"HTTP/1.1 4"), answer[:200]


def test_headers_still_arriving_past_the_limit_are_cut_off(server: Any) -> None:
    sent = 0
    with connect(server) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        try:
            for i in range(8000):  # 8 MiB of headers, never ended
                sock.sendall(b"X-H%d: %s\r\n" % (i, b"a" * 1024))
                sent += 1024
        except OSError:
            pass
        answer = read_until_closed(sock)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 4"), answer[:200]
    assert sent < 4 * 1024 * 1024, sent


@pytest.mark.parametrize("at_once", [0, 21], ids=["from-the-first-byte", "after-the-first-line"])
def test_a_connection_slow_to_send_its_headers_is_closed(server: Any, at_once: int) -> None:
    request = b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200  # a byte every 0.2 s: 40 s
    with connect(server) as sock:
        sock.sendall(request[:at_once])
        trickle = Trickle(sock, request[at_once:])
        answer = read_until_closed(sock)
        trickle.stop.set()
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert trickle.sent < len(request) - at_once, "the headers all came: no deadline closed the connection"


def test_a_kept_alive_connection_with_half_a_request_is_closed(server: Any) -> None:
    with connect(server) as sock:
        sock.sendall(head(length=2) + b"{}")
        assert read_http_answer(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"POST /echo HTTP/1.1\r\n")  # the next request's first line, and nothing more
        assert read_until_closed(sock) == b""


def test_a_client_slow_to_send_its_body_is_cut_off(server: Any) -> None:
    rest = b"a" * 200
    with connect(server) as sock:
        sock.sendall(head(length=207) + b'{"x": "')
        trickle = Trickle(sock, rest)
        answer = read_until_closed(sock)
        trickle.stop.set()
    assert trickle.sent < len(rest), "the body all came: no deadline closed the connection"
    # uvicorn closes the connection; granian's edge answers a JSON 408 that closes it
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]
    if answer:
        assert b"connection: close" in answer.lower() and b"body timeout" in body_of(answer)


def test_a_chunked_body_over_the_limit_gets_413_and_the_rest_is_not_all_read(server: Any) -> None:
    # To /small (64 KiB): with /echo's 1 MiB, a busy machine took longer than the 1 s body timeout to read a
    # MiB of chunks, and the answer was a 408.
    chunk = b"%x\r\n%s\r\n" % (64 * 1024, b" " * (64 * 1024))
    sent = 0
    with connect(server) as sock:
        sock.settimeout(10)
        sock.sendall(head("/small"))
        try:
            for _ in range(200 * 16):  # 200 MiB, unless the server stops reading
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"connection: close" in answer.lower() and b"larger than the limit" in answer
    assert sent < LINGER_SIZE + 32 * 1024 * 1024, sent


def test_a_declared_length_over_the_limit_gets_413_before_the_body(server: Any) -> None:
    with connect(server) as sock:
        sock.sendall(head(length=50 * 1024 * 1024))
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"connection: close" in answer.lower()


def test_two_host_headers_get_a_json_400_that_closes(server: Any) -> None:
    with connect(server) as sock:
        sock.sendall(head(length=2, extra="Host: other.example\r\n") + b"{}")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"more than one Host header" in body_of(answer)


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/echo", {}, 401),
        ("/echo", {"authorization": "Bearer not-the-key"}, 401),
        ("/echo", {"authorization": f"Bearer {KEY}"}, 200),
        ("/echo", {"x-api-key": KEY}, 200),
        ("/healthz", {}, 200),
        ("/readyz", {}, 200),
    ],
)
def test_api_keys_guard_the_apis_and_leave_the_probes_open(
    server: Any, path: str, headers: dict[str, str], status: int
) -> None:
    answer = httpx.post(server.url + path, json={"a": 1}, headers=headers) if path == "/echo" else None
    answer = answer or httpx.get(server.url + path, headers=headers)
    assert answer.status_code == status, answer.text
    if status == 401:
        assert set(answer.json()) == {"error", "request_id"}


def test_a_stream_is_sent_as_it_is_made(server: Any, tmp_path: Path) -> None:
    go = tmp_path / "go"
    headers = {"authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", server.url + "/stream", json={"n": 4, "go": str(go)}, headers=headers) as answer:
        assert answer.status_code == 200 and "content-length" not in answer.headers
        chunks = answer.iter_raw()
        assert next(chunks) == b'{"i":0}\n'  # before the generator may go on
        go.touch()
        rest = b"".join(chunks)
    assert rest == b"".join(b'{"i":%d}\n' % i for i in range(1, 4))


def test_a_lost_connection_cancels_its_call(server: Any) -> None:
    before = events(server).count("slow cancelled")
    with connect(server) as sock:
        sock.sendall(head("/slow", length=2) + b"{}")
        wait_for(lambda: events(server).count("slow started") > before, "the call started")
    wait_for(lambda: events(server).count("slow cancelled") > before, "the call was cancelled")
    metrics = httpx.get(server.url + "/metrics", headers={"x-api-key": KEY}).text
    assert 'modelserve_requests_cancelled_total{api="slow",reason="disconnect"}' in metrics


def test_a_connection_refused_for_a_full_line_waits_out_the_pause_and_is_then_served(server: Any) -> None:
    request = head("/busy", length=2) + b"{}"
    release = server.root / f"release-{threading.get_ident()}"
    hold = b'{"hold": "%s"}' % str(release).encode()
    with connect(server) as busy, connect(server) as refused, connect(server) as other:
        started = events(server).count("busy started")
        busy.sendall(head("/busy", length=len(hold)) + hold)  # holds the only slot until released
        wait_for(lambda: events(server).count("busy started") > started, "the slot was taken")
        refused.sendall(request)
        assert read_http_answer(refused).startswith(b"HTTP/1.1 503"), "the line is full"
        refused.sendall(request)  # at once: held for the pause
        other.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_http_answer(other).startswith(b"HTTP/1.1 200"), "another connection is not paused"
        refused.setblocking(False)
        with pytest.raises(BlockingIOError):  # no answer yet, after the other connection's: still held
            refused.recv(1, socket.MSG_PEEK)
        refused.settimeout(10)
        assert read_http_answer(refused).startswith(b"HTTP/1.1 503"), "read after the pause, refused, not dropped"
        release.touch()
        assert read_http_answer(busy).startswith(b"HTTP/1.1 200")
        refused.sendall(request)  # the slot is free: the same connection is served
        assert read_http_answer(refused).startswith(b"HTTP/1.1 200")


def accepting(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except OSError:
        return False
    return True


@pytest.mark.parametrize("released", [True, False], ids=["finishes-in-grace", "stopped-after-grace"])
def test_sigterm_lets_a_call_in_flight_finish_within_the_grace_period(
    tmp_path: Path, start_server: Any, released: bool
) -> None:
    """As uvicorn does (tests/http/test_shutdown.py): granian itself would wait for its connections for ever."""
    root = write_project(tmp_path, PROJECT)
    grace = "30" if released else "0.5"
    server = start_server(root, "--server", "granian", "--graceful-timeout", grace, env={"EDGE_TEST_KEYS": KEY})
    server.wait_ready()
    server.root = root
    release = root / "release"
    hold = b'{"hold": "%s"}' % str(release).encode()
    with connect(server) as busy:
        busy.sendall(head("/busy", length=len(hold)) + hold)
        wait_for(lambda: "busy started" in events(server), "the call started")
        server.process.send_signal(signal.SIGTERM)
        wait_for(lambda: not accepting(server.port), "the server stopped accepting")
        if released:
            release.touch()
        answer = read_http_answer(busy)
    assert server.process.wait(30) == 0
    if released:
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    else:  # cancelled once the grace period was over: modelserve's JSON 503
        assert answer.startswith(b"HTTP/1.1 503") and b"shutting down" in body_of(answer).lower(), answer[:300]


def test_a_project_that_fails_to_load_exits_3(tmp_path: Path) -> None:
    failing = "class Model:\n    def load(self):\n        raise RuntimeError('no weights here')\n\n" + MODEL[13:]
    root = write_project(tmp_path, {"model.py": failing})
    command = [sys.executable, "-m", "modelserve", str(root), "--server", "granian", "--port", str(free_port())]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "no weights here" in done.stderr and "the project failed to load" in done.stderr


def test_limits_granian_cannot_hold_are_refused_at_start() -> None:
    with pytest.raises(ValueError, match="--max-header-size"):
        check_limits(TransportLimits(max_header_size=MIN_HEADER_SIZE - 1))
    with pytest.raises(ValueError, match="--header-timeout"):
        check_limits(TransportLimits(header_timeout=61))
    settings = http1_settings(TransportLimits(max_header_size=10_000, header_timeout=2.5))
    assert (settings.max_buffer_size, settings.header_read_timeout) == (10_000, 2500)


def test_the_refusals_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("modelserve.http._granian.MAX_REMEMBERED", 3)
    refusals = _Refusals(pause=0.01)
    for port in range(3):
        refusals.note(("127.0.0.1", port), 0.0)  # long ago: their pauses are over
    refusals.note(("127.0.0.1", 9), 1e12)
    assert list(refusals.at) == [("127.0.0.1", 9)]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    assert isinstance(EdgeLimits(app, TransportLimits()).refusals, _Refusals)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-header-size", "4096"], "--max-header-size: granian holds at least 8192 bytes"),
        (["--header-timeout", "90"], "--header-timeout: granian waits at most 60 seconds"),
        (["--workers", "2"], "--server granian serves one process"),
    ],
)
def test_granian_mistakes_exit_2_with_a_message(tmp_path: Path, args: list[str], message: str) -> None:
    root = write_project(tmp_path, {"model.py": MODEL})
    command = [sys.executable, "-m", "modelserve", str(root), "--server", "granian", "--port", str(free_port()), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr


def test_an_address_in_use_exits_4_naming_it(tmp_path: Path) -> None:
    root = write_project(tmp_path, {"model.py": MODEL})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "modelserve", str(root), "--server", "granian", "--port", str(port)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 4, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr


def test_granian_serves_tls(tmp_path: Path, start_server: Any) -> None:
    from tests.http.test_tls import curl, make_certificates, wait_https

    ca, certificate, key = make_certificates(tmp_path, password=None)
    root = write_project(tmp_path / "project", {"model.py": MODEL})
    server = start_server(root, "--server", "granian", "--ssl-certfile", str(certificate), "--ssl-keyfile", str(key))
    server.url = server.url.replace("http://", "https://")
    wait_https(server, ca)
    answer = curl("--cacert", str(ca), "-H", "content-type: application/json", "-d", '{"a": 1}', server.url + "/model")
    assert answer.returncode == 0 and answer.stdout == '{"a":1}', answer.stderr
    assert curl(server.url + "/model").returncode != 0  # without the CA, the certificate is not trusted


def test_granian_refuses_an_encrypted_key_naming_the_way_out(tmp_path: Path) -> None:
    from tests.http.test_tls import PASSWORD, make_certificates

    _, certificate, key = make_certificates(tmp_path)
    root = write_project(tmp_path / "project", {"model.py": MODEL})
    tls = ["--ssl-certfile", str(certificate), "--ssl-keyfile", str(key), "--ssl-keyfile-password-env", "TLS_PASSWORD"]
    command = [sys.executable, "-m", "modelserve", str(root), "--server", "granian", "--port", str(free_port()), *tls]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=60, env={**os.environ, "TLS_PASSWORD": PASSWORD}
    )
    assert done.returncode == 2, done.stderr
    assert "granian cannot read an encrypted private key" in done.stderr


def test_the_edge_page_commands_run_as_written(start_server: Any) -> None:
    from tests.test_readme import blocks, command_lines, page

    serving, measuring = blocks(page("edge.md"), "bash")
    install, command = command_lines(serving)
    extras = re.fullmatch(r'pip install -e "\.\[([\w,-]+)\]"', install)
    assert extras is not None, install
    pyproject = (REPO / "pyproject.toml").read_text()
    for extra in extras.group(1).split(","):
        assert re.search(rf"^{extra} = \[", pyproject, flags=re.MULTILINE), extra
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "modelserve"]
    server = start_server(REPO / words[3], *words[4:])
    server.wait_ready()
    flower = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
    answer = httpx.post(server.url + "/iris", json=flower)
    assert answer.status_code == 200 and answer.headers["server"] == "granian"
    assert answer.json()["label"] == "setosa"


def test_the_edge_page_benchmark_command_names_its_options() -> None:
    from tests.test_readme import blocks, command_lines, page

    (command,) = command_lines(blocks(page("edge.md"), "bash")[1])
    words = shlex.split(command)
    assert words[:2] == ["python", "benchmarks/edge.py"]
    usage = subprocess.run([sys.executable, words[1], "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0, usage.stderr
    for option in words[2::2]:
        assert option in usage.stdout, option


# ------------------------------------------------------------------------------------------------------------
# WebSockets on both edges: the handshake's checks, the message size limit, the close codes, the idle close

WS_KEY = "edge-ws-key"
WS_PROJECT = {
    "modelserve.yaml": """
        auth: {api_keys_env: EDGE_WS_KEYS}
        cors: {allow_origins: ["http://allowed.example"]}
        apis:
          - name: words
            handler: {path: words.py, class: Words}
            max_body_size: 64
            websocket_idle_timeout: 1
    """,
    "words.py": """
        class Words:
            def predict(self, inputs):
                if inputs == "fail":
                    raise RuntimeError("secret internals")
                return self.words(inputs)

            def words(self, text):
                yield from text.split()
    """,
}
WS_AUTH: dict[str, Any] = {"additional_headers": {"Authorization": f"Bearer {WS_KEY}"}}


@pytest.fixture(scope="module", params=["uvicorn", "granian"])
def ws_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, start_server_module: Any
) -> Any:
    root = write_project(tmp_path_factory.mktemp(f"edge-ws-{request.param}"), WS_PROJECT)
    started = start_server_module(root, "--server", request.param, env={"EDGE_WS_KEYS": WS_KEY})
    started.wait_ready()
    return started


def exchange(server: Any, sent: str, path: str = "/words/ws", **options: Any) -> tuple[list[Any], int, str]:
    """Connect, send `sent` (nothing when empty), receive until the server closes: (messages, code, reason)."""
    import asyncio

    import websockets
    from websockets.exceptions import ConnectionClosed

    async def run() -> tuple[list[Any], int, str]:
        received: list[Any] = []
        async with websockets.connect(f"ws://127.0.0.1:{server.port}{path}", **options) as websocket:
            if sent:
                await websocket.send(sent)
            try:
                while True:
                    received.append(await websocket.recv())
            except ConnectionClosed as closed:
                assert closed.rcvd is not None, "closed without a close frame"
                return received, closed.rcvd.code, closed.rcvd.reason
        raise AssertionError("unreachable")

    return asyncio.run(asyncio.wait_for(run(), 30))  # a close that never comes fails the test, not hangs it


def test_a_websocket_streams_its_chunks_then_closes_with_1000(ws_server: Any) -> None:
    assert exchange(ws_server, "one two three", **WS_AUTH) == (["one", "two", "three"], 1000, "")


def test_a_websocket_whose_call_fails_closes_with_1011_naming_no_internals(ws_server: Any) -> None:
    received, code, reason = exchange(ws_server, '"fail"', **WS_AUTH)
    assert (received, code) == ([], 1011) and "secret" not in reason


def test_a_websocket_message_over_max_body_size_closes_with_1009(ws_server: Any) -> None:
    assert exchange(ws_server, "x" * 65, **WS_AUTH)[:2] == ([], 1009)


def test_a_silent_websocket_is_closed_with_1001(ws_server: Any) -> None:
    received, code, reason = exchange(ws_server, "", **WS_AUTH)
    assert (received, code) == ([], 1001) and "websocket_idle_timeout" in reason


def test_the_websocket_key_may_come_as_a_subprotocol(ws_server: Any) -> None:
    assert exchange(ws_server, "hi", subprotocols=[f"bearer.{WS_KEY}"])[:2] == (["hi"], 1000)


@pytest.mark.parametrize(
    ("path", "options", "status"),
    [
        ("/words/ws", {}, 401),
        ("/words/ws", {"additional_headers": {"Authorization": "Bearer wrong"}}, 401),
        ("/words/ws", {**WS_AUTH, "origin": "http://evil.example"}, 403),
        ("/words/ws", {"additional_headers": {"Authorization": f"Bearer {WS_KEY}", "Host": "evil.example"}}, 400),
        ("/nowhere/ws", WS_AUTH, 404),
    ],
    ids=["no-key", "wrong-key", "foreign-origin", "foreign-host", "unknown-path"],
)
def test_a_refused_websocket_handshake_gets_the_json_error(
    ws_server: Any, path: str, options: dict[str, Any], status: int
) -> None:
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        exchange(ws_server, "x", path, **options)
    assert refused.value.response.status_code == status
    assert "request_id" in json.loads(refused.value.response.body or b"{}")
