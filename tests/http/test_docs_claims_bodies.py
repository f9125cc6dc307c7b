"""What docs/large-bodies.md, docs/streaming.md and docs/edge.md promise about request bodies, streamed answers
and their ends, held to one real server (a project of the module's own) where no other test checked exactly
that claim."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import re
import socket
import threading
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import REPO, free_port, read_http_answer, serve_in_thread, write_project

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: echo
            handler: {path: model.py, class: Echo}
          - name: raw
            handler: {path: model.py, class: Raw}
          - name: keeper
            handler: {path: model.py, class: Keeper}
          - name: double
            handler: {path: model.py, class: Double}
          - name: stream
            handler: {path: model.py, class: Streams}
          - name: timed
            handler: {path: model.py, class: Streams}
            timeout: 1
          - name: notified
            handler: {path: model.py, class: Streams}
            on_disconnect: notify
            max_concurrency: 1
          - name: notifiedchat
            handler: {path: model.py, class: Streams}
            openai: chat
            on_disconnect: notify
            max_concurrency: 1
          - name: single
            handler: {path: model.py, class: Stepper}
            max_concurrency: 1
          - name: userstream
            handler: {path: model.py, class: UserStream}
            max_concurrency: 1
            timeout: 0.2
          - name: held
            handler: {path: model.py, class: Held}
            max_concurrency: 1
            max_queue_length: 0
          - name: queued
            handler: {path: model.py, class: Held}
            max_concurrency: 1
            max_queue_length: 10
            max_queued_bytes: 1000
    """,
    "model.py": """
        import asyncio
        import time
        from pathlib import Path

        import modelserve


        def note(tag, text):
            with open(f"notes-{tag}.log", "a") as f:
                f.write(text + "\\n")


        class Echo:
            def predict(self, inputs):
                return {"n": len(inputs["x"]), "sum": sum(inputs["x"])}


        class Keeper:
            kept = None

            def predict(self, inputs):
                if "x" in inputs:
                    self.kept = inputs["x"]
                return {"kept": self.kept}


        class Double:
            def predict(self, inputs):
                return inputs["x"] * 2


        class Raw:
            def predict(self, inputs):
                return {"type": type(inputs).__name__, "head": inputs[:2].hex(), "size": len(inputs)}


        class Streams:
            def predict(self, inputs):
                return getattr(self, inputs["mode"])(inputs.get("tag", ""))

            def lines(self, tag):
                yield "a\\rb"
                yield "c\\r\\nd"
                yield "e\\nf"

            def nothing(self, tag):
                return
                yield

            def fails(self, tag):
                yield "one\\n"
                raise RuntimeError("the model broke mid-stream")

            async def endless(self, tag):
                try:
                    for i in range(400):
                        note(tag, f"chunk {i}")
                        yield f"{i}\\n"
                        await asyncio.sleep(0.02)
                finally:
                    note(tag, "finally")

            async def polite(self, tag):
                try:
                    for i in range(400):
                        note(tag, f"chunk {i}")
                        yield f"{i}\\n"
                        await asyncio.sleep(0.02)
                        if modelserve.is_cancelled():
                            note(tag, "told")
                            return
                finally:
                    note(tag, "finally")

            def polite_sync(self, tag):
                try:
                    for i in range(400):
                        note(tag, f"chunk {i}")
                        yield f"{i}\\n"
                        time.sleep(0.02)
                        if modelserve.is_cancelled():
                            note(tag, "told")
                            return
                finally:
                    note(tag, "finally")

            async def large(self, tag):
                try:
                    for i in range(8):
                        note(tag, f"chunk {i}")
                        yield b"x" * (16 << 20)  # more than a client's and the kernel's buffers hold
                finally:
                    note(tag, "finally")


        class Stepper:
            def predict(self, inputs):
                if inputs.get("quick"):
                    note("stepper", "quick")
                    return {"quick": True}
                return self.steps()

            def steps(self):
                try:
                    yield "0\\n"
                    note("stepper", "step 1")
                    deadline = time.monotonic() + 60
                    while not Path("go").exists() and time.monotonic() < deadline:
                        time.sleep(0.01)
                    yield "1\\n"
                finally:
                    note("stepper", "finally")


        class UserStream:
            def predict(self, inputs):
                from starlette.responses import StreamingResponse

                if inputs.get("quick"):
                    return {"quick": True}
                return StreamingResponse(self.steps(), media_type="text/plain")

            async def steps(self):
                yield "0\\n"
                await asyncio.sleep(0.5)  # past the API's timeout
                deadline = time.monotonic() + 60
                while not Path("go-user").exists() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                yield "1\\n"


        class Held:
            async def predict(self, inputs):
                Path("held").touch()
                deadline = time.monotonic() + 60
                while not Path("release").exists() and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                return {"ok": True}
    """,
}

