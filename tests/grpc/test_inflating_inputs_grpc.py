"""ModelInfer requests that the server could inflate, through ``modelserve --grpc-port``: each is INVALID_ARGUMENT
naming what was wrong, decided before the work or the allocation the message asks for, and its details quote the
client's names short. The server's memory is read from ``/proc/<pid>/status`` (tests/http/test_inflating_inputs.py
has the same measure for the HTTP routes)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pytest

from modelserve.v2 import MAX_NAME
from tests.conftest import Server, free_port, write_project
from tests.http.test_inflating_inputs import MiB, memory, reset_peak

grpc = pytest.importorskip("grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
service_pb2_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")

PROJECT = {
    "modelserve.yaml": "apis:\n  - {name: echo, handler: {path: classes.py, class: Echo}}\n",
    "classes.py": """
        class Echo:
            def predict(self, inputs):
                return dict(inputs)
    """,
}

Tensor = service_pb2.ModelInferRequest.InferInputTensor


@pytest.fixture(scope="module")
def served(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Any]]:
    root = write_project(tmp_path_factory.mktemp("inflating-grpc"), PROJECT)
    port = free_port()
    server: Server = start_server_module(root, "--grpc-port", str(port), "--no-access-log")
    server.wait_ready(timeout=90)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=30)
    yield server, service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def refusal(stub: Any, request: Any) -> Any:
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request, timeout=60)
    return refused.value


def element(text: bytes) -> bytes:
    return struct.pack("<I", len(text)) + text


def test_raw_bytes_beyond_the_shape_are_refused_before_they_become_objects(served: tuple[Server, Any]) -> None:
    """A shape of [1] over ~10 MB of two-byte elements in raw_input_contents: the decoder made all 1.6 million of
    them (about 120 MiB more than the server held) before it said there were too many; it stops at the second."""
    server, stub = served
    raw = element(b"ab") * 1_600_000
    request = service_pb2.ModelInferRequest(
        model_name="echo", inputs=[Tensor(name="x", datatype="BYTES", shape=[1])], raw_input_contents=[raw]
    )
    reset_peak(server)
    before = memory(server)["VmRSS"]
    refused = refusal(stub, request)
    assert memory(server)["VmHWM"] - before < 80 * MiB  # the message, as gRPC and protobuf read it: ~40 MiB
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details() == "input 'x': its shape has 1 elements, but the BYTES data holds more"


def test_raw_bytes_too_short_for_their_shape_are_refused(served: tuple[Server, Any]) -> None:
    _, stub = served
    request = service_pb2.ModelInferRequest(
        model_name="echo", inputs=[Tensor(name="x", datatype="BYTES", shape=[3])], raw_input_contents=[b"\0" * 8]
    )
    refused = refusal(stub, request)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details() == "input 'x': its shape has 3 elements, but 8 bytes of BYTES data hold at most 2"


def contents(value: float) -> Any:
    return service_pb2.InferTensorContents(fp32_contents=[value])


@pytest.mark.parametrize(
    ("request_of", "what"),
    [
        (lambda name: {"inputs": [Tensor(name=name, datatype="FP32", shape=[1], contents=contents(1.0))]}, "an input"),
        (
            lambda name: {
                "inputs": [Tensor(name="x", datatype="FP32", shape=[1], contents=contents(1.0))],
                "outputs": [service_pb2.ModelInferRequest.InferRequestedOutputTensor(name=name)],
            },
            "a requested output",
        ),
    ],
)
def test_a_tensor_name_of_megabytes_is_refused_naming_it_short(
    served: tuple[Server, Any], request_of: Any, what: str
) -> None:
    """An input of 3 MB's name was answered, its output named the same (past the 4 MiB a client takes by default,
    with a larger name), and a refusal on ModelStreamInfer, whose error_message is not cut as a status's details
    are, quoted the name whole: 3 MB."""
    _, stub = served
    request = service_pb2.ModelInferRequest(model_name="echo", **request_of("n" * 3_000_000))
    expected = f"{what}'s name has 3000000 characters, more than {MAX_NAME}: 'nnn"
    refused = refusal(stub, request)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details().startswith(expected)
    [answer] = stub.ModelStreamInfer(iter([request]), timeout=60)
    assert answer.error_message.startswith(expected)
    assert len(answer.error_message) < 1000
