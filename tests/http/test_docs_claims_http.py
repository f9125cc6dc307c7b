"""What docs/http.md and docs/v2.md promise about methods, error bodies and malformed requests, held to a real
server (examples/iris-onnx) where no other test checked exactly that claim."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, write_project

MODEL = """
from dataclasses import dataclass

import numpy as np


@dataclass
class Point:
    x: int


class Model:
    def predict(self, inputs):
        nan = float("nan")
        return {"nan": nan, "inf": float("inf"), "array": np.array([nan, -np.inf, 1.5]), "f32": np.float32(nan)}


class Special:
    def predict(self, inputs):
        import ml_dtypes

        return {"f": np.array([np.nan, np.inf], np.float32), "b": np.array([1.5], ml_dtypes.bfloat16)}


class Ragged:
    def predict(self, inputs):
        return {"r": [[1, 2], [3]]}


class Typed:
    def predict(self, inputs: Point):
        return {"x": inputs.x}
"""

ROW = {"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [5.1, 3.5, 1.4, 0.2]}


@pytest.fixture(scope="module")
def client(start_server_module: Any) -> Iterator[httpx.Client]:
    server = start_server_module(REPO / "examples" / "iris-onnx")
    server.wait_ready()
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def assert_error(answer: httpx.Response, status: int, fragment: str) -> None:
    """docs/http.md: every error is `{"error": ..., "request_id": ...}`, the id also in X-Request-ID."""
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert fragment in body["error"]
    assert body["request_id"] == answer.headers["x-request-id"]


@pytest.mark.parametrize("value", [42, {"a": 1}, True, ["x"]])
def test_a_v2_id_that_is_not_a_string_is_a_400(client: httpx.Client, value: object) -> None:
    """The protocol's `id` is a string (Triton refuses others); it was echoed as Python's str() of it."""
    answer = client.post("/v2/models/iris/infer", json={"id": value, "inputs": [ROW]})
    assert_error(answer, 400, "'id' must be a string")


def test_a_v2_string_id_is_echoed_as_given_and_names_the_request(client: httpx.Client) -> None:
    answer = client.post("/v2/models/iris/infer", json={"id": "req-7", "inputs": [ROW], "outputs": [{"name": "label"}]})
    assert answer.status_code == 200
    assert answer.json()["id"] == "req-7"
    assert answer.headers["x-request-id"] == "req-7"
    # X-Request-ID wins over the id; the id is still echoed as given
    answer = client.post(
        "/v2/models/iris/infer", headers={"X-Request-ID": "hdr-1"}, json={"id": "not sane!", "inputs": [ROW]}
    )
    assert (answer.headers["x-request-id"], answer.json()["id"]) == ("hdr-1", "not sane!")


@pytest.mark.parametrize("value", ["false", 0, 1])
def test_binary_data_flags_must_be_booleans(client: httpx.Client, value: object) -> None:
    """`"binary_data_output": "false"` (or an output's `"binary_data": "false"`) answered binary tensors."""
    answer = client.post("/v2/models/iris/infer", json={"inputs": [ROW], "parameters": {"binary_data_output": value}})
    assert_error(answer, 400, "'parameters': 'binary_data_output' must be true or false")
    outputs = [{"name": "label", "parameters": {"binary_data": value}}]
    answer = client.post("/v2/models/iris/infer", json={"inputs": [ROW], "outputs": outputs})
    assert_error(answer, 400, "output 'label': 'parameters': 'binary_data' must be true or false")


@pytest.mark.parametrize(("flag", "binary"), [(True, True), (False, False), (None, False)])
def test_binary_data_flags_true_false_or_null(client: httpx.Client, flag: bool | None, binary: bool) -> None:
    outputs = [{"name": "label", "parameters": {"binary_data": flag}}]
    answer = client.post("/v2/models/iris/infer", json={"inputs": [ROW], "outputs": outputs})
    assert answer.status_code == 200
    assert ("inference-header-content-length" in answer.headers) is binary
    answer = client.post("/v2/models/iris/infer", json={"inputs": [ROW], "parameters": {"binary_data_output": flag}})
    assert answer.status_code == 200
    assert ("inference-header-content-length" in answer.headers) is binary


@pytest.mark.parametrize("value", ["false", 0, 1, {}])
def test_repository_index_ready_must_be_a_boolean(client: httpx.Client, value: object) -> None:
    """`{"ready": "false"}` listed the ready models only (bool("false") is true)."""
    assert_error(client.post("/v2/repository/index", json={"ready": value}), 400, "'ready' must be true or false")


@pytest.mark.parametrize("body", [b"", b"{}", b'{"ready": true}', b'{"ready": false}', b'{"ready": null}'])
def test_repository_index_takes_no_body_or_a_boolean_ready(client: httpx.Client, body: bytes) -> None:
    answer = client.post("/v2/repository/index", content=body)
    assert answer.status_code == 200
    assert answer.json() == [{"name": "iris", "version": "1", "state": "READY", "reason": ""}]


@pytest.mark.parametrize("prefix", ["/v2/models/iris", "/v2/models/iris/versions/1"])
def test_an_unknown_route_of_a_known_model_names_every_route(client: httpx.Client, prefix: str) -> None:
    """The 404 listed 'metadata, ready, infer and stats' (no config) or, versioned, no infer."""
    assert_error(client.get(prefix + "/bogus"), 404, "has metadata, ready, infer, stats and config")
    for route in ("", "/ready", "/stats", "/config"):
        assert client.get(prefix + route).status_code == 200, route


V2_GETS = ["/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/iris", "/v2/models/iris/versions/1"]
V2_GETS += ["/v2/models/iris/ready", "/v2/models/iris/config", "/v2/models/iris/stats", "/v2/models/stats"]


@pytest.mark.parametrize("path", V2_GETS)
def test_v2_head_answers_like_get_and_other_methods_are_a_json_405(client: httpx.Client, path: str) -> None:
    get, head = client.get(path), client.head(path)
    assert (head.status_code, head.content) == (get.status_code, b"")
    assert head.headers["content-type"] == get.headers["content-type"] == "application/json"
    assert head.headers["content-length"] == str(len(get.content))
    for method in ("PUT", "DELETE", "PATCH", "OPTIONS"):
        answer = client.request(method, path)
        assert_error(answer, 405, f"method {method} is not allowed")
        assert answer.headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize("path", ["/v2/models/iris/infer", "/v2/repository/index", "/v2/repository/models/iris/load"])
def test_head_never_runs_a_v2_post_route(client: httpx.Client, path: str) -> None:
    answer = client.head(path)
    assert (answer.status_code, answer.headers["allow"], answer.content) == (405, "POST", b"")


@pytest.mark.parametrize(
    ("path", "headers", "body", "status", "fragment"),
    [
        ("/v2/models/iris/infer", {}, b"", 400, "not valid JSON"),
        ("/v2/models/iris/infer", {}, b'{"inputs": [', 400, "not valid JSON"),
        ("/v2/models/iris/infer", {}, b"[1]", 400, "must be a JSON object, got list"),
        ("/v2/models/iris/infer", {}, b'{"inputs": 5}', 400, "'inputs', a non-empty list"),
        (
            "/v2/models/iris/infer",
            {},
            b'{"inputs": [{"name": "input", "datatype": "FP99", "shape": [1, 4], "data": [1, 2, 3, 4]}]}',
            400,
            "unknown datatype 'FP99'",
        ),
        (
            "/v2/models/iris/infer",
            {},
            b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1e30, 4], "data": [1, 2, 3, 4]}]}',
            400,
            "'shape' must be a list of integers >= 0",
        ),
        (
            "/v2/models/iris/infer",
            {},
            b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 2], "data": [[1, 2, 3], [4]]}]}',
            400,
            "input 'input'",
        ),
        (
            "/v2/models/iris/infer",
            {},
            b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1e300, 1, 2, 3]}]}',
            400,
            "out of the range of FP32",
        ),
        (
            "/v2/models/iris/infer",
            {"Inference-Header-Content-Length": "-1"},
            b"{}",
            400,
            "Inference-Header-Content-Length must be",
        ),
        ("/v2/models/iris/infer", {"Content-Encoding": "gzip"}, b"{}", 400, "not valid gzip data"),
        ("/v2/models/iris/infer", {"Content-Encoding": "br"}, b"{}", 400, "Content-Encoding 'br' is not supported"),
        ("/v2/models/nope/infer", {}, b"{}", 400, "Request for unknown model: 'nope' is not found"),
        ("/v2/models/iris/versions/7/infer", {}, b"{}", 404, "Request for unknown model: 'iris' version 7"),
        ("/v2/repository/index", {}, b"{", 400, "not valid JSON"),
        ("/iris", {"Content-Type": "application/json"}, b'{"sepal_length": ', 400, "not valid JSON"),
        ("/iris", {"Content-Type": "text/plain; charset=foo"}, b"x", 400, "unknown charset 'foo'"),
        ("/iris", {"Content-Type": "text/plain; charset=rot13"}, b"x", 400, "'rot13' in the Content-Type header"),
        ("/iris", {"Content-Type": "text/plain"}, b"\xff\xfe", 400, "not valid utf-8 text"),
        ("/iris", {"Content-Type": "application/json"}, b"[1, 2]", 400, "IrisFeatures"),
        ("/nope", {}, b"{}", 404, "no API at /nope"),
    ],
)
def test_malformed_requests_get_a_4xx_naming_the_problem(
    client: httpx.Client, path: str, headers: dict[str, str], body: bytes, status: int, fragment: str
) -> None:
    assert_error(client.post(path, headers=headers, content=body), status, fragment)


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS"])
def test_native_route_other_methods_are_a_json_405_with_allow(client: httpx.Client, method: str) -> None:
    answer = client.request(method, "/iris")
    assert_error(answer, 405, f"method {method} is not allowed on /iris")
    assert answer.headers["allow"] == "GET, HEAD, POST"


