"""Malformed requests to OpenAI's paths (modelserve/http/openai.py) against a real server: each is a 4xx with
OpenAI's error body naming the parameter at fault (``param``), never a 500, and nothing the client got wrong
leaves a traceback in the server's log."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import uvicorn

import modelserve
from tests.conftest import Failures, free_port, serve_in_thread, write_project

hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: chat
            handler: {path: model.py, class: Chat}
            openai: chat
            max_body_size: 100000
          - name: complete
            handler: {path: model.py, class: Chat}
            openai: completions
          - name: embed
            handler: {path: model.py, class: Embed}
            openai: embeddings
          - name: embed2
            handler: {path: model.py, class: Embed}
            openai: embeddings
    """,
    "model.py": """
        class Chat:
            def predict(self, inputs):
                return "ok"


        class Embed:
            def predict(self, inputs):
                given = inputs["input"]
                return [[0.5]] * (1 if isinstance(given, str) else len(given))
    """,
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, Failures]]:
    root = write_project(tmp_path_factory.mktemp("openai_malformed"), PROJECT)
    app = modelserve.create_app(str(root))
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    failures = Failures()
    logging.getLogger().addHandler(failures)
    try:
        with serve_in_thread(config), httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            deadline = time.monotonic() + 60
            while client.get("/readyz").status_code != 200:
                assert time.monotonic() < deadline, "the server was not ready"
                time.sleep(0.05)
            yield client, failures
    finally:
        logging.getLogger().removeHandler(failures)


@pytest.fixture
def client(served: tuple[httpx.Client, Failures]) -> Iterator[httpx.Client]:
    client, failures = served
    before = len(failures.lines)
    yield client
    assert failures.lines[before:] == []


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": "hi"}], **fields}


def said(*messages: Any) -> dict[str, Any]:
    return chat(messages=list(messages))


