"""A ModelStreamInfer request's ``error_message`` is cut as a unary call's status details are
(`modelserve.grpc.servicer.details`, `MAX_DETAILS` characters), keeping a 500's request id whole.

User code raises an HTTPException whose detail has 20,000 characters: ModelInfer's details were cut to 512, the
same refusal in a stream was sent whole."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import write_project
from tests.grpc.test_grpc import served

grpc = pytest.importorskip("grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
service_pb2_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")

#: How long the detail user code raises is, and the most a message of it may be (the servicer's 512).
DETAIL = 20_000
MOST = 512

PROJECT = {
    "modelserve.yaml": "apis:\n  - name: wordy\n    handler: {path: model.py}\n",
    "model.py": """
from starlette.exceptions import HTTPException


class Model:
    def predict(self, inputs):
        status = int(inputs["status"][0])
        raise HTTPException(status, detail="w" * 20_000)
""",
}


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    root = write_project(Path(tmp_path_factory.mktemp("wordy")), PROJECT)
    with served(root) as (_, address), grpc.insecure_channel(address) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def request(status: int, request_id: str) -> object:
    tensor = service_pb2.ModelInferRequest.InferInputTensor(
        name="status", datatype="INT32", shape=[1], contents=service_pb2.InferTensorContents(int_contents=[status])
    )
    return service_pb2.ModelInferRequest(model_name="wordy", id=request_id, inputs=[tensor])


@pytest.mark.parametrize("status", [422, 500])
def test_a_stream_s_error_message_is_cut_as_a_status_s_details_are(stub: object, status: int) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(request(status, "unary-0001"), timeout=30)  # type: ignore[attr-defined]
    unary = caught.value.details()
    [answer] = stub.ModelStreamInfer(iter([request(status, "stream-001")]), timeout=30)  # type: ignore[attr-defined]
    streamed = answer.error_message
    assert streamed.startswith("w" * 100) and unary.startswith("w" * 100)
    assert len(streamed) <= MOST and len(unary) <= MOST
    assert streamed == unary.replace("unary-0001", "stream-001")  # one helper: the same message
    if status == 500:  # the id the message tells the caller to look for in the log, kept whole
        assert streamed.endswith("... (request id stream-001)")
