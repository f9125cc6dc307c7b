"""schemathesis over every route of one server that has every kind of API, driven by the server's own OpenAPI
document (modelserve/http/openapi.py): Model classes typed, untyped, batched and streaming, an ONNX model, an
async API and its jobs, ``openai: chat`` and ``openai: embeddings``, a Truss API (``truss: config.yaml``), the
numbered versions of a model, the V2 routes and repository, API keys and CORS, on a real uvicorn."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import write_project
from tests.http.test_openapi import schemathesis_command
from tests.http.test_repository import plus_onnx
from tests.models import iris_onnx

KEY = "all-routes-key-" + "k" * 24
ENV = {"ALL_ROUTES_KEYS": KEY}
ORIGIN = "http://app.example"

PROJECT = {
    "modelserve.yaml": """
        jobs: {store: memory}
        auth: {api_keys_env: ALL_ROUTES_KEYS}
        cors: {allow_origins: ["http://app.example"]}
        apis:
          - {name: typed, handler: {path: models.py, class: Typed}}
          - {name: echo, handler: {path: models.py, class: Echo}}
          - name: batched
            handler: {path: models.py, class: Batched}
            batching: {max_batch_size: 4, max_wait_ms: 5}
          - {name: tokens, handler: {path: models.py, class: Tokens}, timeout: 10}
          - {name: iris, model: {path: iris.onnx}}
          - {name: words, kind: async, handler: {path: models.py, class: Words}}
          - {name: chat, handler: {path: models.py, class: Chat}, openai: chat}
          - {name: embed, handler: {path: models.py, class: Embed}, openai: embeddings}
          - {name: trussed, truss: config.yaml}
          - {name: plus, model: {path: models/plus, version_policy: all}}
    """,
    "config.yaml": "model_name: trussed\n",
    "model/model.py": """
        class Model:
            def predict(self, inputs):
                return {"kind": type(inputs).__name__}
    """,
    "models.py": """
        from __future__ import annotations

        from collections.abc import Iterator
        from typing import Annotated

        import pydantic


        class Point(pydantic.BaseModel):
            x: Annotated[float, pydantic.Field(ge=-1e6, le=1e6)]
            y: Annotated[float, pydantic.Field(ge=-1e6, le=1e6)]


        class Distance(pydantic.BaseModel):
            value: float


        class Typed:
            def predict(self, point: Point) -> Distance:
                return Distance(value=abs(point.x) + abs(point.y))


        class Echo:
            def predict(self, inputs):
                return inputs


        class Batched:
            def predict(self, rows):
                return [len(str(row)) for row in rows]


        class Tokens:
            def predict(self, prompt: str) -> Iterator[str]:
                for word in prompt.split()[:5]:
                    yield word + " "


        class Words:
            def handle_async(self, payload):
                return {"words": len(str(payload).split())}


        def text_of(inputs):
            # The API's own route (/chat, /embed) takes any JSON value, OpenAI's path a checked object.
            if not isinstance(inputs, dict):
                return str(inputs)
            if isinstance(inputs.get("messages"), list):
                return str(inputs["messages"][-1])
            return str(inputs.get("input", ""))


        class Chat:
            def predict(self, inputs):
                text = text_of(inputs)
                tokens = inputs.get("max_tokens") if isinstance(inputs, dict) else None
                used = tokens if type(tokens) is int else 1  # an int, as OpenAI's type says, or 1
                return {"text": text.upper(), "usage": {"prompt_tokens": len(text.split()), "completion_tokens": used}}


        class Embed:
            def predict(self, inputs):
                texts = inputs.get("input") if isinstance(inputs, dict) else inputs
                if not isinstance(texts, list):
                    return [float(len(str(texts))), 0.5]
                return {"embeddings": [[float(len(str(t))), 0.5] for t in texts], "usage": {"prompt_tokens": 1}}
    """,
}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_project(tmp_path_factory.mktemp("all_routes") / "project", PROJECT)
    iris_onnx(root / "iris.onnx")
    for number in (1, 2):
        plus_onnx(root / "models" / "plus" / str(number) / "model.onnx", float(number))
    return root


@pytest.fixture(scope="module")
def server(start_server_module: Any, project: Path) -> Any:
    started = start_server_module(project, "--no-access-log", env=ENV)
    started.wait_listening(timeout=90)
    headers = {"authorization": f"Bearer {KEY}"}
    started.wait_ready(timeout=90)
    assert httpx.get(started.url + "/openapi.json", headers=headers).status_code == 200
    return started


def schemathesis(cwd: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [schemathesis_command(), "run", url + "/openapi.json", "-H", f"Authorization: Bearer {KEY}"]
    command += ["--max-examples", "6", "--seed", "1", "--generation-deterministic", "--no-color"]
    command += ["--request-timeout", "20", "--workers", "1", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd)


def passed(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert re.search(r"\d+ generated, \d+ passed", done.stdout), done.stdout[-3000:]


@pytest.mark.slow
def test_schemathesis_finds_nothing_on_every_route(server: Any, tmp_path: Path) -> None:
    # One worker: with two, hypothesis's lambda descriptions (ast, in threads) fail on CPython 3.11 with "AST
    # constructor recursion depth mismatch", an error of the fuzzer, not of the server.
    passed(schemathesis(tmp_path, server.url, "--checks", "all", "--exclude-path-regex", ":predict$"))
    # Every check but one on Truss's :predict: its application/octet-stream body is msgpack, which no schema can
    # say, so a generated byte string is rightly a 400 (positive_data_acceptance would call it a rejected body).
    passed(
        schemathesis(
            tmp_path,
            server.url,
            *("--checks", "all", "--include-path-regex", ":predict$"),
            *("--exclude-checks", "positive_data_acceptance"),
        )
    )
    assert "Traceback" not in server.log, server.log[-4000:]


# What schemathesis found, held in plain httpx (each fails on the code before the fix it names).


def post(server: Any, path: str, body: Any) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers={"authorization": f"Bearer {KEY}"}, timeout=20)


def document(server: Any) -> dict[str, Any]:
    return dict(httpx.get(server.url + "/openapi.json", headers={"authorization": f"Bearer {KEY}"}).json())


def test_openai_errors_are_documented_in_openai_s_form(server: Any) -> None:
    # Found: POST /v1/embeddings {"input": null, "model": null} -> 400 {"error": {"message": ...}}, documented as
    # modelserve's Error (a string "error"), and the body's schema let "model": null through.
    whole = document(server)
    answer = post(server, "/v1/embeddings", {"input": None, "model": None})
    assert answer.status_code == 400 and set(answer.json()["error"]) == {"message", "type", "param", "code"}
    for path in ("/v1/embeddings", "/v1/chat/completions"):
        operation = whole["paths"][path]["post"]
        assert operation["responses"]["400"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/OpenAIError"
        }
        assert operation["responses"]["401"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"  # the guard answers before the route, in modelserve's form
        }
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        assert schema["properties"]["model"] == {"type": "string", "enum": ["embed" if "embed" in path else "chat"]}
    assert whole["components"]["schemas"]["OpenAIError"]["required"] == ["error", "request_id"]
    missing = httpx.get(server.url + "/v1/models/nope", headers={"authorization": f"Bearer {KEY}"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
    assert "OpenAIError" in str(whole["paths"]["/v1/models/{name}"]["get"]["responses"]["404"])


def test_a_whole_float_is_an_integer_for_openai_s_integer_fields(server: Any) -> None:
    # Found: max_tokens 1.0 (an integer to JSON Schema, which the document uses) was a 400.
    messages = [{"role": "user", "content": "hello there"}]
    answer = post(server, "/v1/chat/completions", {"model": "chat", "messages": messages, "max_tokens": 5.0, "n": 1.0})
    assert answer.status_code == 200, answer.text
    assert "HELLO THERE" in answer.json()["choices"][0]["message"]["content"]
    assert answer.json()["usage"]["completion_tokens"] == 5  # the model was handed max_tokens as the int 5
    refused = post(server, "/v1/chat/completions", {"model": "chat", "messages": messages, "max_tokens": 5.5})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"


def test_a_float32_input_is_documented_up_to_where_it_rounds_to_infinity(server: Any) -> None:
    # Found: POST /iris [[3.402823466385289e+38, 0, 0, 0]] -> 200, above the documented maximum (float32's
    # largest, 3.4028234663852886e+38): IEEE rounding makes it that largest value. The document now gives the
    # exclusive bound where float32 overflows, 2**128 - 2**103.
    import math

    bound = 2.0**128 - 2.0**103
    schema = document(server)["paths"]["/iris"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    leaf = schema["anyOf"][1]["anyOf"][0]["items"]["items"]  # the bare batch, its full rank
    assert (leaf["exclusiveMinimum"], leaf["exclusiveMaximum"]) == (-bound, bound) and "maximum" not in leaf
    assert post(server, "/iris", [[math.nextafter(bound, 0), 0.0, 0.0, 0.0]]).status_code == 200
    assert post(server, "/iris", [[bound, 0.0, 0.0, 0.0]]).status_code == 400


def test_each_event_of_an_openai_stream_fits_the_documented_event(server: Any) -> None:
    # Found: POST /v1/chat/completions {"model": "chat", "stream": true, ...} -> 200 text/event-stream, whose
    # events ({"data": ..., "event": "message"}) did not fit the documented {"type": "string"}.
    from jsonschema import Draft202012Validator

    whole = document(server)
    for path in ("/v1/chat/completions", "/tokens"):
        schema = whole["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"]
        Draft202012Validator.check_schema(schema)
        validator = Draft202012Validator(schema)
        body = {"model": "chat", "messages": [{"role": "user", "content": "one two"}], "stream": True}
        headers = {"authorization": f"Bearer {KEY}", "accept": "text/event-stream"}
        answer = httpx.post(server.url + path, json=body if "v1" in path else "one two", headers=headers)
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/event-stream")
        events = [
            {"data": line.removeprefix("data:").strip()}
            for line in answer.text.splitlines()
            if line.startswith("data:")
        ]
        assert len(events) >= 2
        for event in events:
            validator.validate(event)
        assert not validator.is_valid(answer.text)  # the stream's text is not what one event is


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/plus", [], 200),  # an empty batch of a one-dimensional input
        ("/plus", 5.0, 200),  # a scalar fills [batch] as [1]
        ("/plus", {"x": 5.0}, 200),
        ("/plus/versions/2", [1.0, 2.0], 200),
        ("/plus", [[1.0]], 400),  # a higher rank
        ("/iris", [1.0, 2.0, 3.0, 4.0], 200),  # four numbers fill [batch, 4] as [1, 4]
        ("/iris", [], 400),  # an empty outer dimension leaves no row of 4
        ("/iris", [1.0, 2.0, 3.0], 400),
    ],
)
def test_a_model_file_s_body_is_documented_as_the_server_takes_it(
    server: Any, path: str, body: Any, status: int
) -> None:
    # Found: POST /plus [] -> 200 {"y": []}, and a scalar (5.0) -> 200, where the document asked for one row at
    # least and a list; the server reshapes a lower rank whose count fills the input's shape (Cortex's rule).
    from jsonschema import Draft202012Validator

    operation = document(server)["paths"][path.replace("/2", "/{version}")]["post"]
    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert Draft202012Validator(schema).is_valid(body) is (status == 200)
    answer = post(server, path, body)
    assert answer.status_code == status, answer.text


def test_the_v2_routes_and_cors_are_served_beside_the_document(server: Any) -> None:
    # The V2 routes (and the repository) are left out of the document, which says they follow the Open
    # Inference Protocol's own specification, so schemathesis cannot reach them from it: they are held here.
    headers = {"authorization": f"Bearer {KEY}"}
    whole = document(server)
    assert not [path for path in whole["paths"] if path.startswith("/v2")]
    assert "(`/v2/...`) follow that protocol's own specification" in whole["info"]["description"]
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    answer = httpx.post(f"{server.url}/v2/models/plus/versions/2/infer", json=body, headers=headers)
    assert answer.json()["outputs"][0]["data"] == [3.0]
    index = httpx.post(f"{server.url}/v2/repository/index", json={}, headers=headers).json()
    assert {(entry["name"], entry["version"]) for entry in index} >= {("plus", "1"), ("plus", "2"), ("iris", "1")}
    assert httpx.post(f"{server.url}/v2/repository/index", json={}).status_code == 401
    preflight = httpx.options(
        f"{server.url}/typed",
        headers={
            "origin": ORIGIN,
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization",
        },
    )
    assert preflight.status_code < 300 and preflight.headers["access-control-allow-origin"] == ORIGIN
    called = httpx.post(f"{server.url}/typed", json={"x": 1, "y": -2}, headers={**headers, "origin": ORIGIN})
    assert called.json() == {"value": 3.0} and called.headers["access-control-allow-origin"] == ORIGIN
