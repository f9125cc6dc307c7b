"""The Open Inference Protocol (V2) through real servers and real clients: tritonclient's HTTP clients (sync,
and aio) and plain httpx where a header has to be read.

One server holds every kind of API (ONNX, TensorFlow, Model classes, batching, a slow API with a short line
and a timeout); a second serves examples/iris-onnx for the README's snippet. `modelserve.v2`'s codec is
tested on its own at the end (no HTTP).
"""

from __future__ import annotations

import asyncio
import json
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from modelserve.errors import BadRequest
from modelserve.v2 import InferRequest, decode_request, encode_response
from tests.conftest import REPO, Server, write_project
from tests.models import iris_expected, iris_onnx, iris_saved_model, save_model, shared_batch_onnx, two_inputs_onnx

ml_dtypes = pytest.importorskip("ml_dtypes")
httpclient = pytest.importorskip("tritonclient.http")
aioclient = pytest.importorskip("tritonclient.http.aio")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

pytestmark = pytest.mark.slow

#: One input (and the same output, through an Identity) per fixed-size datatype, and BYTES.
NUMPY_OF = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}

CLASSES = '''
import asyncio

import numpy as np


class Echo:
    """Every input back as an output of the same name; a ``tag`` parameter comes back as an output too."""

    def predict(self, inputs):
        outputs = dict(inputs)
        parameters = getattr(inputs, "parameters", {})  # the native route gives a plain dict
        if "tag" in parameters:
            outputs["tag"] = np.array([parameters["tag"]], dtype=object)
        return outputs


class Doubler:
    """Declares its tensors; returns one array (the output named ``output``)."""

    v2_inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
    v2_outputs = [{"name": "output", "datatype": "FP32", "shape": [-1, 3]}]

    def predict(self, inputs):
        return inputs["x"] * 2


class Sleepy:
    async def predict(self, inputs):
        seconds = float(inputs.parameters.get("sleep", 0))
        await asyncio.sleep(seconds)
        return {"slept": np.array([seconds])}
'''

PROJECT = """
apis:
  - name: iris
    model: {path: iris.onnx}
  - name: batched
    model: {path: iris.onnx, inline_threshold_ms: 0}  # 0: batched however fast iris is (docs/batching.md)
    batching: {max_batch_size: 8, max_wait_ms: 20}
    max_queue_length: 200
  - name: iris_tf
    model: {path: iris_tf, format: tensorflow}
  - name: types
    model: {path: types.onnx}
  - name: two
    model: {path: two.onnx}
  - name: shared
    model: {path: shared.onnx}
  - name: echo
    handler: {path: model.py, class: Echo}
  - name: doubler
    handler: {path: model.py, class: Doubler}
  - name: sleepy
    handler: {path: model.py, class: Sleepy}
    max_concurrency: 1
    max_queue_length: 0
    timeout: 1
"""


def types_onnx(path: Path) -> Path:
    """One Identity per datatype: input ``in_<datatype>`` [n] -> output ``out_<datatype>``."""
    from onnx import TensorProto, helper

    protos = {
        "BOOL": TensorProto.BOOL,
        "UINT8": TensorProto.UINT8,
        "UINT16": TensorProto.UINT16,
        "UINT32": TensorProto.UINT32,
        "UINT64": TensorProto.UINT64,
        "INT8": TensorProto.INT8,
        "INT16": TensorProto.INT16,
        "INT32": TensorProto.INT32,
        "INT64": TensorProto.INT64,
        "FP16": TensorProto.FLOAT16,
        "FP32": TensorProto.FLOAT,
        "FP64": TensorProto.DOUBLE,
        "BYTES": TensorProto.STRING,
    }
    graph = helper.make_graph(
        [helper.make_node("Identity", [f"in_{name}"], [f"out_{name}"]) for name in protos],
        "types",
        [helper.make_tensor_value_info(f"in_{name}", proto, ["n"]) for name, proto in protos.items()],
        [helper.make_tensor_value_info(f"out_{name}", proto, ["n"]) for name, proto in protos.items()],
    )
    return save_model(graph, path)


