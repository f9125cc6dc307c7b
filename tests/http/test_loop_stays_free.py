"""No request holds the event loop while a large body is parsed or refused (docs/large-bodies.md): a long
WebSocket text message and the body of an OpenAI path that several APIs share are parsed in a worker thread,
as an HTTP body over 64 KiB is, and the values a refused large decode had made are freed in that thread too.
Each is held to a real server run in the test's process: which thread did the work, and whether /healthz is
answered while that work is held."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.sync.client import connect

from tests.conftest import free_port, serve_in_thread, write_project

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: echo
            handler: {path: model.py, class: Echo}
          - name: first
            handler: {path: model.py, class: Chat}
            openai: chat
          - name: second
            handler: {path: model.py, class: Chat}
            openai: chat
    """,
    "model.py": """
        class Echo:
            def predict(self, inputs):
                return inputs


        class Chat:
            def predict(self, inputs):
                return {"text": str(len(inputs["messages"][-1]["content"]))}
    """,
}

#: Longer than `codecs.DECODE_INLINE_MAX` (64 KiB), the size above which a body is parsed in a worker thread.
LONG = 100_000


def on_the_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import modelserve
    from modelserve.http._protocol import TransportConfig

    project = write_project(tmp_path_factory.mktemp("loop"), PROJECT)
    port = free_port()
    app = modelserve.create_app(project)
    with serve_in_thread(TransportConfig(app, host="127.0.0.1", port=port, log_level="warning"), ready=True):
        yield f"http://127.0.0.1:{port}"


class Held:
    """A stand-in for a parse function that records whether it ran on the event loop, and, when `hold` is set,
    waits until the test has had /healthz answered before it parses."""

    def __init__(self, parse: Callable[..., Any]) -> None:
        self.parse = parse
        self.on_loop: list[bool] = []
        self.hold = False
        self.entered = threading.Event()
        self.released = threading.Event()

    def __call__(self, *args: Any) -> Any:
        self.on_loop.append(on_the_loop())
        if self.hold:
            self.entered.set()
            self.released.wait(30)
        return self.parse(*args)

    def healthz_while_held(self, url: str) -> int:
        """/healthz's status, asked while the parse is held (it is held at most until this returns)."""
        try:
            assert self.entered.wait(30), "the parse never began"
            return httpx.get(f"{url}/healthz", timeout=10).status_code
        finally:
            self.released.set()


def ws_url(url: str, path: str) -> str:
    return url.replace("http://", "ws://") + path


def ws_call(url: str, message: str) -> Any:
    with connect(ws_url(url, "/echo/ws"), max_size=None) as socket:
        socket.send(message)
        return socket.recv(timeout=30)


