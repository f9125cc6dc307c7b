"""Malformed V2 requests through a real server: every one a 400 whose JSON error names the input (or the header)
that is wrong, decided before an array of the declared shape could exist; and JSON booleans refused where a
number is documented, on the V2 route and on an ONNX API's own route.

One server holds an ONNX API (``iris``: FP32 ``input`` [batch, 4]) and a Model class that declares nothing
(``echo``), so that every datatype and shape reaches the decoder rather than the metadata's checks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import Server, write_project
from tests.models import iris_onnx

PROJECT = """
apis:
  - name: iris
    model: {path: iris.onnx}
  - name: echo
    handler: {path: model.py, class: Echo}
"""

MODEL = """
class Echo:
    def predict(self, inputs):
        return dict(inputs)
"""


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()  # the standard library's: integers beyond 64 bits too


HUGE = [0, 2**40, 2**40]  # no element, but numpy cannot hold the shape (2**80 of them beside the zero)
DEEP = [1] * 70  # numpy's arrays have at most 64 dimensions


@pytest.fixture(scope="module")
def server(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Server:
    root = write_project(tmp_path_factory.mktemp("v2-malformed"), {"modelserve.yaml": PROJECT, "model.py": MODEL})
    iris_onnx(root / "iris.onnx")
    started: Server = start_server_module(root, "--no-access-log")
    started.wait_ready(timeout=90)
    return started


def json_body(name: str, datatype: Any, shape: Any, data: Any, **extra: Any) -> tuple[bytes, dict[str, str]]:
    return dumps({"inputs": [{"name": name, "datatype": datatype, "shape": shape, "data": data}], **extra}), {}


def binary_body(name: str, datatype: Any, shape: Any, size: Any, data: bytes = b"") -> tuple[bytes, dict[str, str]]:
    tensor = {"name": name, "datatype": datatype, "shape": shape, "parameters": {"binary_data_size": size}}
    header = dumps({"inputs": [tensor]})
    return header + data, {"Inference-Header-Content-Length": str(len(header))}


CASES = {
    # shapes that numpy cannot make (ValueError from np.reshape before)
    "json-zero-beside-huge": ("echo", *json_body("x", "FP32", HUGE, []), "input 'x'"),
    "json-zero-beside-huge-onnx": ("iris", *json_body("input", "FP32", HUGE, []), "input 'input'"),
    "json-int-zero-beside-huge": ("echo", *json_body("x", "INT64", HUGE, []), "input 'x'"),
    "json-bytes-zero-beside-huge": ("echo", *json_body("x", "BYTES", HUGE, []), "input 'x'"),
    "binary-zero-beside-huge": ("echo", *binary_body("x", "FP32", HUGE, 0), "input 'x'"),
    "binary-zero-beside-huge-onnx": ("iris", *binary_body("input", "FP32", HUGE, 0), "input 'input'"),
    "binary-bytes-zero-beside-huge": ("echo", *binary_body("x", "BYTES", HUGE, 0), "input 'x'"),
    "json-70-dimensions": ("echo", *json_body("x", "FP32", DEEP, [1.0]), "input 'x'"),
    "json-70-dimensions-onnx": ("iris", *json_body("input", "FP32", DEEP, [1.0]), "input 'input'"),
    "binary-70-dimensions": ("echo", *binary_body("x", "FP32", DEEP, 4, b"\0" * 4), "input 'x'"),
    "binary-bytes-70-dimensions": ("echo", *binary_body("x", "BYTES", DEEP, 5, b"\1\0\0\0a"), "input 'x'"),
    # more elements than the body can hold: refused before the data is read
    "json-count-beyond-body": ("echo", *json_body("x", "FP32", [2**40], [1.0]), "input 'x'"),
    "binary-bytes-count-beyond-body": ("echo", *binary_body("x", "BYTES", [2**40], 4, b"\0" * 4), "input 'x'"),
    "binary-size-beyond-body": ("echo", *binary_body("x", "UINT8", [2**70], 2**70), "input 'x'"),
    # dimensions that are not integers >= 0
    "bool-dimension": ("echo", *json_body("x", "FP32", [True, 2], [1.0, 2.0]), "input 'x'"),
    "float-dimension": ("echo", *json_body("x", "FP32", [2.0], [1.0, 2.0]), "input 'x'"),
    "negative-dimension": ("echo", *json_body("x", "FP32", [-1, 2], [1.0, 2.0]), "input 'x'"),
    "string-shape": ("echo", *json_body("x", "FP32", "2", [1.0, 2.0]), "input 'x'"),
    "no-shape": ("echo", dumps({"inputs": [{"name": "x", "datatype": "FP32", "data": [1]}]}), {}, "input 'x'"),
    # sizes and datatypes
    "bool-binary-size": ("echo", *binary_body("x", "UINT8", [1], True, b"\1"), "input 'x'"),
    "negative-binary-size": ("echo", *binary_body("x", "UINT8", [1], -1, b"\1"), "input 'x'"),
    "bool-datatype": ("echo", *json_body("x", True, [1], [1]), "input 'x'"),
    "bf16-as-json": ("echo", *json_body("x", "BF16", [1], [1.0]), "input 'x'"),
    "bytes-of-numbers": ("echo", *json_body("x", "BYTES", [2], [1, 2]), "input 'x'"),
    "bytes-element-past-its-size": ("echo", *binary_body("x", "BYTES", [1], 5, b"\xff\0\0\0a"), "input 'x'"),
    # JSON booleans where the protocol takes numbers (Triton takes them for BOOL only)
    "bool-in-fp32": ("iris", *json_body("input", "FP32", [1, 4], [False, 1, 2, 3]), "input 'input'"),
    "bool-in-fp64": ("echo", *json_body("x", "FP64", [2], [1.5, True]), "input 'x'"),
    "bool-in-int32": ("echo", *json_body("x", "INT32", [2], [1, True]), "input 'x'"),
    "bool-in-uint8": ("echo", *json_body("x", "UINT8", [2], [True, False]), "input 'x'"),
    "number-in-bool": ("echo", *json_body("x", "BOOL", [2], [1, 0]), "input 'x'"),
    # requested outputs and parameters
    "output-parameters-not-an-object": (
        "echo",
        *json_body("x", "FP32", [1], [1.0], outputs=[{"name": "x", "parameters": 3}]),
        "output 'x'",
    ),
    "input-parameters-not-an-object": (
        "echo",
        dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1], "parameters": [1]}]}),
        {},
        "input 'x'",
    ),
}


@pytest.mark.parametrize(("model", "body", "headers", "names"), list(CASES.values()), ids=list(CASES))
def test_each_malformed_tensor_is_a_400_naming_it(
    server: Server, model: str, body: bytes, headers: dict[str, str], names: str
) -> None:
    answer = httpx.post(f"{server.url}/v2/models/{model}/infer", content=body, headers=headers)
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert names in error["error"]
    assert error["request_id"]


@pytest.mark.parametrize(
    "value",
    [
        "\u00b2".encode("latin-1"),  # '²': str.isdigit() says yes, int() says no
        "\u0661\u0662".encode(),  # Arabic-Indic digits, which int() would read as 12
        b"1e3",
        b"-5",
        b"0x10",
        b"9" * 5000,  # beyond int()'s 4300 digits
    ],
    ids=["superscript-two", "arabic-indic", "exponent", "negative", "hex", "5000-digits"],
)
def test_inference_header_content_length_must_be_ascii_digits(server: Server, value: bytes) -> None:
    body, _ = json_body("x", "FP32", [1], [1.0])
    answer = httpx.post(
        f"{server.url}/v2/models/echo/infer",
        content=body,
        headers=[(b"Inference-Header-Content-Length", value)],
    )
    assert answer.status_code == 400, answer.text
    assert "Inference-Header-Content-Length" in answer.json()["error"]


def test_what_is_well_formed_still_passes(server: Server) -> None:
    """The edges of the limits: an empty tensor of 64 dimensions, BOOL's booleans, zero-sized binary data."""
    url = f"{server.url}/v2/models/echo/infer"
    deepest, _ = json_body("x", "FP32", [1] * 63 + [0], [])
    assert httpx.post(url, content=deepest).json()["outputs"][0]["shape"] == [1] * 63 + [0]
    booleans, _ = json_body("x", "BOOL", [2], [True, False])
    assert httpx.post(url, content=booleans).json()["outputs"][0]["data"] == [True, False]
    text, _ = json_body("x", "BYTES", [2], ["true", "false"])  # the words, as strings, are not booleans
    assert httpx.post(url, content=text).json()["outputs"][0]["data"] == ["true", "false"]
    body, headers = binary_body("x", "FP32", [0, 2**20, 2**20], 0)
    answer = httpx.post(url, content=body, headers=headers)
    assert answer.status_code == 200 and answer.json()["outputs"][0]["shape"] == [0, 2**20, 2**20]