def sample(datatype: str) -> np.ndarray:
    """Three values of a datatype, its extremes included."""
    dtype = NUMPY_OF[datatype]
    if datatype == "BOOL":
        return np.array([True, False, True])
    if datatype == "BYTES":
        return np.array([b"setosa", "versicolor \u00e9".encode(), b""], dtype=object)
    if datatype.startswith("FP"):
        return np.array([1.5, -0.25, 65504.0], dtype=dtype)
    info = np.iinfo(dtype)
    return np.array([info.min, 7, info.max], dtype=dtype)


@pytest.fixture(scope="module")
def server(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Server:
    root = write_project(tmp_path_factory.mktemp("v2"), {"modelserve.yaml": PROJECT, "model.py": CLASSES})
    iris_onnx(root / "iris.onnx")
    types_onnx(root / "types.onnx")
    two_inputs_onnx(root / "two.onnx")
    shared_batch_onnx(root / "shared.onnx")
    iris_saved_model(root / "iris_tf")
    started: Server = start_server_module(root, "--no-access-log")
    started.wait_ready(timeout=90)
    return started


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[Any]:
    triton = httpclient.InferenceServerClient(server.url.removeprefix("http://"), concurrency=16)
    yield triton
    triton.close()


def infer_input(name: str, array: np.ndarray, binary: bool) -> Any:
    datatype = "BYTES" if array.dtype == np.object_ else httpclient.np_to_triton_dtype(array.dtype)
    return httpclient.InferInput(name, list(array.shape), datatype).set_data_from_numpy(array, binary_data=binary)


def status_of(call: Any) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value.status(), caught.value.message()


ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]


# ------------------------------------------------------------------------------------------------
# health and metadata


def test_live_ready_and_server_metadata(client: Any) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "modelserve"
    assert "binary_tensor_data" in metadata["extensions"]


@pytest.mark.parametrize("version", ["", "1"])
def test_model_ready_and_metadata(client: Any, version: str) -> None:
    assert client.is_model_ready("iris", version)
    assert client.get_model_metadata("iris", version) == {
        "name": "iris",
        "versions": ["1"],
        "platform": "onnx_onnxv1",
        "inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [
            {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]},
            {"name": "label", "datatype": "INT64", "shape": [-1]},
        ],
    }


