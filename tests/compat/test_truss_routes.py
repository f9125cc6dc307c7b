"""Truss's routes over Truss Model classes (modelserve/http/truss.py, the Truss methods of
modelserve/http/openai.py and modelserve/compat/truss_backend.py): published Truss test models served as they
are, driven with the requests Truss's own tests send, and the official openai client against a Truss whose model
answers OpenAI's objects itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import write_project

DATA = Path(__file__).resolve().parents[1] / "data" / "truss"
POOLED = ("test_openai", "custom_openai_endpoints", "openai_client_streaming", "messages_streaming")

#: A Truss whose chat_completions answers OpenAI's objects itself, from a stand-in engine in its packages (as
#: a Truss that proxies to vLLM or TensorRT-LLM does).
PROXY = {
    "config.yaml": """
        model_name: proxy
    """,
    "packages/engine.py": """
        import json
        import time


        class Engine:
            # Stand-in for an inference engine: echoes the last message, word by word.
            def tokens(self, messages):
                yield from messages[-1]["content"].split()

            def chunk(self, text, finish=None):
                delta = {"content": text} if text else {}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                chunk = {"id": "e-1", "object": "chat.completion.chunk", "created": int(time.time()),
                         "model": "proxy", "choices": [choice]}
                return "data: " + json.dumps(chunk) + "\\n\\n"
    """,
    "model/model.py": """
        import time

        from engine import Engine


        class Model:
            def __init__(self, **kwargs):
                self._engine = Engine()

            def chat_completions(self, inputs):
                if inputs.get("stream"):
                    return self._stream(inputs["messages"])
                text = " ".join(self._engine.tokens(inputs["messages"]))
                message = {"role": "assistant", "content": text}
                return {"id": "e-1", "object": "chat.completion", "created": int(time.time()), "model": "proxy",
                        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}

            def _stream(self, messages):
                for token in self._engine.tokens(messages):
                    yield self._engine.chunk(token + " ")
                yield self._engine.chunk("", "stop")
                yield "data: [DONE]\\n\\n"

            def predict(self, inputs):
                return {"predicted": inputs}
    """,
}


@pytest.fixture(scope="module")
def pool(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    proxy = write_project(tmp_path_factory.mktemp("truss") / "proxy", PROXY)
    servers = {case: start_server_module(DATA / case) for case in POOLED}
    servers["proxy"] = start_server_module(proxy)
    for server in servers.values():
        server.wait_ready()
    return servers


def test_each_openai_named_method_answers_at_its_path(pool: dict[str, Any]) -> None:
    """truss/tests/test_data/test_openai: each method returns its own name."""
    url = pool["test_openai"].url
    for method, path in [
        ("chat_completions", "/v1/chat/completions"),
        ("completions", "/v1/completions"),
        ("embeddings", "/v1/embeddings"),
        ("messages", "/v1/messages"),
        ("responses", "/v1/responses"),
    ]:
        answer = httpx.post(url + path, json={"prompt": "x"})
        assert answer.status_code == 200, answer.text
        assert answer.json() == method


def test_predict_answers_under_truss_s_and_sagemaker_s_paths(pool: dict[str, Any]) -> None:
    url = pool["test_openai"].url
    assert httpx.post(url + "/v1/models/test-openai-compatibility:predict", json={}).json() == "predict"
    assert httpx.post(url + "/invocations", json={}).json() == "predict"
    assert httpx.post(url + "/test-openai-compatibility", json={}).json() == "predict"
    ping = httpx.get(url + "/ping")
    assert (ping.status_code, ping.json()) == (200, {})


def test_model_readiness_and_the_model_list(pool: dict[str, Any]) -> None:
    url = pool["test_openai"].url
    assert httpx.get(url + "/v1/models/test-openai-compatibility").status_code == 200
    assert httpx.get(url + "/v1/models/another").status_code == 404
    assert [model["id"] for model in httpx.get(url + "/v1/models").json()["data"]] == ["test-openai-compatibility"]


def test_head_is_safe_on_truss_s_routes(pool: dict[str, Any]) -> None:
    url = pool["custom_openai_endpoints"].url
    before = httpx.post(url + "/v1/completions", json={"increment": 0}).json()
    for path in ("/v1/completions", "/v1/models/model:predict", "/invocations"):
        assert httpx.head(url + path).status_code == 405
    assert httpx.post(url + "/v1/completions", json={"increment": 0}).json() == before
    assert httpx.head(url + "/ping").status_code == 200


def test_custom_openai_endpoints(pool: dict[str, Any]) -> None:
    """truss/tests/test_model_inference.py::test_custom_openai_endpoints, its requests and assertions."""
    url = pool["custom_openai_endpoints"].url
    predict_url = url + "/v1/models/model:predict"
    response = httpx.post(predict_url, json={"increment": 1})
    assert response.status_code == 200
    assert response.json() == 1

    response = httpx.post(url + "/v1/completions", json={"increment": 2})
    assert response.status_code == 200
    assert response.json() == 2

    response = httpx.post(url + "/v1/embeddings", json={"increment": 3})
    assert response.status_code == 200
    assert response.json() == 3

    response = httpx.post(url + "/v1/messages", json={"increment": 4})
    assert response.status_code == 200
    assert response.json() == 4

    response = httpx.post(url + "/v1/responses", json={"increment": 5})
    assert response.status_code == 200
    assert response.json() == 5

    response = httpx.post(url + "/v1/chat/completions", json={"increment": 6})
    assert response.status_code == 404


@pytest.mark.parametrize(
    ("case", "path"), [("openai_client_streaming", "/v1/chat/completions"), ("messages_streaming", "/v1/messages")]
)
def test_an_openai_client_is_streamed_to_even_when_it_asks_for_json(pool: dict[str, Any], case: str, path: str) -> None:
    """test_openai_client_streaming and test_messages_streaming: the request they send, chunked back."""
    headers = {"accept": "application/json", "user-agent": "OpenAI/Python 1.61.0"}
    with httpx.stream("POST", pool[case].url + path, json={"nums": ["1", "2"]}, headers=headers) as response:
        assert response.headers.get("transfer-encoding") == "chunked"
        assert b"".join(response.iter_bytes()) == b"12"


def test_another_client_asking_for_json_gets_the_chunks_gathered(pool: dict[str, Any]) -> None:
    url = pool["openai_client_streaming"].url
    answer = httpx.post(url + "/v1/chat/completions", json={"nums": ["1", "2"]}, headers={"accept": "application/json"})
    assert answer.json() == "12"


def test_a_body_that_is_not_json_is_a_400(pool: dict[str, Any]) -> None:
    answer = httpx.post(pool["test_openai"].url + "/v1/chat/completions", content=b"{oops")
    assert answer.status_code == 400
    assert "request_id" in answer.json()


def test_the_openai_client_against_a_truss_that_answers_openai_s_objects(pool: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=pool["proxy"].url + "/v1", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": "hello from openai"}]
    whole = client.chat.completions.create(model="proxy", messages=messages)
    assert whole.choices[0].message.content == "hello from openai"
    chunks = list(client.chat.completions.create(model="proxy", messages=messages, stream=True))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == "hello from openai "
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert [model.id for model in client.models.list()] == ["proxy"]


def test_the_routes_are_in_the_openapi_document(pool: dict[str, Any]) -> None:
    from openapi_spec_validator import validate

    document = httpx.get(pool["test_openai"].url + "/openapi.json").json()
    validate(document)  # operation ids stay unique: the aliases of predict are listed apart
    paths = document["paths"]
    for path in ("/v1/chat/completions", "/v1/messages", "/v1/models/test-openai-compatibility:predict", "/ping"):
        assert path in paths
    assert set(paths["/invocations"]) == {"post"}


def test_a_class_with_websocket_and_predict_is_refused_at_load(start_server: Any) -> None:
    """test_raise_predict_and_websocket_endpoint: the model cannot load, and the log says why."""
    server = start_server(DATA / "raise_predict_and_websocket_endpoint")
    assert server.wait_exit(60) != 0
    assert "cannot have both" in server.log


# ------------------------------------------------------------------------------------------------------------
# Truss's binary predict: msgpack in and out (the layout of truss/templates/shared/serialization.py and
# msgpack-numpy, written out here by hand as a Truss client's packb sends it)

BINARY = {
    "config.yaml": "model_name: binary",
    "model/model.py": """
        import numpy as np


        class Model:
            def predict(self, inputs):
                array = inputs["array"]
                return {"when": inputs["when"], "id": inputs["id"], "sum": array.sum(), "doubled": array * 2}
    """,
}
OCTET = {"content-type": "application/octet-stream"}


def nd(values: list[float]) -> dict[bytes, Any]:
    import numpy as np

    array = np.asarray(values, dtype="<f8")
    return {b"nd": True, b"type": "<f8", b"kind": b"", b"shape": [len(values)], b"data": array.tobytes()}


@pytest.fixture(scope="module")
def binary_server(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    served = start_server_module(write_project(tmp_path_factory.mktemp("binary") / "truss", BINARY))
    served.wait_ready()
    return served


@pytest.mark.parametrize("path", ["/v1/models/binary:predict_binary", "/v1/models/binary:predict", "/invocations"])
def test_an_octet_stream_body_is_truss_s_msgpack_and_so_is_the_answer(binary_server: Any, path: str) -> None:
    import msgpack
    import numpy as np

    when = {b"__dt_datetime_iso__": True, b"data": "2024-05-01T12:00:00Z"}
    ident = {b"__uuid__": True, b"data": "12345678-1234-5678-1234-567812345678"}
    body = msgpack.packb({"array": nd([1.0, 2.0, 3.5]), "when": when, "id": ident})
    response = httpx.post(binary_server.url + path, content=body, headers=OCTET)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    answer = msgpack.unpackb(response.content)
    assert answer["when"] == when and answer["id"] == ident
    assert answer["sum"] == 6.5  # a NumPy float is a float to msgpack, as in Truss
    doubled = answer["doubled"]
    assert (doubled[b"type"], doubled[b"shape"]) == ("<f8", [3])
    assert np.frombuffer(doubled[b"data"], "<f8").tolist() == [2.0, 4.0, 7.0]


def test_predict_binary_answers_json_to_json(start_server: Any, tmp_path: Path) -> None:
    served = start_server(write_project(tmp_path / "truss", {**BINARY, "model/model.py": ECHO}))
    served.wait_ready()
    response = httpx.post(served.url + "/v1/models/binary:predict_binary", json={"a": [1, 2]})
    assert (response.status_code, response.json()) == (200, {"echo": {"a": [1, 2]}})


ECHO = """
class Model:
    def predict(self, inputs):
        return {"echo": inputs}
"""


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b"\xc1not msgpack", "msgpack"),
        ({"array": {**nd([1.0, 2.0]), b"shape": [3]}, "when": None, "id": None}, "shape"),
        ({"array": {**nd([1.0]), b"type": "|O8"}, "when": None, "id": None}, "dtype"),
    ],
)
def test_a_bad_binary_body_is_a_400_naming_what_is_wrong(binary_server: Any, body: Any, named: str) -> None:
    import msgpack

    content = body if isinstance(body, bytes) else msgpack.packb(body)
    response = httpx.post(binary_server.url + "/v1/models/binary:predict_binary", content=content, headers=OCTET)
    assert response.status_code == 400
    assert named in response.json()["error"]