CHAT = "/v1/chat/completions"
CASES: dict[str, tuple[str, Any, int, str | None]] = {
    # a role that is a list or an object was looked up in a set of roles: a 500
    "a role that is a list": (CHAT, said({"role": ["user"], "content": "x"}), 400, "messages[0].role"),
    "a role that is an object": (CHAT, said({"role": {"a": 1}, "content": "x"}), 400, "messages[0].role"),
    "an unknown role": (CHAT, said({"role": "wizard", "content": "x"}), 400, "messages[0].role"),
    "messages an object": (CHAT, chat(messages={"role": "user"}), 400, "messages"),
    "messages a string": (CHAT, chat(messages="hi"), 400, "messages"),
    "a message a number": (CHAT, said(1), 400, "messages[0]"),
    "content a number": (CHAT, said({"role": "user", "content": 5}), 400, "messages[0].content"),
    "a content part without type": (
        CHAT,
        said({"role": "user", "content": [{"text": "x"}]}),
        400,
        "messages[0].content[0]",
    ),
    # an empty list of parts and an empty input reached predict (OpenAI refuses both)
    "content an empty list": (CHAT, said({"role": "user", "content": []}), 400, "messages[0].content"),
    "an empty input": ("/v1/embeddings", {"model": "embed", "input": ""}, 400, "input"),
    "an empty string among the inputs": ("/v1/embeddings", {"model": "embed", "input": ["a", ""]}, 400, "input[1]"),
    # a boolean n was taken as 1 (a whole float, 1.0, is an integer to JSON Schema and is taken)
    "n true": (CHAT, chat(n=True), 400, "n"),
    "n 1.5": (CHAT, chat(n=1.5), 400, "n"),
    "n a string": (CHAT, chat(n="1"), 400, "n"),
    "n negative": (CHAT, chat(n=-1), 400, "n"),
    "n past 64 bits": (CHAT, chat(n=10**30), 400, "n"),
    "max_tokens negative": (CHAT, chat(max_tokens=-1), 400, "max_tokens"),
    "max_tokens a string": (CHAT, chat(max_tokens="5"), 400, "max_tokens"),
    "max_tokens a float": (CHAT, chat(max_tokens=1.5), 400, "max_tokens"),
    "max_tokens past 64 bits": (CHAT, chat(max_tokens=10**30), 400, "max_tokens"),
    "stream a string": (CHAT, chat(stream="true"), 400, "stream"),
    "stream_options a list": (CHAT, chat(stream_options=[1]), 400, "stream_options"),
    "include_usage a string": (CHAT, chat(stream_options={"include_usage": "y"}), 400, "stream_options.include_usage"),
    "temperature a string": (CHAT, chat(temperature="hot"), 400, "temperature"),
    "stop of five": (CHAT, chat(stop=["a"] * 5), 400, "stop"),
    "model a list": (CHAT, chat(model=["chat"]), 400, "model"),
    "an unknown model": (CHAT, chat(model="x" * 10_000), 404, "model"),
    "a body that is a list": (CHAT, [1, 2], 400, None),
    "a prompt that is a number": ("/v1/completions", {"model": "complete", "prompt": 5}, 400, "prompt"),
    "token arrays": ("/v1/embeddings", {"model": "embed", "input": [[1, 2]]}, 400, "input[0]"),
    "an encoding_format list": (
        "/v1/embeddings",
        {"model": "embed", "input": "a", "encoding_format": ["x"]},
        400,
        "encoding_format",
    ),
    "dimensions negative": ("/v1/embeddings", {"model": "embed", "input": "a", "dimensions": -1}, 400, "dimensions"),
    "2049 inputs": ("/v1/embeddings", {"model": "embed", "input": ["a"] * 2049}, 400, "input"),
    "a shared path's unknown model": ("/v1/embeddings", {"model": "embed3", "input": "a"}, 404, "model"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_request_is_refused_naming_its_parameter(client: httpx.Client, case: str) -> None:
    path, body, status, param = CASES[case]
    answer = client.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["param"] == param
    assert param is None or param in error["message"]
    assert len(error["message"]) < 400


NOT_JSON = {
    "not JSON": b"{",
    "empty": b"",
    "not UTF-8": b"\xff\xfe",
    "nested 2000 deep": b"[" * 2000 + b"]" * 2000,
    "a message nested 1100 deep": b'{"model": "chat", "messages": ' + b"[" * 1100 + b"]" * 1100 + b"}",
    "NaN": b"NaN",
    "a number past a double": b'{"model": "chat", "messages": [{"role": "user", "content": "hi"}], "n": 1e999}',
    "a lone surrogate": b'{"model": "chat", "messages": [{"role": "user", "content": "\\ud800"}]}',
    "content after the object": b'{"model": "chat", "messages": []} trailing',
}


@pytest.mark.parametrize("case", list(NOT_JSON))
@pytest.mark.parametrize("path", [CHAT, "/v1/embeddings"], ids=["one API", "a shared path"])
def test_a_body_that_is_not_json_is_a_400(client: httpx.Client, case: str, path: str) -> None:
    for content_type in ("application/json", "text/plain"):
        answer = client.post(path, content=NOT_JSON[case], headers={"content-type": content_type})
        assert answer.status_code == 400, answer.text
        assert "JSON" in answer.json()["error"]["message"]


def test_any_content_type_is_read_as_json(client: httpx.Client) -> None:
    """OpenAI's paths take JSON only: a body is read as JSON whatever its declared type."""
    body = json.dumps(chat()).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        answer = client.post(CHAT, content=body, headers={"content-type": content_type})
        assert answer.json()["choices"][0]["message"]["content"] == "ok"


def test_a_body_over_max_body_size_is_a_413(client: httpx.Client) -> None:
    answer = client.post(CHAT, json=said({"role": "user", "content": "x" * 200_000}))
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "request_too_large"


def test_the_openai_client_reads_the_parameter(served: tuple[httpx.Client, Failures]) -> None:
    with openai.OpenAI(base_url=f"{served[0].base_url}/v1", api_key="unused", max_retries=0) as official:
        with pytest.raises(openai.BadRequestError) as caught:
            official.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}], n=0)
    assert caught.value.param == "n"


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
FIELDS = ["messages", "n", "max_tokens", "stream", "stream_options", "temperature", "top_p", "stop", "model"]


@hypothesis.settings(max_examples=40, deadline=None, derandomize=True, database=None)
@hypothesis.given(fields=st.dictionaries(st.sampled_from(FIELDS), JSON, min_size=1, max_size=3))
def test_any_json_in_the_known_fields_is_answered_or_refused(
    served: tuple[httpx.Client, Failures], fields: dict[str, Any]
) -> None:
    """A chat request whose known fields hold any JSON: an answer or a 4xx naming a parameter, no traceback."""
    client, failures = served
    before = len(failures.lines)
    answer = client.post(CHAT, content=json.dumps(chat(**fields)).encode())
    assert answer.status_code in (200, 400, 404), answer.text
    if answer.status_code != 200:
        assert answer.json()["error"]["param"] is not None
    assert failures.lines[before:] == []