def test_metadata_of_tensorflow_and_of_model_classes(client: Any) -> None:
    tf = client.get_model_metadata("iris_tf")
    assert tf["platform"] == "tensorflow_savedmodel"
    assert tf["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert {o["name"]: o["datatype"] for o in tf["outputs"]} == {"label": "INT64", "probabilities": "FP32"}
    assert client.get_model_metadata("echo") == {
        "name": "echo",
        "versions": ["1"],
        "platform": "python",
        "inputs": [],
        "outputs": [],
    }
    doubler = client.get_model_metadata("doubler")
    assert doubler["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
    assert doubler["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [-1, 3]}]


def test_unknown_model_is_400_and_unknown_version_404_in_tritons_words(client: Any) -> None:
    x = infer_input("input", np.zeros((1, 4), np.float32), True)
    unknown = ("400", "Request for unknown model: 'nope' is not found")
    assert status_of(lambda: client.infer("nope", [x])) == unknown
    assert status_of(lambda: client.get_model_metadata("nope")) == unknown
    assert status_of(lambda: client.get_inference_statistics("nope")) == unknown
    assert status_of(lambda: client.infer("iris", [x], model_version="2")) == (
        "404",
        "Request for unknown model: 'iris' version 2 is not found",
    )
    assert not client.is_model_ready("nope")


# ------------------------------------------------------------------------------------------------
# inference


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("version", ["", "1"])
def test_infer_onnx_and_tensorflow(client: Any, binary: bool, version: str) -> None:
    probabilities, labels = iris_expected(ROWS)
    rows = np.array(ROWS, np.float32)
    for model, name in (("iris", "input"), ("iris_tf", "x")):
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("probabilities", "label")]
        result = client.infer(model, [infer_input(name, rows, binary)], model_version=version, outputs=outputs)
        np.testing.assert_allclose(result.as_numpy("probabilities"), probabilities, rtol=1e-5)
        assert result.as_numpy("label").tolist() == labels.tolist()
        assert result.get_response()["model_name"] == model


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("model", ["types", "echo"])
def test_every_datatype(client: Any, model: str, binary: bool) -> None:
    """Every datatype through an ONNX model (its string tensors take str) and a Model class (bytes)."""
    prefix = ("in_", "out_") if model == "types" else ("", "")
    inputs = [infer_input(prefix[0] + datatype, sample(datatype), binary) for datatype in NUMPY_OF]
    outputs = [httpclient.InferRequestedOutput(prefix[1] + d, binary_data=binary) for d in NUMPY_OF]
    result = client.infer(model, inputs, outputs=outputs)
    described = {output["name"]: output for output in result.get_response()["outputs"]}
    for datatype in NUMPY_OF:
        name = prefix[1] + datatype
        assert described[name]["datatype"] == datatype
        assert ("parameters" in described[name]) == binary
        got, sent = result.as_numpy(name), sample(datatype)
        if datatype == "BYTES" and not binary:
            sent = np.array([item.decode() for item in sent], dtype=object)
        assert got.dtype == sent.dtype, datatype
        assert got.tolist() == sent.tolist(), datatype


def test_bf16_travels_as_binary(client: Any) -> None:
    values = np.array([1.5, -2.0, 0.0078125], dtype=ml_dtypes.bfloat16)
    x = httpclient.InferInput("x", [3], "BF16").set_data_from_numpy(values, binary_data=True)
    result = client.infer("echo", [x], outputs=[httpclient.InferRequestedOutput("x", binary_data=True)])
    assert result.get_response()["outputs"][0]["datatype"] == "BF16"
    assert result.as_numpy("x").astype(np.float32).tolist() == [1.5, -2.0, 0.0078125]
    as_json = client.infer("echo", [x], outputs=[httpclient.InferRequestedOutput("x", binary_data=False)])
    assert as_json.get_response()["outputs"][0]["data"] == [1.5, -2.0, 0.0078125]


def test_mixed_json_and_binary_inputs(client: Any) -> None:
    a = infer_input("a", np.array([[1.0, 2.0]], np.float32), False)
    b = infer_input("b", np.array([[10, 20]], np.int32), True)
    flag = infer_input("flag", np.array(True), True)
    result = client.infer("two", [a, b, flag])
    assert result.as_numpy("sum").tolist() == [[11.0, 22.0]]
    assert result.as_numpy("flag_out").tolist() is True


def test_model_class_gets_parameters_and_one_array_is_output(client: Any) -> None:
    x = infer_input("x", np.array([[1.0, 2.0, 3.0]], np.float32), True)
    result = client.infer("doubler", [x])
    assert result.as_numpy("output").tolist() == [[2.0, 4.0, 6.0]]
    tagged = client.infer("echo", [x], parameters={"tag": "hello"})
    assert tagged.as_numpy("tag").tolist() == [b"hello"]


def test_binary_data_output_and_requested_outputs(server: Server) -> None:
    request = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 4], "data": ROWS}]}
    both = httpx.post(
        f"{server.url}/v2/models/iris/infer", json={**request, "parameters": {"binary_data_output": True}}
    )
    length = int(both.headers["inference-header-content-length"])
    result = httpclient.InferResult.from_response_body(both.content, header_length=length)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["probabilities", "label"]
    assert all("binary_data_size" in o["parameters"] for o in result.get_response()["outputs"])
    assert result.as_numpy("label").tolist() == iris_expected(ROWS)[1].tolist()
    # Only the output asked for; the default (JSON) when it says nothing.
    one = httpx.post(f"{server.url}/v2/models/iris/infer", json={**request, "outputs": [{"name": "label"}]})
    assert "inference-header-content-length" not in one.headers
    labels = iris_expected(ROWS)[1].tolist()
    assert one.json()["outputs"] == [{"name": "label", "datatype": "INT64", "shape": [2], "data": labels}]
    unknown = httpx.post(f"{server.url}/v2/models/iris/infer", json={**request, "outputs": [{"name": "nope"}]})
    assert unknown.status_code == 400 and "unknown output 'nope'" in unknown.json()["error"]