# ------------------------------------------------------------------------------------------------
# the ONNX API's own route: its document says number


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"input": [[False, 1, 2, 3]]}, "input 'input'"),
        ({"input": [1, 2, 3, True]}, "input 'input'"),
        ({"input": False}, "input 'input'"),
        ({}, "missing input 'input'"),
    ],
)
def test_onnx_api_refuses_booleans_and_missing_inputs(server: Server, body: Any, message: str) -> None:
    answer = httpx.post(f"{server.url}/iris", json=body)
    assert answer.status_code == 400, answer.text
    assert message in answer.json()["error"]


def test_onnx_api_schema_says_number(server: Server) -> None:
    """What the route refuses is what its document leaves out: the input's items are numbers."""
    document = httpx.get(f"{server.url}/openapi.json").json()
    body = dumps([document["paths"]["/iris"]["post"]["requestBody"], document["components"]["schemas"]]).decode()
    assert '"number"' in body and '"boolean"' not in body


def test_unknown_paths_under_v2_models(server: Server, tmp_path: Path) -> None:
    nope = httpx.post(f"{server.url}/v2/models/nope/versions/3/infer", content=b"{}")
    assert nope.status_code == 400
    assert nope.json()["error"] == "Request for unknown model: 'nope' is not found"
    unknown = httpx.get(f"{server.url}/v2/models/iris/nothing-here")
    assert unknown.status_code == 404 and "'iris'" in unknown.json()["error"]