def test_a_long_websocket_text_message_is_parsed_in_a_worker_thread(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """It was parsed whole on the loop (a 16 MiB message: some 50 ms of orjson); /healthz is answered now while
    it is parsed, and the value is the same: the JSON it holds, or the text when it holds none."""
    from modelserve.http import websocket

    held = Held(websocket.parsed_text)
    monkeypatch.setattr(websocket, "parsed_text", held)
    numbers = list(range(LONG // 4))
    held.hold = True
    answers: list[Any] = []
    sender = threading.Thread(target=lambda: answers.append(ws_call(url, orjson.dumps({"x": numbers}).decode())))
    sender.start()
    try:
        assert held.healthz_while_held(url) == 200
    finally:
        sender.join(30)
    assert orjson.loads(answers[0]) == {"x": numbers}
    held.hold = False
    not_json = "not json " * (LONG // 8)
    assert ws_call(url, not_json) == not_json
    assert held.on_loop == [False, False]


def test_a_short_websocket_text_message_is_parsed_in_line(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No hop to a thread for a short message: it is parsed where it arrives, as before."""
    from modelserve.http import websocket

    held = Held(websocket.parsed_text)
    monkeypatch.setattr(websocket, "parsed_text", held)
    assert orjson.loads(ws_call(url, '{"x": [1, 2, 3]}')) == {"x": [1, 2, 3]}
    assert ws_call(url, "one two") == "one two"
    assert held.on_loop == []


def chat(model: str, content: str) -> bytes:
    return orjson.dumps({"model": model, "messages": [{"role": "user", "content": content}]})


def test_a_long_body_of_a_shared_openai_path_is_parsed_in_a_worker_thread(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path that `first` and `second` share read its body's ``model`` on the loop, whole; a long body is
    parsed in a worker thread now (/healthz answered meanwhile), a short one where it arrives."""
    from modelserve.http import openai

    held = Held(openai._model_of)
    monkeypatch.setattr(openai, "_model_of", held)
    path = f"{url}/v1/chat/completions"
    held.hold = True
    answers: list[httpx.Response] = []
    body = chat("second", "x" * LONG)
    sender = threading.Thread(target=lambda: answers.append(httpx.post(path, content=body, timeout=30)))
    sender.start()
    try:
        assert held.healthz_while_held(url) == 200
    finally:
        sender.join(30)
    assert answers[0].status_code == 200
    assert answers[0].json()["model"] == "second"
    assert answers[0].json()["choices"][0]["message"]["content"] == str(LONG)
    held.hold = False
    assert httpx.post(path, content=chat("first", "hi")).json()["model"] == "first"
    assert held.on_loop == [False, True]


def test_a_long_body_of_a_shared_openai_path_is_refused_as_before(url: str) -> None:
    """Parsed in a thread, a long body that names no API here, or is not JSON, has the answers a short one has."""
    path = f"{url}/v1/chat/completions"
    unknown = httpx.post(path, content=chat("third", "x" * LONG))
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    broken = httpx.post(path, content=chat("first", "x" * LONG)[:-1])
    assert broken.status_code == 400
    assert "not valid JSON" in broken.json()["error"]["message"]


def test_a_refused_large_v2_body_is_freed_in_the_worker_thread(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A V2 body over 64 KiB whose last tensor is refused: the tensors decoded before it were held by the
    exception's frames and freed on the loop once the 400 was sent (about 50 ms for 100,000 tensors); they are
    freed in the worker thread that decoded them now, before the exception leaves it."""
    from modelserve import v2

    freed_on_loop: list[bool] = []
    from_json = v2.from_json

    def watched(*args: Any, **kwargs: Any) -> Any:
        array = from_json(*args, **kwargs)
        weakref.finalize(array, lambda: freed_on_loop.append(on_the_loop()))
        return array

    monkeypatch.setattr(v2, "from_json", watched)
    count = 2000
    inputs: list[dict[str, Any]] = [
        {"name": f"x{i}", "datatype": "FP32", "shape": [8], "data": [0.5] * 8} for i in range(count)
    ]
    inputs.append({"name": "last", "datatype": "NOPE", "shape": [1], "data": [1]})
    body = orjson.dumps({"inputs": inputs})
    assert len(body) > LONG
    answer = httpx.post(f"{url}/v2/models/echo/infer", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400
    assert "last" in answer.json()["error"]
    # Once the loop has served a request more, the refused request's exception was dropped wherever it was.
    assert httpx.get(f"{url}/healthz").status_code == 200
    assert len(freed_on_loop) == count
    assert not any(freed_on_loop)


def test_a_large_v2_body_that_is_decoded_is_still_answered(url: str) -> None:
    """What the thread frees on a failure only: a large body that decodes is served as before."""
    inputs = [{"name": f"x{i}", "datatype": "FP32", "shape": [8], "data": [0.5] * 8} for i in range(2000)]
    answer = httpx.post(f"{url}/v2/models/echo/infer", content=orjson.dumps({"inputs": inputs}))
    assert answer.status_code == 200
    assert len(answer.json()["outputs"]) == 2000