@pytest.fixture(scope="module")
def own(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    apis = """
    apis:
      - name: nan
        handler: {path: model.py, class: Model}
      - name: typed
        handler: {path: model.py, class: Typed}
      - name: ragged
        handler: {path: model.py, class: Ragged}
      - name: special
        handler: {path: model.py, class: Special}
    """
    project = write_project(tmp_path_factory.mktemp("docs-http") / "p", {"model.py": MODEL, "modelserve.yaml": apis})
    server = start_server_module(project)
    server.wait_ready()
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def test_nan_and_infinities_are_answered_as_null(own: httpx.Client) -> None:
    answer = own.post("/nan", json={})
    assert answer.status_code == 200
    assert answer.json() == {"nan": None, "inf": None, "array": [None, None, 1.5], "f32": None}


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("application/json", b'{"x": 1}'),
        ("text/plain", b'{"x": 1}'),
        ("application/x-www-form-urlencoded", b'{"x": 1}'),
        ("application/json", b'"{\\"x\\": 1}"'),
    ],
)
def test_typed_inputs_read_text_and_bytes_as_json(own: httpx.Client, content_type: str, body: bytes) -> None:
    answer = own.post("/typed", headers={"Content-Type": content_type}, content=body)
    assert (answer.status_code, answer.json()) == (200, {"x": 1})