DEADLINE = 30


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_project(tmp_path_factory.mktemp("bodies"), PROJECT)


@pytest.fixture(scope="module")
def server(project: Path, start_server_module: Any) -> Any:
    server = start_server_module(project)
    server.wait_ready()
    return server


def connect(server: Any) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=DEADLINE)


def post(path: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json", *headers]
    if not any(line.lower().startswith("transfer-encoding") for line in headers):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def read_to_end(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def head_of(answer: bytes) -> bytes:
    return answer.split(b"\r\n\r\n", 1)[0].lower()


def sample(server: Any, series: str) -> float:
    """The value of one series of /metrics (0 when it is not there yet)."""
    found = re.search(rf"^{re.escape(series)} (\S+)$", httpx.get(server.url + "/metrics").text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def counted(server: Any, api: str, code: int) -> float:
    """modelserve_requests_total of `api` and `code`."""
    return sample(server, f'modelserve_requests_total{{api="{api}",code="{code}"}}')


def notes(project: Path, tag: str) -> list[str]:
    path = project / f"notes-{tag}.log"
    return path.read_text().splitlines() if path.exists() else []


def wait_for_note(project: Path, tag: str, text: str) -> list[str]:
    deadline = time.monotonic() + DEADLINE
    while text not in (seen := notes(project, tag)):
        assert time.monotonic() < deadline, f"{text!r} never noted: {seen[-3:]}"
        time.sleep(0.01)
    return seen


def sse_events(body: bytes) -> list[tuple[str, str]]:
    """(event type, data) of each event of a text/event-stream body, parsed as the HTML standard says: a line
    ends at CRLF, LF or CR; a line without a colon is a field of that name (and an unknown one is ignored)."""
    events: list[tuple[str, str]] = []
    kind, data = "message", list[str]()
    for line in re.split(r"\r\n|\r|\n", body.decode()):
        if not line:
            if data:
                events.append((kind, "\n".join(data)))
            kind, data = "message", []
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            kind = value
    return events


# --------------------------------------------------------------------------------------------------
# docs/large-bodies.md


def test_a_large_json_body_decodes_to_orjsons_value_and_its_400(server: Any) -> None:
    """A body over 1 MiB is parsed in pieces, to `orjson.loads(body)`'s value exactly, and a body that is not
    JSON gets the 400 orjson's one call gives."""
    numbers = [1, -2, 0.5, 1e-7, -3.25e10, 12345678901234, 0.1, 2.5e-300]
    body = orjson.dumps({"x": numbers * 40000})
    assert len(body) > 1024 * 1024
    answer = httpx.post(server.url + "/echo", content=body, headers={"content-type": "application/json"})
    expected = orjson.loads(body)["x"]
    assert answer.json() == {"n": len(expected), "sum": sum(expected)}

    broken = body[:-2] + b",]}"
    with pytest.raises(orjson.JSONDecodeError) as raised:
        orjson.loads(broken)
    answer = httpx.post(server.url + "/echo", content=broken, headers={"content-type": "application/json"})
    assert answer.status_code == 400
    assert answer.json()["error"] == f"request body is not valid JSON: {raised.value}"


def test_a_part_of_a_large_body_that_user_code_kept_is_left_whole(server: Any) -> None:
    """A value decoded from a body over 64 KiB is taken apart once answered, but not a part user code kept."""
    rows = [[float(i), float(i) / 3, -float(i)] for i in range(20000)]
    body = orjson.dumps({"x": rows})
    assert len(body) > 64 * 1024
    first = httpx.post(server.url + "/keeper", content=body, headers={"content-type": "application/json"})
    assert first.status_code == 200
    answer = httpx.post(server.url + "/keeper", json={})
    assert answer.json() == {"kept": rows}


def test_a_compressed_body_reaches_the_api_as_it_came(server: Any) -> None:
    """Only V2's infer undoes a Content-Encoding: elsewhere a gzipped JSON body is not JSON (a 400), and an API
    that takes bytes gets the compressed bytes, bounded by max_body_size as they came."""
    body = gzip.compress(orjson.dumps({"x": [1.5] * 1000}))
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    answer = httpx.post(server.url + "/echo", content=body, headers=headers)
    assert answer.status_code == 400
    assert answer.json()["error"].startswith("request body is not valid JSON")
    headers["content-type"] = "application/octet-stream"
    answer = httpx.post(server.url + "/raw", content=body, headers=headers)
    assert answer.json() == {"type": "bytes", "head": "1f8b", "size": len(body)}


V2_BODY = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [4], "data": [1, 2, 3, 4]}]})