def test_raw_binary_request(server: Server) -> None:
    rows = np.array(ROWS, np.float32)
    for model in ("iris", "doubler"):
        data = rows if model == "iris" else rows[:, :3]
        answer = httpx.post(
            f"{server.url}/v2/models/{model}/infer",
            content=data.tobytes(),
            headers={"Inference-Header-Content-Length": "0"},
        )
        assert answer.status_code == 200, answer.text
        outputs = {o["name"]: o for o in answer.json()["outputs"]}
        if model == "iris":
            assert outputs["label"]["data"] == iris_expected(ROWS)[1].tolist()
        else:
            assert outputs["output"]["shape"] == [2, 3]
    # An API without a single known input cannot take one.
    refused = httpx.post(
        f"{server.url}/v2/models/echo/infer", content=b"1234", headers={"Inference-Header-Content-Length": "0"}
    )
    assert refused.status_code == 400 and "raw binary request" in refused.json()["error"]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_requests(client: Any, server: Server, algorithm: str) -> None:
    x = infer_input("input", np.array(ROWS, np.float32), True)
    result = client.infer("iris", [x], request_compression_algorithm=algorithm)
    assert result.as_numpy("label").tolist() == iris_expected(ROWS)[1].tolist()
    refused = httpx.post(f"{server.url}/v2/models/iris/infer", content=b"{}", headers={"Content-Encoding": "br"})
    assert refused.status_code == 400 and "Content-Encoding 'br'" in refused.json()["error"]


def test_request_id_is_echoed(server: Server, client: Any) -> None:
    x = infer_input("input", np.array(ROWS, np.float32), True)
    assert client.infer("iris", [x], request_id="req-42").get_response()["id"] == "req-42"
    request = {"id": "body-id", "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": ROWS[0]}]}
    answer = httpx.post(f"{server.url}/v2/models/iris/infer", json=request)
    assert answer.headers["x-request-id"] == "body-id" and answer.json()["id"] == "body-id"
    answer = httpx.post(f"{server.url}/v2/models/iris/infer", json=request, headers={"X-Request-ID": "header-id"})
    assert answer.headers["x-request-id"] == "header-id" and answer.json()["id"] == "body-id"
    bad = httpx.post(f"{server.url}/v2/models/iris/infer", json={**request, "inputs": []})
    assert bad.status_code == 400 and bad.json()["request_id"] == bad.headers["x-request-id"]


def test_v2_and_native_answers_are_equal(server: Server, client: Any) -> None:
    for model, name in (("iris", "input"), ("iris_tf", "x")):
        native = httpx.post(f"{server.url}/{model}", json={name: ROWS}).json()
        for binary in (False, True):
            outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("probabilities", "label")]
            result = client.infer(model, [infer_input(name, np.array(ROWS, np.float32), binary)], outputs=outputs)
            for output in ("probabilities", "label"):
                assert (
                    result.as_numpy(output).tolist()
                    == np.asarray(native[output], result.as_numpy(output).dtype).tolist()
                )


# ------------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize(
    ("model", "inputs", "message"),
    [
        ("iris", [("input", np.zeros((1, 3), np.float32))], "input 'input': shape [1, 3], but the model expects"),
        ("iris", [("input", np.zeros((4,), np.float32))], "input 'input': shape [4]"),
        ("iris", [("input", np.zeros((1, 4), np.float64))], "input 'input': datatype FP64, but the model expects"),
        ("iris", [("features", np.zeros((1, 4), np.float32))], "unknown input 'features'; missing input 'input'"),
        ("two", [("a", np.zeros((1, 2), np.float32))], "missing input 'b'"),
        ("doubler", [("x", np.zeros((1, 3), np.int32))], "input 'x': datatype INT32"),
        ("shared", [("a", np.zeros((1, 2), np.float32)), ("b", np.zeros((2, 2), np.float32))], "dimension 'batch'"),
    ],
)
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_wrong_tensors_are_400_naming_them(
    client: Any, model: str, inputs: list[tuple[str, np.ndarray]], message: str, binary: bool
) -> None:
    tensors = [infer_input(name, array, binary) for name, array in inputs]
    status, text = status_of(lambda: client.infer(model, tensors))
    assert status == "400"
    assert message in text


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        (b"{", "not valid JSON"),
        (b'{"inputs": 3}', "'inputs', a non-empty list"),
        (b'{"inputs": [{"name": "input", "datatype": "FP99", "shape": [1], "data": [1]}]}', "unknown datatype"),
        (b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1, 2]}]}', "has 4 elements"),
        (b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, null, 4]}]}', "null"),
        (b'{"inputs": [{"name": "input", "datatype": "INT64", "shape": [1], "data": [1.5]}]}', "must be integers"),
        (b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4]}]}', "neither 'data' nor"),
    ],
)
def test_malformed_requests_are_400(server: Server, request_body: bytes, message: str) -> None:
    answer = httpx.post(f"{server.url}/v2/models/iris/infer", content=request_body)
    assert answer.status_code == 400
    assert message in answer.json()["error"]