def test_typed_inputs_name_the_field_that_does_not_validate(own: httpx.Client) -> None:
    answer = own.post("/typed", json={"x": "one"})
    assert_error(answer, 400, "x")
    assert answer.json()["detail"][0]["loc"] == ["x"]


def test_a_v2_result_numpy_cannot_make_a_tensor_of_is_the_class_failure(own: httpx.Client) -> None:
    """docs/v2.md: the class's failure, a 500 naming the request id. A ragged list was the server's own
    'internal error' (numpy's ValueError escaped the encoder)."""
    x = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}
    assert_error(own.post("/v2/models/ragged/infer", json={"inputs": [x]}), 500, "user code failed")


@pytest.mark.parametrize(
    ("encoding", "compress"), [("gzip", gzip.compress), ("x-gzip", gzip.compress), ("deflate", zlib.compress)]
)
def test_a_compressed_v2_request_is_decompressed(client: httpx.Client, encoding: str, compress: Any) -> None:
    """x-gzip, gzip's alias that RFC 9110 asks a recipient to read as gzip, was a 400."""
    body = compress(b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}')
    answer = client.post("/v2/models/iris/infer", headers={"Content-Encoding": encoding}, content=body)
    assert answer.status_code == 200, answer.text
    assert [output["name"] for output in answer.json()["outputs"]] == ["label", "probabilities"]


def test_v2_json_outputs_send_nan_as_null_and_bf16_as_numbers(own: httpx.Client) -> None:
    """docs/v2.md: BF16 is binary only in a request; a BF16 output asked as JSON is numbers (tritonclient reads
    them as float32), and a NaN or infinity in a JSON output is null (binary data keeps it)."""
    pytest.importorskip("ml_dtypes")
    x = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}
    answer = own.post("/v2/models/special/infer", json={"inputs": [x]})
    assert answer.status_code == 200, answer.text
    outputs = {output["name"]: output for output in answer.json()["outputs"]}
    assert (outputs["f"]["datatype"], outputs["f"]["data"]) == ("FP32", [None, None])
    assert (outputs["b"]["datatype"], outputs["b"]["data"]) == ("BF16", [1.5])


@pytest.fixture(scope="module")
def explicit(start_server_module: Any) -> Iterator[httpx.Client]:
    server = start_server_module(REPO / "examples" / "iris-onnx", "--model-control", "explicit")
    server.wait_ready()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def test_an_unloaded_model_says_so_and_how_to_load_it(explicit: httpx.Client) -> None:
    """It answered "api 'iris' is loading; retry later", though nothing would load it but a load request."""
    assert explicit.post("/v2/repository/models/iris/unload").status_code == 200
    try:
        for answer in (
            explicit.get("/v2/models/iris/ready"),
            explicit.post("/v2/models/iris/infer", json={"inputs": [ROW]}),
            explicit.post("/iris", json={}),
        ):
            assert_error(answer, 503, "api 'iris' is unloaded; POST /v2/repository/models/iris/load loads it")
            assert "retry-after" in answer.headers
    finally:
        assert explicit.post("/v2/repository/models/iris/load").status_code == 200
    assert explicit.post("/v2/models/iris/infer", json={"inputs": [ROW]}).status_code == 200
