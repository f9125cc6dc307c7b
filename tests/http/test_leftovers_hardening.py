"""Three leftovers of the hardening of refused and large requests, each held to a real server run in the test's
process: a crowded V2 request refused in its call's worker thread frees what it had decoded there; an OpenAI
body is parsed as every body is (in pieces when large) and, on a path several APIs share, once; the names and
paths V2's 400s and 404s quote are cut."""

from __future__ import annotations

import asyncio
import sys
import weakref
from collections.abc import Iterator
from types import FrameType, SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest

from tests.backends import test_model_file as model_file
from tests.conftest import free_port, serve_in_thread, write_project
from tests.http import test_loop_stays_free as loop_free
from tests.models import iris_onnx

PROJECT = {
    "modelserve.yaml": """
        apis:
          # A threshold no call of a loaded machine crosses: a request alone runs on the loop, and only a crowded
          # one is decoded, run and encoded in the call's worker thread.
          - name: crowd
            model: {path: iris.onnx, intra_op_threads: 1, inline_threshold_ms: 1000}
          - name: first
            handler: {path: model.py, class: Chat}
            openai: chat
          - name: second
            handler: {path: model.py, class: Chat}
            openai: chat
          - name: solo
            handler: {path: model.py, class: Chat}
            openai: completions
          # Shares the chat path with a limit of its own, under the path's (the largest of its APIs').
          - name: small
            handler: {path: model.py, class: Chat}
            openai: chat
            max_body_size: 80000
    """,
    "model.py": """
        class Chat:
            def predict(self, inputs):
                text = inputs["messages"][-1]["content"] if "messages" in inputs else inputs["prompt"]
                return {"text": str(len(text))}
    """,
}

#: Longer than `codecs.LARGE_JSON` (1 MiB), the size above which a body is parsed in pieces.
HUGE = 2 * 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    import modelserve
    from modelserve.http._protocol import TransportConfig

    root = tmp_path_factory.mktemp("leftovers")
    iris_onnx(root / "iris.onnx")
    project = write_project(root, PROJECT)
    port = free_port()
    app = modelserve.create_app(project)
    with serve_in_thread(TransportConfig(app, host="127.0.0.1", port=port, log_level="warning")):
        loading = app.server._loading  # the load the lifespan began: a task of the server's loop
        assert loading is not None
        asyncio.run_coroutine_threadsafe(app.server.wait_loaded(), loading.get_loop()).result(60)
        yield SimpleNamespace(url=f"http://127.0.0.1:{port}", port=port)


# --------------------------------------------------------------------------------------------------------------
# 1. A crowded V2 request of a model file, refused in its call's worker thread


def in_the_calls_thread() -> bool:
    """Whether this runs under the tensor entry's `whole` (`V2Model._unread_entry`): the decode of an `_Unread`
    request, in the worker thread that runs its call."""
    from modelserve.http import v2

    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "whole" and frame.f_code.co_filename == v2.__file__:
            return True
        frame = frame.f_back
    return False