def test_binary_sizes_are_checked(server: Server) -> None:
    header = (
        b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "parameters": {"binary_data_size": 16}}]}'
    )
    url = f"{server.url}/v2/models/iris/infer"
    short = httpx.post(url, content=header + b"\0" * 8, headers={"Inference-Header-Content-Length": str(len(header))})
    assert short.status_code == 400 and "binary_data_size is 16" in short.json()["error"]
    extra = httpx.post(url, content=header + b"\0" * 20, headers={"Inference-Header-Content-Length": str(len(header))})
    assert extra.status_code == 400 and "belong to no input" in extra.json()["error"]


def test_full_queue_is_503_with_retry_after_and_timeout_is_504(server: Server, client: Any) -> None:
    x = infer_input("x", np.zeros(1, np.float32), True)

    async def scenario() -> None:
        async with aioclient.InferenceServerClient(server.url.removeprefix("http://")) as aio:
            busy = asyncio.ensure_future(aio.infer("sleepy", [x], parameters={"sleep": 0.6}))
            await asyncio.sleep(0.2)
            status, text = status_of(lambda: client.infer("sleepy", [x]))
            assert status == "503" and "retry later" in text
            async with httpx.AsyncClient() as plain:
                full = await plain.post(f"{server.url}/v2/models/sleepy/infer", content=b'{"inputs": []}')
            assert full.status_code == 503 and full.headers["retry-after"] == "1"
            assert (await busy).as_numpy("slept").tolist() == [0.6]
            with pytest.raises(InferenceServerException) as caught:
                await aio.infer("sleepy", [x], parameters={"sleep": 3})
            assert caught.value.status() == "504"
            assert "timeout of 1.0 s" in caught.value.message()

    asyncio.run(scenario())


def test_concurrent_async_infer_with_batching_get_their_own_rows(server: Server, client: Any) -> None:
    rng = np.random.default_rng(0)
    batches = [rng.uniform(0, 8, size=(1 + i % 3, 4)).astype(np.float32) for i in range(48)]

    def check(rows: np.ndarray, result: Any) -> None:
        probabilities, labels = iris_expected(rows.tolist())
        np.testing.assert_allclose(result.as_numpy("probabilities"), probabilities, rtol=1e-5, atol=1e-7)
        assert result.as_numpy("label").tolist() == labels.tolist()

    # tritonclient's sync client: async_infer on its pool of 16 connections.
    pending = [client.async_infer("batched", [infer_input("input", rows, True)]) for rows in batches[:24]]
    for rows, call in zip(batches[:24], pending, strict=True):
        check(rows, call.get_result())

    async def aio_calls() -> list[Any]:
        async with aioclient.InferenceServerClient(server.url.removeprefix("http://")) as aio:
            calls = [aio.infer("batched", [infer_input("input", rows, i % 2 == 0)]) for i, rows in enumerate(batches)]
            return await asyncio.gather(*calls)

    for rows, result in zip(batches, asyncio.run(aio_calls()), strict=True):
        check(rows, result)
    batching = httpx.get(f"{server.url}/batched").json()["batching"]
    assert batching["stacked_calls"] >= 1 and batching["requests"] == 72


def test_metrics_count_v2_answers(server: Server) -> None:
    httpx.post(f"{server.url}/v2/models/iris/infer", content=b"{")
    exposition = httpx.get(f"{server.url}/metrics").text
    assert re.search(r'modelserve_requests_total\{api="iris",code="200"\} [1-9]', exposition)
    assert re.search(r'modelserve_requests_total\{api="iris",code="400"\} [1-9]', exposition)


