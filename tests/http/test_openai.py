"""OpenAI's paths over modelserve APIs with ``openai:`` (modelserve/http/openai.py), driven by the official
``openai`` package (sync and async clients) and by raw HTTP against a real server."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import write_project

KEY = "sk-test-key"

PROJECT = {
    "modelserve.yaml": """
        auth: {api_keys_env: OPENAI_TEST_KEYS}
        apis:
          - name: chat
            handler: {path: model.py, class: Chat}
            openai: chat
            max_concurrency: 4
          - name: shout
            handler: {path: model.py, class: Shout}
            openai: chat
            max_body_size: 2048
          - name: complete
            handler: {path: model.py, class: Chat}
            openai: completions
          - name: embed
            handler: {path: model.py, class: Embed}
            openai: embeddings
          - name: plain
            handler: {path: model.py, class: Shout}
    """,
    "model.py": """
        import asyncio
        from pathlib import Path


        def text_of(inputs):
            if "messages" in inputs:
                return inputs["messages"][-1]["content"]
            prompt = inputs["prompt"]
            return prompt[0] if isinstance(prompt, list) else prompt


        class Chat:
            def predict(self, inputs):
                text = text_of(inputs)
                if text == "fail":
                    raise RuntimeError("the model failed")
                if text == "forever":
                    return self.forever()
                if text == "flood":
                    return self.flood()
                if text == "not text":
                    return 42
                if inputs.get("stream") or text.startswith("gen"):
                    return self.words(text)
                return {"text": text.upper(), "usage": {"prompt_tokens": len(text.split()), "completion_tokens": 1}}

            def words(self, text):
                for word in text.split():
                    yield word + " "
                yield {"finish_reason": "length", "usage": {"prompt_tokens": 2, "completion_tokens": 5}}

            async def forever(self):
                try:
                    while True:
                        yield "tick "
                        await asyncio.sleep(0.01)
                finally:
                    Path(__file__).with_name("closed.txt").write_text("closed")


            async def flood(self):
                try:
                    while True:
                        yield "x" * 65536
                        await asyncio.sleep(0)
                finally:
                    Path(__file__).with_name("flood-closed.txt").write_text("closed")


        class Shout:
            def predict(self, inputs):
                return text_of(inputs).upper() + "!"


        class Embed:
            def predict(self, inputs):
                texts = inputs["input"]
                if isinstance(texts, str):
                    return [float(len(texts)), 0.5]
                return {"embeddings": [[float(len(t)), 0.5] for t in texts], "usage": {"prompt_tokens": len(texts)}}
    """,
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_project(tmp_path_factory.mktemp("openai") / "project", PROJECT)


@pytest.fixture(scope="module")
def server(start_server_module: Any, project: Path) -> Any:
    served = start_server_module(project, env={"OPENAI_TEST_KEYS": KEY})
    served.wait_listening()
    deadline = time.monotonic() + 60
    while httpx.get(served.url + "/readyz").status_code != 200:
        assert time.monotonic() < deadline, served.log
        time.sleep(0.05)
    return served


@pytest.fixture
def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def user(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "user", "content": text}]


def test_chat_completion_is_openai_s_object_with_the_usage_the_model_reports(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="chat", messages=user("hello there"))
    assert answer.object == "chat.completion"
    assert answer.model == "chat"
    assert answer.choices[0].message.role == "assistant"
    assert answer.choices[0].message.content == "HELLO THERE"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (2, 1, 3)


def test_chat_stream_is_chunks_then_the_finish_and_the_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="chat", messages=user("one two three"), stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == "one two three "
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 7


def test_stream_ends_with_done_on_the_wire(server: Any) -> None:
    body = {"model": "chat", "messages": user("a b"), "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=auth()) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        events = [line for line in answer.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    assert all(event.startswith("data: ") for event in events)


def test_a_generating_predict_is_one_answer_when_no_stream_is_asked(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(model="chat", messages=user("gen x y"))
    assert answer.choices[0].message.content == "gen x y "
    assert answer.choices[0].finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == 5


def test_a_text_result_is_streamed_when_a_stream_is_asked(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="shout", messages=user("hey"), stream=True))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == "HEY!"


def test_async_client_answers_and_streams(server: Any) -> None:
    async def run() -> tuple[str | None, str]:
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0) as client:
            whole = await client.chat.completions.create(model="chat", messages=user("async call"))
            stream = await client.chat.completions.create(model="chat", messages=user("x y"), stream=True)
            parts = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
            return whole.choices[0].message.content, "".join(parts)

    assert asyncio.run(run()) == ("ASYNC CALL", "x y ")


def test_completions_whole_and_streamed(client: openai.OpenAI) -> None:
    answer = client.completions.create(model="complete", prompt="say this")
    assert answer.object == "text_completion"
    assert answer.choices[0].text == "SAY THIS"
    chunks = list(client.completions.create(model="complete", prompt=["p q"], stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == "p q "


def test_embeddings_as_floats_and_as_base64(client: openai.OpenAI) -> None:
    answer = client.embeddings.create(model="embed", input=["ab", "abcd"], encoding_format="float")
    assert [item.embedding for item in answer.data] == [[2.0, 0.5], [4.0, 0.5]]
    assert answer.usage.prompt_tokens == 2
    # The client asks for base64 unless told otherwise, and decodes it.
    single = client.embeddings.create(model="embed", input="abc")
    assert [item.embedding for item in single.data] == [[3.0, 0.5]]


def test_models_lists_the_openai_apis_and_retrieves_one(client: openai.OpenAI) -> None:
    assert sorted(model.id for model in client.models.list()) == ["chat", "complete", "embed", "shout"]
    assert client.models.retrieve("embed").id == "embed"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("plain")


def test_the_model_field_picks_the_api(client: openai.OpenAI) -> None:
    assert client.chat.completions.create(model="shout", messages=user("hi")).choices[0].message.content == "HI!"
    assert client.chat.completions.create(model="chat", messages=user("hi")).choices[0].message.content == "HI"


def test_an_unknown_model_is_openai_s_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4", messages=user("hi"))
    assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert caught.value.body["param"] == "model"  # type: ignore[index]


def test_a_wrong_key_is_an_authentication_error(server: Any) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="chat", messages=user("hi"))


def test_user_code_failure_is_a_500_that_names_the_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="chat", messages=user("fail"))
    body: Any = caught.value.body
    assert body["type"] == "server_error"
    assert "the model failed" not in body["message"]


def test_a_result_that_is_not_text_is_a_500(client: openai.OpenAI) -> None:
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="chat", messages=user("not text"))


def auth() -> dict[str, str]:
    return {"authorization": f"Bearer {KEY}"}


MALFORMED = [
    ("/v1/chat/completions", b"{not json", None),  # several APIs share this path: the body names one
    ("/v1/chat/completions", b"[1, 2]", None),
    ("/v1/completions", b"{not json", None),  # one API has this path: its exchange reads the body
    ("/v1/completions", b'"text"', None),
    ("/v1/chat/completions", {"model": "chat"}, "messages"),
    ("/v1/chat/completions", {"model": "chat", "messages": []}, "messages"),
    ("/v1/chat/completions", {"model": "chat", "messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("/v1/chat/completions", {"model": "chat", "messages": [{"role": "user"}]}, "messages[0].content"),
    ("/v1/chat/completions", {"model": "chat", "messages": user("x"), "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {"model": "chat", "messages": user("x"), "temperature": 9}, "temperature"),
    ("/v1/chat/completions", {"model": "chat", "messages": user("x"), "max_tokens": 0}, "max_tokens"),
    ("/v1/chat/completions", {"model": "chat", "messages": user("x"), "n": 3}, "n"),
    ("/v1/chat/completions", {"model": "chat", "messages": user("x"), "stream": "yes"}, "stream"),
    ("/v1/chat/completions", {"model": "chat", "messages": user("x"), "stop": ["a"] * 5}, "stop"),
    ("/v1/chat/completions", {"model": 7, "messages": user("x")}, "model"),
    ("/v1/completions", {"model": "complete", "prompt": 12}, "prompt"),
    ("/v1/embeddings", {"model": "embed", "input": [1, 2, 3]}, "input[0]"),
    ("/v1/embeddings", {"model": "embed", "input": []}, "input"),
    ("/v1/embeddings", {"model": "embed", "input": "x", "encoding_format": "hex"}, "encoding_format"),
]


@pytest.mark.parametrize(("path", "body", "param"), MALFORMED)
def test_malformed_bodies_are_openai_s_400_naming_the_parameter(server: Any, path: str, body: Any, param: Any) -> None:
    if isinstance(body, bytes):
        answer = httpx.post(server.url + path, content=body, headers=auth())
    else:
        answer = httpx.post(server.url + path, json=body, headers=auth())
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


def test_unknown_fields_are_kept_and_reach_the_model(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model="chat", messages=user("ok"), extra_body={"vendor_option": {"x": 1}}, temperature=0.5
    )
    assert answer.choices[0].message.content == "OK"


def test_a_body_over_the_api_s_limit_is_a_413(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="shout", messages=user("x" * 4096))
    assert caught.value.status_code == 413
    assert caught.value.body["type"] == "invalid_request_error"  # type: ignore[index]


def test_a_client_that_leaves_stops_the_generation(client: openai.OpenAI, project: Path) -> None:
    marker = project / "closed.txt"
    marker.unlink(missing_ok=True)
    stream = client.chat.completions.create(model="chat", messages=user("forever"), stream=True)
    for count, _ in enumerate(stream):
        if count == 3:
            break
    stream.close()
    deadline = time.monotonic() + 10
    while not marker.exists():
        assert time.monotonic() < deadline, "the generator was not closed after the client left"
        time.sleep(0.02)


def test_head_on_a_post_path_runs_nothing(server: Any) -> None:
    answer = httpx.head(server.url + "/v1/chat/completions", headers=auth())
    assert answer.status_code == 405
    assert answer.headers["allow"] == "POST"


def test_the_openapi_document_lists_openai_s_paths(server: Any) -> None:
    from openapi_spec_validator import validate

    document = httpx.get(server.url + "/openapi.json", headers=auth()).json()
    validate(document)
    paths = document["paths"]
    assert set(paths["/v1/chat/completions"]["post"]["tags"]) == {"chat", "shout"}
    assert paths["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]["schema"]["required"] == [
        "model",
        "input",
    ]
    assert set(paths["/v1/models/{name}"]) == {"get"}


# ------------------------------------------------------------------------------------------------------------
# docs/openai.md's snippets, as written


def test_the_docs_page_s_snippets(start_server: Any, tmp_path: Path) -> None:
    import contextlib
    import io
    import shlex
    import subprocess

    from tests.conftest import REPO
    from tests.test_readme import blocks

    text = (REPO / "docs" / "openai.md").read_text(encoding="utf-8")
    (tmp_path / "modelserve.yaml").write_text(blocks(text, "yaml")[0])
    model, client_code = blocks(text, "python")[:2]
    (tmp_path / "model.py").write_text(model)
    served = start_server(tmp_path)
    served.wait_ready()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(client_code.replace("http://127.0.0.1:8000", served.url), "docs/openai.md", "exec"), {})  # noqa: S102 - our own docs
    assert out.getvalue().splitlines() == ["hello there", "one two ['echo-chat']"]
    (curl,) = blocks(text, "sh")
    command = shlex.split(curl.replace("\\\n", " ").replace("http://127.0.0.1:8000", served.url))
    answer = subprocess.run(command, capture_output=True, check=True, timeout=30).stdout
    assert orjson.loads(answer)["choices"][0]["message"]["content"] == "hi"


def test_a_client_that_never_reads_holds_the_stream_back_not_the_server(server: Any, project: Path) -> None:
    """A stream to a client that reads nothing waits on the transport (memory flat, the server answering), and
    its generator is closed once the client goes."""
    import socket

    marker = project / "flood-closed.txt"
    marker.unlink(missing_ok=True)
    pid = server.process.pid
    before = rss_kib(pid)
    body = orjson.dumps({"model": "chat", "messages": user("flood"), "stream": True})
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(request)
        for _ in range(20):  # the server answers others while the stream waits for this client
            assert httpx.get(server.url + "/healthz").status_code == 200
        assert rss_kib(pid) - before < 64 * 1024
    deadline = time.monotonic() + 10
    while not marker.exists():
        assert time.monotonic() < deadline, "the generator was not closed after the client left"
        time.sleep(0.02)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")