def test_a_crowded_v2_request_refused_in_its_calls_thread_is_freed_there(
    server: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first of two pipelined requests finds the second read behind it: its body is decoded in the worker
    thread that runs its call. Refused at its last tensor, the tensors decoded before were held by the
    exception's frames and freed on the loop once the 400 was sent; they are freed in that thread now."""
    from modelserve import v2

    freed_on_loop: dict[str, bool] = {}
    decoded_in_call: dict[str, bool] = {}
    from_json = v2.from_json

    def watched(name: str, *args: Any, **kwargs: Any) -> Any:
        array = from_json(name, *args, **kwargs)
        decoded_in_call[name] = in_the_calls_thread()
        weakref.finalize(array, lambda: freed_on_loop.__setitem__(name, loop_free.on_the_loop()))
        return array

    monkeypatch.setattr(v2, "from_json", watched)
    count = 2000
    inputs: list[dict[str, Any]] = [
        {"name": f"x{i}", "datatype": "FP32", "shape": [1, 4], "data": [0.5] * 4} for i in range(count)
    ]
    inputs.append({"name": "last", "datatype": "NOPE", "shape": [1], "data": [1]})
    refused = orjson.dumps({"inputs": inputs})
    good = orjson.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": model_file.ROW}]})
    path = "/v2/models/crowd/infer"
    answers = model_file.pipelined(server, model_file.post(path, refused), model_file.post(path, good))
    assert answers[0][0] == 400
    assert "last" in answers[0][1]["error"]
    assert answers[1][0] == 200
    # Once the loop has served a request more, the refused request's exception was dropped wherever it was.
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    names = [f"x{i}" for i in range(count)]
    assert all(decoded_in_call[name] for name in names)  # the crowded request, decoded in its call's thread
    assert [freed_on_loop.get(name) for name in names] == [False] * count


# --------------------------------------------------------------------------------------------------------------
# 2. OpenAI bodies: in pieces when large, parsed once on a shared path


def test_a_huge_openai_body_is_parsed_in_pieces(server: SimpleNamespace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Above `codecs.LARGE_JSON` an OpenAI API's body was parsed whole by one `orjson.loads`; it goes through
    `codecs.loads` now, which parses it in pieces off the loop, as the rest of the server parses a body. A short
    body is parsed where it arrives, as before."""
    from modelserve import codecs

    large: list[bool] = []
    decode_large = codecs._decode_large

    def watched(body: bytes) -> Any:
        large.append(loop_free.on_the_loop())
        return decode_large(body)

    monkeypatch.setattr(codecs, "_decode_large", watched)
    prompt = "x" * HUGE
    answer = httpx.post(f"{server.url}/v1/completions", json={"model": "solo", "prompt": prompt}, timeout=60)
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["text"] == str(HUGE)
    assert large == [False]
    small = httpx.post(f"{server.url}/v1/completions", json={"model": "solo", "prompt": "hi"})
    assert small.json()["choices"][0]["text"] == "2"
    assert large == [False]


def test_a_huge_openai_body_that_is_not_json_is_refused_as_a_short_one_is(server: SimpleNamespace) -> None:
    body = orjson.dumps({"model": "solo", "prompt": "x" * HUGE})[:-1]
    answers = [httpx.post(f"{server.url}/v1/completions", content=one, timeout=60) for one in (body, b"{")]
    assert [answer.status_code for answer in answers] == [400, 400]
    for answer in answers:
        assert "not valid JSON" in answer.json()["error"]["message"]


@pytest.mark.parametrize("length", [10, loop_free.LONG, HUGE])
def test_a_shared_openai_path_parses_its_body_once(
    server: SimpleNamespace, monkeypatch: pytest.MonkeyPatch, length: int
) -> None:
    """The path `first` and `second` share parsed the body for its ``model``, and the chosen API parsed it
    again; the chosen API checks the value the path parsed now, short bodies and long ones."""
    from modelserve.http import openai

    parsed: list[Any] = []
    checked: list[Any] = []
    loads, check_request = openai.loads, openai.check_request

    def parse(body: bytes) -> Any:
        parsed.append(loads(body))
        return parsed[-1]

    def check(kind: str, value: Any) -> Any:
        checked.append(value)
        return check_request(kind, value)

    monkeypatch.setattr(openai, "loads", parse)
    monkeypatch.setattr(openai, "check_request", check)
    answer = httpx.post(f"{server.url}/v1/chat/completions", content=loop_free.chat("second", "y" * length), timeout=60)
    assert answer.status_code == 200
    assert answer.json()["model"] == "second"
    assert answer.json()["choices"][0]["message"]["content"] == str(length)
    assert len(parsed) == len(checked) == 1
    assert checked[0] is parsed[0]


class Watched(dict[str, Any]):
    """A parsed body that a weak reference can watch (a dict cannot be watched)."""


def test_a_shared_path_frees_a_value_its_api_refused_before_decoding_in_a_worker_thread(
    server: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The value the path parsed waits for the API's decode; an API that refuses the body before (its own
    ``max_body_size``: a 413) never takes it, and the path frees it in a worker thread, as it was freed before
    the value was handed along."""
    from modelserve.http import openai

    freed_on_loop: list[bool] = []
    loads = openai.loads

    def parse(body: bytes) -> Any:
        value = Watched(loads(body))
        weakref.finalize(value, lambda: freed_on_loop.append(loop_free.on_the_loop()))
        return value

    monkeypatch.setattr(openai, "loads", parse)
    body = loop_free.chat("small", "z" * loop_free.LONG)
    answer = httpx.post(f"{server.url}/v1/chat/completions", content=body)
    assert answer.status_code == 413
    assert httpx.get(f"{server.url}/healthz").status_code == 200
    assert freed_on_loop == [False]


def test_a_shared_openai_path_still_refuses_as_the_apis_own_route(server: SimpleNamespace) -> None:
    """What the chosen API checks in the value it is handed: the same 400s as a body it parsed itself."""
    body = {"model": "first", "messages": "not a list"}
    shared = httpx.post(f"{server.url}/v1/chat/completions", json=body)
    own = httpx.post(f"{server.url}/v1/completions", json={"model": "solo", "prompt": 7})
    assert shared.status_code == own.status_code == 400
    assert shared.json()["error"]["param"] == "messages"
    assert own.json()["error"]["param"] == "prompt"


# --------------------------------------------------------------------------------------------------------------
# 3. Names and paths quoted by V2's 400s and 404s


LONG_NAME = "n" * 5000


def test_an_ordinary_unknown_model_keeps_tritons_words(server: SimpleNamespace) -> None:
    for method in ("GET", "POST"):
        answer = httpx.request(method, f"{server.url}/v2/models/nope/infer")
        assert answer.status_code == 400
        assert answer.json()["error"] == "Request for unknown model: 'nope' is not found"


@pytest.mark.parametrize(
    ("method", "path", "status", "start"),
    [
        ("GET", f"/v2/models/{LONG_NAME}", 400, "Request for unknown model: 'nnnn"),
        ("POST", f"/v2/models/{LONG_NAME}/infer", 400, "Request for unknown model: 'nnnn"),
        ("GET", f"/v2/models/crowd/{LONG_NAME}", 404, "no V2 route at '/v2/models/crowd/nnnn"),
        ("POST", f"/v2/models/crowd/versions/1/{LONG_NAME}", 404, "no V2 route at '/v2/models/crowd/versions/1/nnnn"),
        ("POST", f"/v2/repository/models/{LONG_NAME}/nope", 404, "no V2 route at '/v2/repository/models/nnnn"),
    ],
)
def test_a_long_name_or_path_is_cut_in_the_answer(
    server: SimpleNamespace, method: str, path: str, status: int, start: str
) -> None:
    """A name or path of 5,000 characters was quoted whole; it is cut as the repository's 400s cut names."""
    answer = httpx.request(method, f"{server.url}{path}")
    assert answer.status_code == status
    error = answer.json()["error"]
    assert error.startswith(start)
    assert LONG_NAME not in error
    assert len(error) < 300


def test_a_short_unknown_route_is_quoted_whole(server: SimpleNamespace) -> None:
    answer = httpx.get(f"{server.url}/v2/models/crowd/nothing")
    assert answer.status_code == 404
    assert answer.json()["error"].startswith("no V2 route at '/v2/models/crowd/nothing'; ")
