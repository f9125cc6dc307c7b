"""The Open Inference Protocol over gRPC, through Triton's own client (tritonclient.grpc), its raw stub and the
standard health client, against a real server: uvicorn in a thread of the test's process with the gRPC
server attached to its model server (`modelserve.grpc.attach`), as ``--grpc-port`` does."""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import free_port, serve_in_thread, write_project
from tests.http.test_triton_examples import simple_onnx

grpc = pytest.importorskip("grpc")
grpcclient = pytest.importorskip("tritonclient.grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
health_pb2_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

PROJECT = """
auth:
  api_keys_env: GRPC_TEST_KEYS
  apis: [guarded]
apis:
  - name: simple
    model: {path: simple.onnx}
    max_body_size: 4096
  - name: slow
    handler: {path: model.py, class: Slow}
  - name: guarded
    handler: {path: model.py, class: Slow}
"""

MODEL = """
import asyncio

import numpy as np


class Slow:
    v2_inputs = [{"name": "x", "datatype": "FP32", "shape": [-1]}]

    async def predict(self, inputs):
        if inputs.parameters.get("sleep"):
            await asyncio.sleep(inputs.parameters["sleep"])
        return {"y": inputs["x"] * 2}
"""


@contextlib.contextmanager
def grpc_served(root: Path) -> Iterator[str]:
    """A real uvicorn server on a free port with the gRPC server attached; yields the gRPC address."""
    with served(root) as (_, address):
        yield address


@contextlib.contextmanager
def served(root: Path, load: list[str] | None = None) -> Iterator[tuple[str, str]]:
    """A real uvicorn server with the gRPC server attached, with model control explicit when `load` is given
    (the APIs it names load at start); yields (HTTP URL, gRPC address) once the server is ready."""
    import uvicorn

    import modelserve
    from modelserve.grpc import attach

    app = modelserve.create_app(str(root))
    if load is not None:
        app.server.repository.explicit(load)
    port, http_port = free_port(), free_port()
    attach(app.server, "127.0.0.1", port)
    config = uvicorn.Config(app, host="127.0.0.1", port=http_port, log_level="warning", lifespan="on")
    with serve_in_thread(config):
        address = f"127.0.0.1:{port}"
        client = grpcclient.InferenceServerClient(address)
        deadline = time.monotonic() + 60
        while not _ready(client):
            assert time.monotonic() < deadline, "the gRPC server was not ready"
            time.sleep(0.05)
        client.close()
        yield f"http://127.0.0.1:{http_port}", address


def _ready(client: Any) -> bool:
    try:
        return bool(client.is_server_ready())
    except InferenceServerException:
        return False


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = write_project(tmp_path_factory.mktemp("grpc"), {"modelserve.yaml": PROJECT, "model.py": MODEL})
    simple_onnx(root / "simple.onnx")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRPC_TEST_KEYS", "secret-key")
        with grpc_served(root) as served:
            yield served


@pytest.fixture
def client(address: str) -> Iterator[Any]:
    triton = grpcclient.InferenceServerClient(address)
    yield triton
    triton.close()


KEY = {"authorization": "Bearer secret-key"}


def simple_inputs(a: np.ndarray, b: np.ndarray) -> list[Any]:
    inputs = [
        grpcclient.InferInput("INPUT0", list(a.shape), "INT32"),
        grpcclient.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def raw_call(address: str, method: str, request: Any, response: Any, **kwargs: Any) -> Any:
    """One call through a bare channel with tritonclient's messages (no client library logic between)."""
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            f"/inference.GRPCInferenceService/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response.FromString,
        )
        return call(request, **kwargs)


# ------------------------------------------------------------------------------------------------
# health and metadata


def test_health_and_metadata(client: Any) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("simple") and client.is_model_ready("simple", "1")
    assert not client.is_model_ready("simple", "2") and not client.is_model_ready("nothing", headers=KEY)
    with pytest.raises(InferenceServerException):  # keys are on: what is not one API's needs one, as over HTTP
        client.get_server_metadata()
    metadata = client.get_server_metadata(headers=KEY)
    assert metadata.name == "modelserve" and "statistics" in metadata.extensions
    model = client.get_model_metadata("simple", as_json=True)
    assert model["platform"] == "onnx_onnxv1" and model["versions"] == ["1"]
    assert [(t["name"], t["datatype"], t["shape"]) for t in model["inputs"]] == [
        ("INPUT0", "INT32", ["-1", "16"]),
        ("INPUT1", "INT32", ["-1", "16"]),
    ]
    config = client.get_model_config("simple").config
    assert config.name == "simple" and [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert list(config.output[0].dims) == [-1, 16]


def test_the_standard_health_service(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService", "simple"):
            answer = stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as error:
            stub.Check(health_pb2.HealthCheckRequest(service="nothing"), metadata=list(KEY.items()))
        assert error.value.code() == grpc.StatusCode.NOT_FOUND


# ------------------------------------------------------------------------------------------------
# inference


def test_infer_with_raw_contents(client: Any) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), np.int32)
    result = client.infer("simple", simple_inputs(a, b), request_id="abc")
    assert result.as_numpy("OUTPUT0").tolist() == (a + b).tolist()
    assert result.as_numpy("OUTPUT1").tolist() == (a - b).tolist()
    response = result.get_response()
    assert response.model_name == "simple" and response.model_version == "1" and response.id == "abc"
    only = client.infer("simple", simple_inputs(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert only.as_numpy("OUTPUT0") is None and only.as_numpy("OUTPUT1").tolist() == (a - b).tolist()


def test_infer_with_typed_contents(address: str) -> None:
    request = service_pb2.ModelInferRequest(model_name="simple")
    for name, values in (("INPUT0", range(16)), ("INPUT1", [2] * 16)):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend(values)
    response = raw_call(address, "ModelInfer", request, service_pb2.ModelInferResponse)
    names = [output.name for output in response.outputs]
    total = np.frombuffer(response.raw_output_contents[names.index("OUTPUT0")], np.int32)
    assert total.tolist() == [i + 2 for i in range(16)]


def test_stream_infer_answers_each_request(client: Any) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)), headers=KEY)
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    for shift in range(3):
        client.async_stream_infer("simple", simple_inputs(a, np.full((1, 16), shift, np.int32)))
    client.async_stream_infer("nothing", simple_inputs(a, a))
    got = [answers.get(timeout=30) for _ in range(4)]
    client.stop_stream()
    assert [result.as_numpy("OUTPUT0")[0, 0] for result, _ in got[:3]] == [0, 1, 2]
    assert got[3][0] is None and "Request for unknown model: 'nothing' is not found" in str(got[3][1])