# ------------------------------------------------------------------------------------------------
# docs/v2.md's tritonclient snippet, against examples/iris-onnx (whose hooks V2 requests skip)


def readme_snippet() -> str:
    text = (REPO / "docs" / "v2.md").read_text(encoding="utf-8")
    return textwrap.dedent(text.split("```python\n", 1)[1].split("```", 1)[0])


def test_readme_snippet_against_the_iris_onnx_example(start_server_module: Any) -> None:
    example: Server = start_server_module(REPO / "examples" / "iris-onnx", "--no-access-log")
    example.wait_ready()
    code = readme_snippet().replace("localhost:8888", example.url.removeprefix("http://"))
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/v2.md", "exec"), namespace)  # noqa: S102 - our own docs
    assert namespace["result"].as_numpy("label").tolist() == [0]
    # The native route of the same API still runs its hooks.
    native = httpx.post(
        f"{example.url}/iris",
        json={"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2},
    )
    assert native.json() == "setosa"


# ------------------------------------------------------------------------------------------------
# protocols: in modelserve.yaml


@pytest.mark.parametrize("protocols", [["native"], ["v2"]])
def test_protocols_turn_routes_off(tmp_path: Path, protocols: list[str]) -> None:
    from starlette.testclient import TestClient

    import modelserve

    yaml = f"protocols: {json.dumps(protocols)}\napis:\n  - name: echo\n    handler: {{path: model.py, class: Echo}}\n"
    root = write_project(tmp_path, {"modelserve.yaml": yaml, "model.py": CLASSES})
    app = modelserve.create_app(root)
    with TestClient(app) as http:
        http.portal.call(app.server.wait_loaded)  # the lifespan starts loading; it does not wait for it
        assert http.get("/readyz").status_code == 200
        v2 = http.post(
            "/v2/models/echo/infer", json={"inputs": [{"name": "x", "datatype": "INT8", "shape": [1], "data": [3]}]}
        )
        native = http.post("/echo", json={"x": 1})
        assert (v2.status_code == 200) == ("v2" in protocols)
        assert (native.status_code == 200) == ("native" in protocols)


def test_a_cortex_handler_gets_the_tensors_as_its_payload(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    import modelserve

    handler = """
    import numpy as np


    class Handler:
        def __init__(self, config):
            pass

        def handle_post(self, payload):
            return {"doubled": np.asarray(payload["x"]) * 2}
    """
    cortex = "- name: double\n  kind: RealtimeAPI\n  handler: {type: python, path: handler.py}\n"
    root = write_project(tmp_path, {"cortex.yaml": cortex, "handler.py": handler})
    app = modelserve.create_app(root)
    with TestClient(app) as http:
        http.portal.call(app.server.wait_loaded)
        tensor = {"name": "x", "datatype": "FP32", "shape": [2], "data": [1, 2]}
        answer = http.post("/v2/models/double/infer", json={"inputs": [tensor]}).json()
        assert answer["outputs"] == [{"name": "doubled", "datatype": "FP32", "shape": [2], "data": [2.0, 4.0]}]
        assert http.get("/v2/models/double").json()["platform"] == "python"


def test_an_api_named_v2_is_refused() -> None:
    import modelserve

    with pytest.raises(modelserve.ConfigError, match="'v2' is reserved"):
        modelserve.create_app(handler=type("Model", (), {"predict": lambda self, x: x}), name="v2")


# ------------------------------------------------------------------------------------------------
# the codec alone


def test_binary_inputs_are_views_on_the_body() -> None:
    values = np.arange(6, dtype="<f4")
    header = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3], "parameters": {"binary_data_size": 24}}]}
    ).encode()
    body = header + values.tobytes()
    request = decode_request(body, len(header), None, False)
    x = request.inputs["x"]
    assert x.tolist() == values.reshape(2, 3).tolist()
    assert not x.flags.writeable and np.shares_memory(x, np.frombuffer(body, np.uint8))