def v2_infer(server: Any, body: bytes, encoding: str) -> httpx.Response:
    return httpx.post(server.url + "/v2/models/double/infer", content=body, headers={"content-encoding": encoding})


def test_a_v2_body_of_several_gzip_members_is_read_whole(server: Any) -> None:
    """A gzip body may be members one after the other (RFC 1952; `cat a.gz b.gz`, bgzip): all are read, as gzip -d
    reads them. Only the first was, and the request was parsed from a part of its body."""
    half = len(V2_BODY) // 2
    answer = v2_infer(server, gzip.compress(V2_BODY[:half]) + gzip.compress(V2_BODY[half:]), "gzip")
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"][0]["data"] == [2, 4, 6, 8]


@pytest.mark.parametrize(("encoding", "compress"), [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_bytes_after_a_v2_bodys_compressed_data_are_a_400(server: Any, encoding: str, compress: Any) -> None:
    """They were dropped unread, and the request served as if they had not been sent."""
    answer = v2_infer(server, compress(V2_BODY) + b"trailing", encoding)
    assert answer.status_code == 400
    assert encoding in answer.json()["error"]


def test_a_v2_body_is_decompressed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inflating a body took the event loop as long as it lasts (a 10 MiB JSON body out of gzip: 40-90 ms here),
    when every other body over 64 KiB is decoded in a worker thread; it runs in one now, whatever its size."""
    import modelserve
    from modelserve.http import v2
    from modelserve.http._protocol import TransportConfig

    on_the_loop: list[bool] = []
    decompressed = v2._decompressed

    def watched(body: bytes, encoding: str, limit: int) -> bytes:
        try:
            asyncio.get_running_loop()
            on_the_loop.append(True)
        except RuntimeError:
            on_the_loop.append(False)
        return decompressed(body, encoding, limit)

    monkeypatch.setattr(v2, "_decompressed", watched)

    class Double:
        def predict(self, inputs: Any) -> Any:
            return inputs["x"] * 2

    app = modelserve.create_app(handler=Double, name="double")
    port = free_port()
    with serve_in_thread(TransportConfig(app, host="127.0.0.1", port=port, log_level="warning"), ready=True):
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v2/models/double/infer",
            content=gzip.compress(V2_BODY),
            headers={"content-encoding": "gzip"},
        )
    assert answer.json()["outputs"][0]["data"] == [2, 4, 6, 8]
    assert on_the_loop == [False]


@contextlib.contextmanager
def holding(server: Any, project: Path, api: str) -> Iterator[None]:
    """The only slot of `api` (a `Held`) taken while the block runs."""
    (project / "release").unlink(missing_ok=True)
    (project / "held").unlink(missing_ok=True)
    holder = threading.Thread(target=httpx.post, args=(f"{server.url}/{api}",), kwargs={"json": {}, "timeout": 60})
    holder.start()
    deadline = time.monotonic() + DEADLINE
    while not (project / "held").exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        yield
    finally:
        (project / "release").touch()
        holder.join(DEADLINE)


@pytest.fixture
def held(server: Any, project: Path) -> Iterator[None]:
    """The `held` API's only slot taken (and no line) while the test runs."""
    with holding(server, project, "held"):
        yield


def test_a_small_body_refused_with_503_keeps_its_connection(server: Any, held: None) -> None:
    """Only a refused body over 64 KiB (or one whose length is not known) closes the connection: a small one
    is read and dropped by the parser, and the connection serves the next request."""
    with connect(server) as sock:
        sock.sendall(post("/held", b"{}"))
        answer = read_http_answer(sock)
        assert answer.startswith(b"HTTP/1.1 503")
        assert b"\r\nconnection: close" not in head_of(answer)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_http_answer(sock).startswith(b"HTTP/1.1 200")


def test_a_large_body_refused_with_503_closes_its_connection(server: Any, held: None) -> None:
    with connect(server) as sock:
        sock.sendall(post("/held", b" " * (64 * 1024 + 1)))
        answer = read_http_answer(sock)
        assert answer.startswith(b"HTTP/1.1 503")
        assert b"\r\nconnection: close" in head_of(answer)
        assert read_to_end(sock) == b""


def test_a_chunked_upload_refused_with_503_closes_its_connection(server: Any, held: None) -> None:
    """A chunked body's length is not known: refused before it is read, it is not read to its end only to be
    dropped (the server went on reading, for as long as the client sent, until --body-timeout)."""
    with connect(server) as sock:
        sock.sendall(post("/held", b"", "Transfer-Encoding: chunked"))
        stop = threading.Event()

        def send_chunks() -> None:
            chunk = b"%x\r\n%s\r\n" % (64 * 1024, b" " * (64 * 1024))
            with contextlib.suppress(OSError):  # the server closed: a reset, a broken pipe
                while not stop.is_set():
                    sock.sendall(chunk)

        sender = threading.Thread(target=send_chunks)
        sender.start()
        try:
            answer = read_http_answer(sock)
            assert answer.startswith(b"HTTP/1.1 503")
            assert b"\r\nconnection: close" in head_of(answer)
            with contextlib.suppress(ConnectionResetError):  # after the lingering's 64 MiB, a reset may come
                assert read_to_end(sock) == b""
        finally:
            stop.set()
            sender.join(DEADLINE)


# --------------------------------------------------------------------------------------------------
# docs/streaming.md: framing


def test_server_sent_events_carry_every_line_of_a_chunk(server: Any) -> None:
    """A CR inside a chunk ended its `data:` line early, and the client dropped what followed it."""
    answer = httpx.post(server.url + "/stream", json={"mode": "lines"}, headers={"accept": "text/event-stream"})
    assert answer.headers["content-type"] == "text/event-stream"
    assert sse_events(answer.content) == [("message", "a\nb"), ("message", "c\nd"), ("message", "e\nf")]


@pytest.mark.parametrize("accept", ["text/event-stream", "*/*"])
def test_a_stream_of_no_chunks_sends_nothing(server: Any, accept: str) -> None:
    """A generator that yields nothing is an empty answer (it was one empty event under SSE)."""
    answer = httpx.post(server.url + "/stream", json={"mode": "nothing"}, headers={"accept": accept})
    assert answer.status_code == 200
    assert answer.content == b""
    assert answer.headers["content-type"].startswith("text/event-stream" if "event" in accept else "text/plain")


# --------------------------------------------------------------------------------------------------
# docs/streaming.md: how a stream ends when it cannot end cleanly, and what the metrics and the log say


def test_a_stream_failing_mid_way_is_cut_off_counted_and_logged(server: Any) -> None:
    """The client sees a truncated chunked body; the request is counted as a 500 and has its access line (an
    aborted stream had neither)."""
    before = counted(server, "stream", 500)
    request_id = uuid.uuid4().hex
    with connect(server) as sock:
        sock.sendall(post("/stream", b'{"mode": "fails"}', f"X-Request-ID: {request_id}"))
        answer = read_to_end(sock)
    assert answer.startswith(b"HTTP/1.1 200")
    assert b"one\n" in answer
    assert not answer.endswith(b"0\r\n\r\n")
    assert counted(server, "stream", 500) == before + 1
    assert '"POST /stream HTTP/1.1" 500' in next(line for line in access_lines(server) if request_id in line)


def access_lines(server: Any) -> list[str]:
    return [line for line in server.log.splitlines() if "modelserve.access" in line]


def test_a_stream_that_outlasts_the_timeout_is_ended_at_it(server: Any, project: Path) -> None:
    """The API's timeout counts the whole stream from the request's start, chunks sent or not: a plain stream
    is cut off (no 504 can be sent once the answer began), an SSE one ends with an error event holding the
    504's body; both are counted as 504."""
    before = counted(server, "timed", 504)
    with connect(server) as sock:
        sock.sendall(post("/timed", b'{"mode": "endless", "tag": "timed-plain"}'))
        raw = read_to_end(sock)
    assert raw.startswith(b"HTTP/1.1 200")
    assert b"\r\n0\n" in raw and not raw.endswith(b"0\r\n\r\n")
    wait_for_note(project, "timed-plain", "finally")

    body = {"mode": "endless", "tag": "timed-sse"}
    answer = httpx.post(server.url + "/timed", json=body, headers={"accept": "text/event-stream"}, timeout=DEADLINE)
    events = sse_events(answer.content)
    assert events[0] == ("message", "0\n")
    kind, data = events[-1]
    assert kind == "error"
    assert orjson.loads(data)["error"] == "the call took longer than the timeout of 1.0 s"
    assert counted(server, "timed", 504) == before + 2


@pytest.mark.parametrize("mode", ["polite", "polite_sync"])
def test_with_notify_a_stream_whose_client_left_runs_until_it_stops_itself(
    server: Any, project: Path, mode: str
) -> None:
    """`on_disconnect: notify` (Truss's default) never cancels user code, a stream's neither: its generator is
    resumed, told by `is_cancelled()`, and stops by itself, as under Truss (whose own test model checks
    `is_disconnected()` after a yield). The request is counted as a 499 (it was a 200), and the slot then freed."""
    tag, request_id = f"notified-{mode}", uuid.uuid4().hex
    before = counted(server, "notified", 499)
    with connect(server) as sock:
        sock.sendall(post("/notified", orjson.dumps({"mode": mode, "tag": tag}), f"X-Request-ID: {request_id}"))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    seen = wait_for_note(project, tag, "finally")
    assert "told" in seen and "chunk 399" not in seen
    assert '"POST /notified HTTP/1.1" 499' in wait_for_access_line(server, request_id)
    assert counted(server, "notified", 499) == before + 1
    answer = httpx.post(server.url + "/notified", json={"mode": "lines"}, timeout=DEADLINE)
    assert answer.status_code == 200


def test_with_notify_an_openai_stream_whose_client_left_is_a_499(server: Any, project: Path) -> None:
    """The same on OpenAI's paths: the generator stops by itself, and the request is a 499 (it was a 200)."""
    tag, request_id = "notified-chat", uuid.uuid4().hex
    before = counted(server, "notifiedchat", 499)
    body = {"model": "notifiedchat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with connect(server) as sock:
        sock.sendall(
            post(
                "/v1/chat/completions",
                orjson.dumps({**body, "mode": "polite", "tag": tag}),
                f"X-Request-ID: {request_id}",
            )
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    seen = wait_for_note(project, tag, "finally")
    assert "told" in seen and "chunk 399" not in seen
    assert '"POST /v1/chat/completions HTTP/1.1" 499' in wait_for_access_line(server, request_id)
    assert counted(server, "notifiedchat", 499) == before + 1


@pytest.mark.parametrize(("api", "status"), [("stream", 499), ("timed", 504)], ids=["client-leaves", "timeout"])
def test_a_stream_waiting_on_a_client_that_stopped_reading_ends_as_its_cancel(
    server: Any, project: Path, api: str, status: int
) -> None:
    """A chunk waiting to be sent (the client reads nothing) when the client leaves, or the timeout passes, ends
    the stream as a 499 or a 504; it was taken for the server's shutdown (logged so, and counted as a 503)."""
    tag = f"large-{api}"
    before = counted(server, api, status), counted(server, api, 503)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(DEADLINE)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(post(f"/{api}", orjson.dumps({"mode": "large", "tag": tag})))
        wait_for_note(project, tag, "chunk 1")  # the first chunk fills every buffer: the second waits
        if api == "timed":
            wait_for_note(project, tag, "finally")
    wait_for_note(project, tag, "finally")
    deadline = time.monotonic() + DEADLINE
    while counted(server, api, status) == before[0]:
        assert time.monotonic() < deadline, f"never counted as {status}"
        time.sleep(0.02)
    assert counted(server, api, 503) == before[1]
    assert "stopped by the server's shutdown" not in server.log


@pytest.mark.parametrize(("mode", "value"), [("lines", "a\rbc\r\nde\nf"), ("nothing", [])])
def test_a_stream_asked_for_as_json_is_collected(server: Any, mode: str, value: Any) -> None:
    answer = httpx.post(server.url + "/stream", json={"mode": mode}, headers={"accept": "application/json"})
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == value


def test_a_body_answered_before_any_api_is_read_and_dropped(server: Any) -> None:
    """A 404 given while the body still comes keeps the connection: the rest of the body is read and dropped,
    and the connection serves the next request."""
    with connect(server) as sock:
        sock.sendall(b"POST /nowhere HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 200000\r\n\r\n" + b" " * 1000)
        answer = read_http_answer(sock)
        assert answer.startswith(b"HTTP/1.1 404")
        assert b"\r\nconnection: close" not in head_of(answer)
        sock.sendall(b" " * 199000 + b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_http_answer(sock).startswith(b"HTTP/1.1 200")


# --------------------------------------------------------------------------------------------------
# docs/edge.md


@pytest.fixture(scope="module")
def granian_server(project: Path, start_server_module: Any) -> Any:
    pytest.importorskip("granian")
    server = start_server_module(project, "--server", "granian")
    server.wait_ready()
    return server


@pytest.mark.parametrize("edge", ["server", "granian_server"])
def test_a_malformed_chunked_body_is_a_400_that_closes(edge: str, request: pytest.FixtureRequest) -> None:
    """Bad input is a 4xx on both edges: granian answered a chunk size that is not hexadecimal with a plain-text
    500 (the app had seen the body end as a lost client's, and answered nothing)."""
    server = request.getfixturevalue(edge)
    with connect(server) as sock:
        sock.sendall(post("/echo", b"zz\r\n{}\r\n0\r\n\r\n", "Transfer-Encoding: chunked"))
        answer = read_to_end(sock)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"\r\nconnection: close" in head_of(answer)


def test_a_sync_step_running_when_the_client_leaves_keeps_the_slot_until_it_returns(server: Any, project: Path) -> None:
    """The slot of an abandoned stream is freed at once, but a sync generator's step cannot be interrupted: the
    next request waits for it (max_concurrency bounds user code), and runs once the step has returned."""
    with connect(server) as sock:
        sock.sendall(post("/single", b"{}"))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        wait_for_note(project, "stepper", "step 1")
    answers: list[httpx.Response] = []
    waiter = threading.Thread(
        target=lambda: answers.append(httpx.post(server.url + "/single", json={"quick": 1}, timeout=DEADLINE))
    )
    waiter.start()
    try:
        deadline = time.monotonic() + DEADLINE
        while sample(server, 'modelserve_requests_waiting{api="single"}') < 1:  # held back: the step still has the slot
            assert time.monotonic() < deadline and waiter.is_alive(), notes(project, "stepper")
            time.sleep(0.01)
    finally:
        (project / "go").touch()
        waiter.join(DEADLINE)
    assert answers[0].json() == {"quick": True}
    seen = notes(project, "stepper")
    assert seen.index("finally") < seen.index("quick")


def wait_for_access_line(server: Any, request_id: str) -> str:
    deadline = time.monotonic() + DEADLINE
    while not (found := [line for line in access_lines(server) if request_id in line]):
        assert time.monotonic() < deadline, f"no access line for {request_id}"
        time.sleep(0.01)
    return found[0]


@pytest.mark.parametrize("edge", ["server", "granian_server"])
def test_a_client_leaving_a_stream_is_counted_as_499_and_logged_as_no_error(
    edge: str, request: pytest.FixtureRequest, project: Path
) -> None:
    """The stream is closed, its request written in the access log as a 499, and nothing is logged at ERROR:
    granian logged the abort, by which the server cuts the stream off, as the app's failure with a traceback."""
    server = request.getfixturevalue(edge)
    errors = [line for line in server.log.splitlines() if " ERROR " in line]
    tag, request_id = f"leaves-{edge}", uuid.uuid4().hex
    with connect(server) as sock:
        sock.sendall(post("/stream", orjson.dumps({"mode": "endless", "tag": tag}), f"X-Request-ID: {request_id}"))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    wait_for_note(project, tag, "finally")
    assert '"POST /stream HTTP/1.1" 499' in wait_for_access_line(server, request_id)
    marker = uuid.uuid4().hex  # a request after it: what the server logged of the stream is in the log by then
    httpx.get(server.url + "/healthz", headers={"x-request-id": marker})
    wait_for_access_line(server, marker)
    assert [line for line in server.log.splitlines() if " ERROR " in line] == errors


def test_a_starlette_streaming_response_runs_outside_the_slot_and_the_timeout(server: Any, project: Path) -> None:
    """A StreamingResponse that predict returns is sent as it is once the call is over: its iterator holds no
    slot (another request runs meanwhile, with max_concurrency 1) and outlives the API's timeout."""
    with connect(server) as sock:
        sock.sendall(post("/userstream", b"{}"))
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        assert httpx.post(server.url + "/userstream", json={"quick": 1}).json() == {"quick": True}
        (project / "go-user").touch()
        answer = read_to_end_of_chunks(sock)
    assert answer.endswith(b"2\r\n1\n\r\n0\r\n\r\n")  # its last chunk, and a clean end


def read_to_end_of_chunks(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"0\r\n\r\n"):
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection: {data[-100:]!r}"
        data += chunk
    return data


def test_a_chunked_body_counts_in_max_queued_bytes_once_read(server: Any, project: Path) -> None:
    """docs/http.md: a chunked body is counted once read. It never was: waiting chunked bodies held any number of
    bytes beside max_queued_bytes, and a request with a Content-Length was admitted past them."""
    body = orjson.dumps({"pad": "x" * 900})
    with connect(server) as chunked:
        with holding(server, project, "queued"):
            chunked.sendall(post("/queued", b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body), "Transfer-Encoding: chunked"))
            deadline = time.monotonic() + DEADLINE
            while sample(server, 'modelserve_requests_waiting{api="queued"}') < 1:  # read, and waiting for the slot
                assert time.monotonic() < deadline
                time.sleep(0.01)
            answer = httpx.post(server.url + "/queued", content=orjson.dumps({"pad": "y" * 200}))
            assert answer.status_code == 503
            assert "max_queued_bytes" in answer.json()["error"]
        assert read_http_answer(chunked).startswith(b"HTTP/1.1 200")  # served once the slot was free


def test_the_streaming_examples_long_generation_is_a_prompt_it_takes() -> None:
    """docs/streaming.md's example: its README's long generation asked for 1000 tokens, which its `Prompt`
    (at most 256) refused with a 400."""
    pytest.importorskip("pydantic")
    import importlib.util

    folder = REPO / "examples" / "streaming-tokens"
    asked = re.search(r'`"max_tokens": (\d+)`', (folder / "README.md").read_text())
    assert asked is not None
    spec = importlib.util.spec_from_file_location("streaming_tokens_model", folder / "model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.Prompt(prompt="hello", max_tokens=int(asked.group(1))).max_tokens == int(asked.group(1))


@pytest.mark.parametrize(("edge", "answered"), [("server", b""), ("granian_server", b"HTTP/1.1 400")])
def test_a_body_cut_short_by_its_client_is_closed(edge: str, answered: bytes, request: pytest.FixtureRequest) -> None:
    """docs/edge.md: uvicorn closes without an answer, granian answers the JSON 400; both count a 499."""
    server = request.getfixturevalue(edge)
    before = counted(server, "echo", 499)
    with connect(server) as sock:
        sock.sendall(post("/echo", b'{"x": [1, 2, 3]}')[:-5])
        sock.shutdown(socket.SHUT_WR)
        answer = read_to_end(sock)
    assert answer.startswith(answered) if answered else answer == b""
    deadline = time.monotonic() + DEADLINE
    while counted(server, "echo", 499) == before:
        assert time.monotonic() < deadline
        time.sleep(0.01)
