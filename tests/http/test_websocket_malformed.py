"""Malformed input to an API's WebSocket route (``/<api>/ws``, modelserve/http/websocket.py) against a real
server: a refusal is a close code with a reason that names what was wrong (1008, 1009), never a dropped
connection, and nothing the client got wrong leaves a traceback in the server's log."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

import modelserve
from tests.conftest import Failures, free_port, serve_in_thread, write_project

websockets = pytest.importorskip("websockets")
hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: echo
            handler: {path: model.py, class: Echo}
            max_body_size: 1000
          - name: strict
            handler: {path: model.py, class: Strict}
            max_body_size: 100000
    """,
    "model.py": """
        import pydantic


        class Echo:
            def predict(self, inputs):
                return inputs


        class Fields(pydantic.BaseModel):
            model_config = pydantic.ConfigDict(extra="forbid")
            x: int = 0


        class Strict:
            def predict(self, inputs: Fields) -> dict:
                return {"x": inputs.x}
    """,
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Failures]]:
    root = write_project(tmp_path_factory.mktemp("websocket_malformed"), PROJECT)
    app = modelserve.create_app(str(root))
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    failures = Failures()
    logging.getLogger().addHandler(failures)
    try:
        with serve_in_thread(config):
            deadline = time.monotonic() + 60
            while httpx.get(f"http://127.0.0.1:{port}/readyz").status_code != 200:
                assert time.monotonic() < deadline, "the server was not ready"
                time.sleep(0.05)
            yield f"ws://127.0.0.1:{port}", failures
    finally:
        logging.getLogger().removeHandler(failures)


@pytest.fixture
def url(served: tuple[str, Failures]) -> Iterator[str]:
    url, failures = served
    before = len(failures.lines)
    yield url
    assert failures.lines[before:] == []


async def exchange(url: str, *frames: Any) -> tuple[list[Any], int | None, str | None]:
    """Send `frames` ("ping": a ping), receive until the server closes: (the messages, the close code, its
    reason); a connection dropped without a close frame has no code. The server may close before the last
    frames are sent (it answers the first input, then closes): those are not sent, as a client would find."""
    received = []
    async with websockets.connect(url, max_size=None) as socket:
        try:
            for frame in frames:
                if frame == "ping":
                    await (await socket.ping())
                else:
                    await socket.send(frame)
        except websockets.ConnectionClosed:
            pass  # what the server sent before it closed is still read below
        try:
            while True:
                received.append(await asyncio.wait_for(socket.recv(), 30))
        except websockets.ConnectionClosed as closed:
            if closed.rcvd is None:
                return received, None, None
            return received, closed.rcvd.code, closed.rcvd.reason
    raise AssertionError("unreachable")


def run(url: str, *frames: Any) -> tuple[list[Any], int | None, str | None]:
    return asyncio.run(exchange(url, *frames))


@pytest.mark.parametrize("letter", ["漢", "é", "a"])
def test_a_refusal_s_reason_fits_a_close_frame(url: str, letter: str) -> None:
    """The reason quotes the client's own field name; 120 characters of a 3-byte script are 360 bytes, and the
    close frame could not be sent: the client saw the connection drop with no code."""
    received, code, reason = run(url + "/strict/ws", '{"' + letter * 200 + '": 1}')
    assert (received, code) == ([], 1008)
    assert reason is not None and letter * 10 in reason
    assert len(reason.encode()) <= 123


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{bad json", 1008),
        (b"\xff\x00 binary", 1008),
        ("[" * 1100 + "]" * 1100, 1008),
        ('{"x": "not a number"}', 1008),
        ("null", 1008),
        ('{"x": 2}', 1000),
    ],
    ids=["bad JSON", "binary", "nested 1100 deep", "a wrong type", "null", "the inputs"],
)
def test_a_frame_that_is_not_the_inputs_closes_with_1008(url: str, frame: Any, code: int) -> None:
    received, got, reason = run(url + "/strict/ws", frame)
    assert got == code
    if code == 1008:
        assert received == [] and reason
    else:
        assert received == ['{"x":2}']


@pytest.mark.parametrize("frame", ["{bad json", b"\xff\x00 binary", "", b""])
def test_text_that_is_not_json_and_bytes_are_the_inputs_as_they_are(url: str, frame: Any) -> None:
    assert run(url + "/echo/ws", frame) == ([frame], 1000, "")


@pytest.mark.parametrize("frame", ["x" * 1001, b"x" * 1001, "é" * 501], ids=["text", "bytes", "501 two-byte letters"])
def test_a_frame_over_max_body_size_closes_with_1009(url: str, frame: Any) -> None:
    received, code, reason = run(url + "/echo/ws", frame)
    assert (received, code) == ([], 1009)
    assert reason is not None and "1000 bytes" in reason


def test_frames_after_the_first_and_pings_are_not_inputs(url: str) -> None:
    assert run(url + "/echo/ws", "ping", '{"a": 1}', '{"b": 2}', b"more", "ping") == (['{"a":1}'], 1000, "")


def test_a_client_that_closes_first_leaves_the_server_serving(url: str) -> None:
    async def close_at_once() -> None:
        async with websockets.connect(url + "/echo/ws") as socket:
            await socket.close()

    asyncio.run(close_at_once())
    assert run(url + "/echo/ws", '{"after": true}') == (['{"after":true}'], 1000, "")


@hypothesis.settings(max_examples=30, deadline=None, derandomize=True, database=None)
@hypothesis.given(frame=st.text(max_size=40) | st.binary(max_size=40))
def test_any_frame_is_answered_or_closed_with_a_reason(served: tuple[str, Failures], frame: Any) -> None:
    url, failures = served
    before = len(failures.lines)
    received, code, reason = run(url + "/strict/ws", frame)
    assert code in (1000, 1008), (code, reason)
    assert code == 1000 or (received == [] and reason)
    assert failures.lines[before:] == []
