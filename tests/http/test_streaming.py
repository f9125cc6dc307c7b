"""Streaming answers and cancellation, against a real server (issue 6)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import write_project

MODEL = """
import asyncio
import time
from pathlib import Path

import modelserve

EVENTS = Path("events.log")


def note(text):
    with EVENTS.open("a") as f:
        f.write(text + "\\n")


class Model:
    async def predict(self, inputs):
        mode = inputs["mode"]
        if mode == "async_stream":
            return self.async_stream(inputs)
        if mode == "sync_stream":
            return self.sync_stream(inputs)
        if mode == "slow_async":
            try:
                note("slow_async started")
                await asyncio.sleep(inputs.get("seconds", 10))
            except asyncio.CancelledError:
                note("slow_async cancelled")
                raise
            finally:
                note("slow_async finally")
            return "finished"
        if mode == "fail_stream":
            return self.fail_stream()
        if mode == "fail_first":
            return self.fail_first()
        if mode == "mixed":
            return self.mixed()
        return {"echo": inputs}

    async def async_stream(self, inputs):
        try:
            for i in range(inputs.get("n", 3)):
                yield {"i": i}
                await asyncio.sleep(inputs.get("delay", 0.3))
        finally:
            note("async_stream finally")

    def sync_stream(self, inputs):
        try:
            for i in range(inputs.get("n", 3)):
                yield f"tok{i} "
                time.sleep(inputs.get("delay", 0.3))
        finally:
            note("sync_stream finally")

    async def fail_stream(self):
        yield "first "
        raise ValueError("broken in the middle")

    async def fail_first(self):
        raise ValueError("broken at once")
        yield "never"

    def mixed(self):
        yield "text\\n"
        yield b"bytes\\n"
        yield {"json": 1}
"""

SYNC_MODEL = """
import time
from pathlib import Path

import modelserve


def note(text):
    with Path("events.log").open("a") as f:
        f.write(text + "\\n")


class Model:
    def preprocess(self, inputs):
        note("preprocess started")
        deadline = time.monotonic() + inputs.get("seconds", 3)
        while time.monotonic() < deadline:
            if modelserve.is_cancelled():
                note("preprocess saw the cancellation")
                return inputs
            time.sleep(0.01)
        return inputs

    def predict(self, inputs):
        note("predict started")
        return inputs
"""


def wait_for_event(project: Path, text: str, timeout: float = 30.0) -> float:
    """Wait (bounded: the bound fails a broken test, a passing one waits for the server alone) until user code
    wrote `text` to events.log; returns when it was seen."""
    path = project / "events.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text():
            return time.monotonic()
        time.sleep(0.005)
    raise AssertionError(f"user code never wrote {text!r}; events: {path.read_text() if path.exists() else ''}")


def events(project: Path) -> str:
    path = project / "events.log"
    return path.read_text() if path.exists() else ""


def raw_post(url: str, body: bytes, extra: str = "") -> socket.socket:
    """Send a POST by hand and return the open socket (to drop it whenever the test wants)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST / HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("streaming")
    return write_project(
        root,
        {
            "model.py": MODEL,
            "modelserve.yaml": """
                apis:
                  - name: gen
                    handler: {path: model.py}
                    max_concurrency: 1
                    max_queue_length: 4
                    timeout: 2
            """,
        },
    )


@pytest.fixture
def server(project: Path, start_server):
    (project / "events.log").unlink(missing_ok=True)
    server = start_server(project)
    server.wait_ready()
    return server


def test_chunks_arrive_before_the_stream_ends(server, project: Path) -> None:
    for mode, first in (("async_stream", b'{"i":0}\n'), ("sync_stream", b"tok0 ")):
        with httpx.stream("POST", server.url + "/gen", json={"mode": mode, "n": 2, "delay": 0.6}) as answer:
            chunks = answer.iter_raw()
            assert next(chunks) == first
            assert f"{mode} finally" not in events(project).splitlines()  # the generator is still running
            rest = b"".join(chunks)
        assert f"{mode} finally" in events(project).splitlines()
        assert answer.headers["x-request-id"]
        assert rest


def test_ndjson_text_and_bytes_framing(server) -> None:
    answer = httpx.post(server.url + "/gen", json={"mode": "async_stream", "n": 2, "delay": 0})
    assert answer.headers["content-type"] == "application/x-ndjson"
    assert answer.text == '{"i":0}\n{"i":1}\n'
    answer = httpx.post(server.url + "/gen", json={"mode": "mixed"})
    assert answer.content == b'text\nbytes\n{"json":1}\n'
    assert answer.headers["content-type"].startswith("text/plain")