# ------------------------------------------------------------------------------------------------
# refusals: a status naming what was wrong, never UNKNOWN or INTERNAL


def _typed(name: str, datatype: str, shape: list[int], values: list[int]) -> Any:
    request = service_pb2.ModelInferRequest(model_name=name)
    for input_name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=input_name, datatype=datatype, shape=shape)
        tensor.contents.int_contents.extend(values)
    return request


def _raw(name: str, version: str, sizes: tuple[int, int]) -> Any:
    request = service_pb2.ModelInferRequest(model_name=name, model_version=version)
    for input_name, size in zip(("INPUT0", "INPUT1"), sizes, strict=True):
        request.inputs.add(name=input_name, datatype="INT32", shape=[1, 16])
        request.raw_input_contents.append(bytes(size))
    return request


REFUSED = {
    "wrong datatype": (_typed("simple", "INT64", [1, 16], [1] * 16), "INVALID_ARGUMENT", "input 'INPUT0'"),
    "unknown datatype": (_typed("simple", "INT33", [1, 16], [1] * 16), "INVALID_ARGUMENT", "input 'INPUT0'"),
    "wrong shape": (_typed("simple", "INT32", [1, 8], [1] * 8), "INVALID_ARGUMENT", "input 'INPUT0'"),
    "contents not fitting the shape": (_typed("simple", "INT32", [1, 16], [1] * 3), "INVALID_ARGUMENT", "INPUT0"),
    "negative dimension": (_typed("simple", "INT32", [1, -16], []), "INVALID_ARGUMENT", "input 'INPUT0'"),
    "raw content length": (_raw("simple", "", (64, 60)), "INVALID_ARGUMENT", "input 'INPUT1'"),
    "unknown model": (_raw("nothing", "", (64, 64)), "NOT_FOUND", "Request for unknown model: 'nothing'"),
    "unknown version": (_raw("simple", "7", (64, 64)), "NOT_FOUND", "'simple' version 7"),
    "oversized message": (_raw("simple", "", (64, 8192)), "RESOURCE_EXHAUSTED", ""),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_bad_input_gets_a_status_naming_it(address: str, case: str) -> None:
    request, code, words = REFUSED[case]
    with pytest.raises(grpc.RpcError) as error:  # with a key: a model name that is no model's needs one
        raw_call(address, "ModelInfer", request, service_pb2.ModelInferResponse, metadata=list(KEY.items()))
    assert error.value.code().name == code, error.value.details()
    assert words in (error.value.details() or "")


def test_the_size_limit_counts_the_message_s_own_bytes(address: str) -> None:
    """`simple`'s max_body_size is 4096: a message of exactly that many bytes is read (and refused for its
    second input's length, which is not 64 bytes), one of a byte more is refused for its size."""
    grown = next(size for size in range(3900, 4096) if _raw("simple", "", (64, size)).ByteSize() == 4096)
    at_limit, over = _raw("simple", "", (64, grown)), _raw("simple", "", (64, grown + 1))
    assert over.ByteSize() == 4097
    codes = []
    for request in (at_limit, over):
        with pytest.raises(grpc.RpcError) as error:
            raw_call(address, "ModelInfer", request, service_pb2.ModelInferResponse)
        codes.append((error.value.code().name, "INPUT1" in (error.value.details() or "")))
    assert codes == [("INVALID_ARGUMENT", True), ("RESOURCE_EXHAUSTED", False)]


# ------------------------------------------------------------------------------------------------
# statistics, keys, deadlines


def test_statistics_count_grpc_calls(client: Any) -> None:
    before = client.get_inference_statistics("simple", as_json=True)["model_stats"][0]
    a = np.zeros((1, 16), np.int32)
    client.infer("simple", simple_inputs(a, a))
    with pytest.raises(InferenceServerException):
        client.infer("simple", simple_inputs(a.astype(np.int32), np.zeros((1, 8), np.int32)))
    after = client.get_inference_statistics("simple", as_json=True)["model_stats"][0]
    assert int(after["inference_count"]) == int(before.get("inference_count", 0)) + 1
    fails = int(after["inference_stats"]["fail"].get("count", 0)) - int(
        before["inference_stats"]["fail"].get("count", 0)
    )
    assert fails == 1


def x_input(values: list[float]) -> list[Any]:
    x = grpcclient.InferInput("x", [len(values)], "FP32")
    x.set_data_from_numpy(np.asarray(values, np.float32))
    return [x]


def test_api_keys_travel_as_authorization_metadata(client: Any) -> None:
    with pytest.raises(InferenceServerException) as error:
        client.infer("guarded", x_input([1.0]))
    assert error.value.status() == "StatusCode.UNAUTHENTICATED"
    with pytest.raises(InferenceServerException) as error:
        client.infer("guarded", x_input([1.0]), headers={"authorization": "Bearer wrong"})
    assert error.value.status() == "StatusCode.UNAUTHENTICATED"
    answer = client.infer("guarded", x_input([1.0]), headers=KEY)
    assert answer.as_numpy("y").tolist() == [2.0]
    assert client.infer("slow", x_input([1.0])).as_numpy("y").tolist() == [2.0]  # an API the keys do not guard
    assert client.is_server_live()  # the probes never need a key


def test_a_passed_deadline_cancels_the_call(client: Any) -> None:
    """The API runs one call at a time: the call after an expired one is answered, so the first let go of its
    slot when its deadline passed rather than sleeping on."""
    with pytest.raises(InferenceServerException) as error:
        client.infer("slow", x_input([1.0]), parameters={"sleep": 600}, client_timeout=0.5)
    assert error.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert client.infer("slow", x_input([3.0]), client_timeout=60).as_numpy("y").tolist() == [6.0]


def test_a_cancelled_call_lets_go_of_its_slot(client: Any) -> None:
    """The client cancels a call that would sleep for ten minutes: the API (one call at a time) answers the next."""
    answers: queue.Queue[Any] = queue.Queue()
    call = client.async_infer(
        "slow", x_input([1.0]), callback=lambda result, error: answers.put(error), parameters={"sleep": 600}
    )
    time.sleep(0.2)  # let it reach the model: a call cancelled before it runs proves nothing
    call.cancel()
    assert "CANCELLED" in str(answers.get(timeout=30))
    assert client.infer("slow", x_input([2.0]), client_timeout=60).as_numpy("y").tolist() == [4.0]


def test_with_keys_on_every_api_a_call_without_one_learns_no_model_name(tmp_path: Path) -> None:
    """Keys on every API: a call without a key is UNAUTHENTICATED whether its model exists or not (over HTTP, an
    unknown path is a 401 too); with the key, the unknown model is NOT_FOUND."""
    project = """
auth: {api_keys_env: GRPC_TEST_ALL_KEYS}
apis:
  - {name: doubled, handler: {path: model.py, class: Slow}}
"""
    root = write_project(tmp_path, {"modelserve.yaml": project, "model.py": MODEL})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRPC_TEST_ALL_KEYS", "all-key")
        with grpc_served(root) as address:
            triton = grpcclient.InferenceServerClient(address)
            try:
                for name in ("doubled", "nothing"):
                    with pytest.raises(InferenceServerException) as error:
                        triton.infer(name, x_input([1.0]))
                    assert error.value.status() == "StatusCode.UNAUTHENTICATED", name
                    with pytest.raises(InferenceServerException) as error:
                        triton.get_model_metadata(name)
                    assert error.value.status() == "StatusCode.UNAUTHENTICATED", name
                with pytest.raises(InferenceServerException) as error:
                    triton.infer("nothing", x_input([1.0]), headers={"authorization": "Bearer all-key"})
                assert error.value.status() == "StatusCode.NOT_FOUND"
                answer = triton.infer("doubled", x_input([2.0]), headers={"authorization": "Bearer all-key"})
                assert answer.as_numpy("y").tolist() == [4.0]
            finally:
                triton.close()
