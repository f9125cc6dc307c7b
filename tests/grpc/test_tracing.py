"""OpenTelemetry spans of gRPC calls (`modelserve.grpc.tracing`) through a real ``modelserve --grpc-port`` with
tracing on, exported by the real OTLP/HTTP exporter to the tests' own receiver (`tests.tracing.receiver`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.conftest import free_port, write_project

grpc = pytest.importorskip("grpc")
pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.proto")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")

from tests.tracing.receiver import Receiver, Span, children, client_span, env  # noqa: E402 - after the skips

MODEL = """
import numpy as np
from opentelemetry import trace


class Stages:
    v2_inputs = [{"name": "x", "datatype": "FP32", "shape": [-1]}]

    def preprocess(self, inputs):
        if inputs.parameters.get("fail"):
            raise ValueError("no good")
        return inputs

    def predict(self, inputs):
        context = trace.get_current_span().get_span_context()
        return {"y": inputs["x"] * 2, "span": np.array([format(context.span_id, "016x")], dtype=object)}

    def postprocess(self, result):
        return result
"""

PROJECT = """
apis:
  - name: stages
    handler: {path: model.py, class: Stages}
"""
SERVICE = "inference.GRPCInferenceService"


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any, receiver: Receiver) -> str:
    root = write_project(tmp_path_factory.mktemp("grpc_traced"), {"modelserve.yaml": PROJECT, "model.py": MODEL})
    port = free_port()
    server = start_server_module(root, "--grpc-port", str(port), "--no-access-log", env=env(receiver))
    server.wait_ready()
    return f"127.0.0.1:{port}"


def request(model: str = "stages", **parameters: Any) -> Any:
    message = service_pb2.ModelInferRequest(model_name=model, id="traced-grpc")
    message.inputs.add(name="x", datatype="FP32", shape=[2])
    message.raw_input_contents.append(np.array([1, 2], np.float32).tobytes())
    for key, value in parameters.items():
        message.parameters[key].bool_param = value
    return message


def call(address: str, method: str, message: Any, metadata: list[tuple[str, str]]) -> Any:
    with grpc.insecure_channel(address) as channel:
        if method == "ModelStreamInfer":
            stream = channel.stream_stream(
                f"/{SERVICE}/{method}",
                request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
            )
            return list(stream(iter(message), metadata=metadata))
        unary = channel.unary_unary(
            f"/{SERVICE}/{method}",
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        return unary(message, metadata=metadata)


def rpc_span(receiver: Receiver, trace_id: str, method: str) -> Span:
    return receiver.wait_for(
        lambda spans: next((s for s in spans if s.trace_id == trace_id and s.name == f"{SERVICE}/{method}"), None)
    )


def test_a_call_continues_the_callers_trace_with_the_children_of_a_request(address: str, receiver: Receiver) -> None:
    headers, trace_id, parent_id = client_span()
    answer = call(address, "ModelInfer", request(), list(headers.items()))
    assert np.frombuffer(answer.raw_output_contents[0], np.float32).tolist() == [2.0, 4.0]
    span = rpc_span(receiver, trace_id, "ModelInfer")
    assert span.parent_id == parent_id
    assert span.kind == 2  # SERVER
    attributes = span.attributes
    rpc = (attributes["rpc.system"], attributes["rpc.service"], attributes["rpc.method"])
    assert rpc == ("grpc", SERVICE, "ModelInfer")
    assert attributes["rpc.grpc.status_code"] == 0
    assert attributes["modelserve.request_id"] == "traced-grpc" and attributes["modelserve.api"] == "stages"
    assert attributes["network.peer.address"] == "127.0.0.1" and attributes["server.port"] == int(address.split(":")[1])
    assert span.status == 0
    # user code ran with the server span current
    assert answer.raw_output_contents[1][4:].decode() == span.span_id

    def tree(spans: list[Span]) -> Any:
        names = {s.name for s in children(spans, span)}
        wanted = {"modelserve.stage.preprocess", "modelserve.stage.predict", "modelserve.stage.postprocess"}
        return names if wanted <= names else None

    receiver.wait_for(tree)
    below = {s.name: s for s in children(receiver.trace(trace_id), span)}
    assert below["modelserve.stage.preprocess"].end <= below["modelserve.stage.predict"].start
    assert span.start <= below["modelserve.stage.preprocess"].start
    assert below["modelserve.stage.postprocess"].end <= span.end
    # the wait for a slot and the answer's encoding are attributes of the span, as over HTTP
    assert 0 <= attributes["modelserve.encode.duration"] < (span.end - span.start) / 1e9
    assert attributes.get("modelserve.queue.duration", 0) >= 0  # a call that waited for nothing has none


@pytest.mark.parametrize(
    ("model", "parameters", "code", "error"),
    [("nothing", {}, grpc.StatusCode.NOT_FOUND, False), ("stages", {"fail": True}, grpc.StatusCode.INTERNAL, True)],
)
def test_the_status_follows_the_grpc_code(
    address: str, receiver: Receiver, model: str, parameters: dict[str, Any], code: Any, error: bool
) -> None:
    headers, trace_id, _ = client_span()
    with pytest.raises(grpc.RpcError) as raised:
        call(address, "ModelInfer", request(model, **parameters), list(headers.items()))
    assert raised.value.code() == code
    span = rpc_span(receiver, trace_id, "ModelInfer")
    assert span.attributes["rpc.grpc.status_code"] == code.value[0]
    # OpenTelemetry's RPC conventions: a server's span is an error for its own failures, not the caller's
    assert span.status == (2 if error else 0)
    if error:
        assert span.status_message.startswith("INTERNAL: ")
        (event,) = [attributes for name, attributes in span.events if name == "exception"]
        assert (event["exception.type"], event["modelserve.stage"]) == ("ValueError", "preprocess")


def test_a_stream_is_one_span_with_the_children_of_each_request(address: str, receiver: Receiver) -> None:
    headers, trace_id, parent_id = client_span()
    answers = call(address, "ModelStreamInfer", [request(), request()], list(headers.items()))
    assert [answer.error_message for answer in answers] == ["", ""]
    span = rpc_span(receiver, trace_id, "ModelStreamInfer")
    assert span.parent_id == parent_id and span.attributes["rpc.grpc.status_code"] == 0

    def predicted(spans: list[Span]) -> Any:
        found = [s for s in children(spans, span) if s.name == "modelserve.stage.predict"]
        return found if len(found) == 2 else None

    receiver.wait_for(predicted)
    assert span.attributes["modelserve.encode.duration"] >= 0


def test_a_probe_makes_no_span(address: str, receiver: Receiver) -> None:
    headers, trace_id, _ = client_span()
    with grpc.insecure_channel(address) as channel:
        live = channel.unary_unary(
            f"/{SERVICE}/ServerLive",
            request_serializer=service_pb2.ServerLiveRequest.SerializeToString,
            response_deserializer=service_pb2.ServerLiveResponse.FromString,
        )
        assert live(service_pb2.ServerLiveRequest(), metadata=list(headers.items())).live
    # a traced call after it: once its span is in, the probe's would have been exported with it or before
    call(address, "ModelInfer", request(), [])
    receiver.wait_for(lambda spans: any(s.name == f"{SERVICE}/ModelInfer" and s.parent_id == "" for s in spans))
    assert receiver.trace(trace_id) == []


def test_without_the_private_seam_a_warning_and_no_children(monkeypatch: pytest.MonkeyPatch, caplog: Any) -> None:
    from modelserve import tracing
    from modelserve.grpc.tracing import _seam

    assert _seam() == (tracing._traced, tracing._Traced)
    monkeypatch.setattr(tracing, "_Traced", type("_Traced", (), {"__slots__": ("span",)}))
    with caplog.at_level("WARNING", logger="modelserve"):
        assert _seam() is None
    assert "gRPC calls get their server spans without their stage spans" in caplog.text