def test_server_sent_events(server) -> None:
    answer = httpx.post(
        server.url + "/gen",
        json={"mode": "async_stream", "n": 2, "delay": 0},
        headers={"accept": "text/event-stream"},
    )
    assert answer.headers["content-type"] == "text/event-stream"
    assert answer.text == 'data: {"i":0}\n\ndata: {"i":1}\n\n'


def test_an_error_mid_stream_is_visible(server) -> None:
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(server.url + "/gen", json={"mode": "fail_stream"})
    answer = httpx.post(server.url + "/gen", json={"mode": "fail_stream"}, headers={"accept": "text/event-stream"})
    assert answer.text.startswith("data: first \n\nevent: error\ndata: {")
    request_id = answer.headers["x-request-id"]
    assert request_id in answer.text
    assert "broken in the middle" in server.log
    answer = httpx.post(server.url + "/gen", json={"mode": "fail_first"})
    assert answer.status_code == 500
    assert answer.json()["request_id"] == answer.headers["x-request-id"]


@pytest.mark.parametrize("mode", ["async_stream", "sync_stream"])
def test_dropping_the_connection_closes_the_stream(server, project: Path, mode: str) -> None:
    # A stream that would run for hours: only closing it ends it.
    sock = raw_post(server.url, f'{{"mode": "{mode}", "n": 1000000, "delay": 0.05}}'.encode())
    assert b"200" in sock.recv(4096)
    sock.close()
    wait_for_event(project, f"{mode} finally", timeout=30)
    # The slot (max_concurrency 1) is free again: the next request is served.
    assert httpx.post(server.url + "/gen", json={"mode": "echo"}).json() == {"echo": {"mode": "echo"}}
    deadline = time.monotonic() + 30
    while "request cancelled (499)" not in server.log:
        assert time.monotonic() < deadline, server.log
        time.sleep(0.01)


def test_dropping_during_a_slow_async_predict_cancels_it(server, project: Path) -> None:
    # An hour's sleep, well past the API's timeout of 2 s: only the lost connection (or the timeout) cancels it.
    sock = raw_post(server.url, b'{"mode": "slow_async", "seconds": 3600}')
    wait_for_event(project, "slow_async started")
    sock.close()
    wait_for_event(project, "slow_async cancelled")
    assert "slow_async finally" in events(project)
    deadline = time.monotonic() + 30  # the line is written just after the user code's own note
    while "request cancelled (499)" not in server.log:  # the disconnect cancelled it, not the timeout (a 504)
        assert time.monotonic() < deadline, server.log
        time.sleep(0.01)
    assert httpx.post(server.url + "/gen", json={"mode": "echo"}).status_code == 200


def test_timeout_answers_504_and_cancels(server, project: Path) -> None:
    answer = httpx.post(server.url + "/gen", json={"mode": "slow_async", "seconds": 3600}, timeout=60)
    assert answer.status_code == 504
    assert answer.json()["request_id"] == answer.headers["x-request-id"]
    wait_for_event(project, "slow_async cancelled")


def test_a_cancelled_sync_stage_learns_it_and_the_next_stage_never_starts(tmp_path: Path, start_server) -> None:
    project = write_project(tmp_path / "sync", {"model.py": SYNC_MODEL})
    server = start_server(project)
    server.wait_ready()
    sock = raw_post(server.url, b'{"seconds": 5}')
    wait_for_event(project, "preprocess started")  # in its worker thread (a 0.2 s sleep bet on it)
    sock.close()
    wait_for_event(project, "preprocess saw the cancellation")
    answer = httpx.post(server.url + "/", json={"seconds": 0})
    assert answer.status_code == 200
    assert events(project).count("predict started") == 1  # only the second request's


def test_streaming_predict_with_postprocess_is_refused(tmp_path: Path) -> None:
    import modelserve

    class Streaming:
        def predict(self, inputs):
            yield inputs

        def postprocess(self, outputs):
            return outputs

    with pytest.raises(modelserve.LoadError, match="streams"):
        modelserve.create_app(handler=Streaming)


def test_returned_stream_with_postprocess_is_a_clear_500() -> None:
    from starlette.testclient import TestClient

    import modelserve

    class ReturnsStream:
        def predict(self, inputs):
            return iter_chunks()

        def postprocess(self, outputs):
            return outputs

    def iter_chunks():
        yield "a"

    app = modelserve.create_app(handler=ReturnsStream)
    with TestClient(app) as client:
        client.portal.call(app.server.wait_loaded)
        answer = client.post("/model", json={})
        assert answer.status_code == 500
        assert "request_id" in answer.json()