def test_bytes_elements_are_length_prefixed() -> None:
    data = b"".join(len(s).to_bytes(4, "little") + s for s in (b"ab", b"", b"\xff"))
    header = json.dumps(
        {"inputs": [{"name": "s", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": len(data)}}]}
    ).encode()
    request = decode_request(header + data, len(header), None, False)
    assert request.inputs["s"].tolist() == [b"ab", b"", b"\xff"]
    body, length = encode_response("m", InferRequest(None, request.inputs, {"s": True}, False), request.inputs)
    assert length is not None and body[length:] == data
    with pytest.raises(BadRequest, match="not UTF-8"):
        encode_response("m", InferRequest(None, request.inputs, {"s": False}, False), request.inputs)


# ------------------------------------------------------------------------------------------------
# Signature.fast_request: the usual JSON request in one pass, the same value as decode_request and check


def _fast_signature() -> Any:
    from modelserve.v2 import TensorMeta
    from modelserve.v2_signature import Signature

    inputs = (TensorMeta("x", "FP32", (-1, 4)), TensorMeta("w", "FP64", (2,)), TensorMeta("any", "FP32", None))
    return Signature("onnx_onnxv1", inputs, (TensorMeta("y", "FP32", (-1, 3)),), text=True)


def _tensor(name: str, datatype: str, shape: Any, data: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


USUAL = [
    _tensor("x", "FP32", [2, 4], [[1, 2, 3, 4], [5.5, 6, 7, 8]]),
    _tensor("w", "FP64", [2], [0.25, -1e100]),
    _tensor("any", "FP32", [1, 1, 2], [1, 2]),
]


def test_fast_request_gives_what_decode_request_and_check_give() -> None:
    signature = _fast_signature()
    for inputs in (USUAL, list(reversed(USUAL))):
        body = json.dumps({"inputs": inputs}).encode()
        fast = signature.fast_request(body)
        slow = decode_request(body, None, signature.raw_input, signature.text)
        signature.check(slow)
        assert fast is not None
        assert (fast.id, fast.outputs, fast.binary_output) == (slow.id, slow.outputs, slow.binary_output)
        assert fast.inputs.parameters == slow.inputs.parameters == {}
        assert list(fast.inputs) == list(slow.inputs)
        for name, array in slow.inputs.items():
            assert fast.inputs[name].dtype == array.dtype and fast.inputs[name].shape == array.shape
            np.testing.assert_array_equal(fast.inputs[name], array)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.update(id="1"),  # anything beside inputs
        lambda d: d.update(parameters={"binary_data_output": True}),
        lambda d: d["inputs"].pop(),  # a missing input
        lambda d: d["inputs"].append(_tensor("x", "FP32", [1, 4], [1, 2, 3, 4])),  # twice
        lambda d: d["inputs"][0].update(name="z"),  # unknown
        lambda d: d["inputs"][0].update(datatype="FP64"),  # not the model's datatype
        lambda d: d["inputs"][0].update(shape=[8]),  # wrong rank
        lambda d: d["inputs"][0].update(shape=[4, 2]),  # wrong fixed dimension
        lambda d: d["inputs"][0].update(shape=[2, -4]),
        lambda d: d["inputs"][0].update(shape=[3, 4]),  # data too short
        lambda d: d["inputs"][0].update(data=[[1, 2, 3, None], [5, 6, 7, 8]]),  # a null
        lambda d: d["inputs"][0].update(data="1234"),
        lambda d: d["inputs"][0].pop("data"),
        lambda d: d["inputs"][0].update(parameters={}),
        lambda d: d.update(inputs={}),
    ],
)
def test_fast_request_leaves_anything_else_to_decode_request(change: Any) -> None:
    document = json.loads(json.dumps({"inputs": USUAL}))
    change(document)
    assert _fast_signature().fast_request(json.dumps(document).encode()) is None


def test_fast_request_is_off_for_models_with_other_datatypes() -> None:
    from modelserve.v2 import TensorMeta
    from modelserve.v2_signature import Signature

    signature = Signature("onnx_onnxv1", (TensorMeta("x", "INT64", (1,)),), None)
    body = b'{"inputs": [{"name": "x", "datatype": "INT64", "shape": [1], "data": [1]}]}'
    assert signature.fast_request(body) is None
