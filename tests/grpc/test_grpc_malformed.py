"""Malformed input over gRPC against a real server: every refusal is a status of the client's fault
(INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED) whose message names what was wrong, never UNKNOWN or
INTERNAL, and nothing the client got wrong leaves a traceback in the server's log. Bytes that are not a message
at all are sent through a generic channel method with no serializer."""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.conftest import Failures, write_project
from tests.grpc.test_grpc import grpc_served

grpc = pytest.importorskip("grpc")
hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")

from modelserve.grpc._proto import grpc_service_pb2 as pb  # noqa: E402 - after the skips

PROJECT = """
apis:
  - name: f
    handler: {path: model.py, class: Floats}
  - name: s
    handler: {path: model.py, class: Strings}
  - name: any
    handler: {path: model.py, class: Echo}
"""

MODEL = """
import numpy as np


class Floats:
    v2_inputs = [{"name": "x", "datatype": "FP32", "shape": [-1]}]

    def predict(self, inputs):
        return {"y": inputs["x"] * 2}


class Strings:
    v2_inputs = [{"name": "t", "datatype": "BYTES", "shape": [-1]}]

    def predict(self, inputs):
        return {"n": np.array([len(value) for value in inputs["t"]], dtype=np.int64)}


class Echo:
    def predict(self, inputs):
        return dict(inputs.items())
"""

SERVICE = "/inference.GRPCInferenceService/"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Failures]]:
    root = write_project(tmp_path_factory.mktemp("grpc_malformed"), {"modelserve.yaml": PROJECT, "model.py": MODEL})
    failures = Failures()
    logging.getLogger().addHandler(failures)
    try:
        with grpc_served(root) as address:
            channel = grpc.insecure_channel(address)
            yield channel, failures
            channel.close()
    finally:
        logging.getLogger().removeHandler(failures)


@pytest.fixture
def channel(served: tuple[Any, Failures]) -> Iterator[Any]:
    channel, failures = served
    before = len(failures.lines)
    yield channel
    assert failures.lines[before:] == []


def call(channel: Any, method: str, message: Any) -> Any:
    out = getattr(pb, type(message).__name__.replace("Request", "Response"))
    stub = channel.unary_unary(SERVICE + method, request_serializer=type(message).SerializeToString,
                               response_deserializer=out.FromString)  # fmt: skip
    return stub(message, timeout=30)


def refusal(channel: Any, method: str, message: Any) -> tuple[str, str]:
    with pytest.raises(grpc.RpcError) as caught:
        call(channel, method, message)
    return caught.value.code().name, caught.value.details()


def raw_call(channel: Any, method: str, data: bytes) -> Any:
    return channel.unary_unary(SERVICE + method)(data, timeout=30)


def tensor(name: str, datatype: str, shape: list[int], **more: Any) -> Any:
    return pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape, **more)


X = np.arange(3, dtype=np.float32).tobytes()


def infer(model: str = "f", *tensors: Any, raw: list[bytes] | None = None, **more: Any) -> Any:
    inputs = list(tensors) or [tensor("x", "FP32", [3])]
    return pb.ModelInferRequest(model_name=model, inputs=inputs, raw_input_contents=[X] if raw is None else raw, **more)


def contents(**values: Any) -> Any:
    return pb.InferTensorContents(**values)


CASES = {
    "no inputs": (pb.ModelInferRequest(model_name="f"), "INVALID_ARGUMENT", "no inputs"),
    "raw contents for two inputs": (infer(raw=[X, X]), "INVALID_ARGUMENT", "raw_input_contents holds 2"),
    "raw contents too short": (infer(raw=[X[:5]]), "INVALID_ARGUMENT", "'x'"),
    "a negative dimension": (infer("f", tensor("x", "FP32", [-3])), "INVALID_ARGUMENT", "'x'"),
    "dimensions past 2**63": (infer("f", tensor("x", "FP32", [2**62, 2**62])), "INVALID_ARGUMENT", "'x'"),
    "an empty tensor of 2**124 nominal elements": (
        infer("any", tensor("x", "FP32", [0, 2**62, 2**62]), raw=[b""]),
        "INVALID_ARGUMENT",
        "'x'",
    ),
    "rank 100": (infer("any", tensor("x", "FP32", [1] * 100), raw=[X[:4]]), "INVALID_ARGUMENT", "100 dimensions"),
    "an unknown datatype": (infer("f", tensor("x", "FP99", [3])), "INVALID_ARGUMENT", "FP99"),
    "the model's other datatype": (infer("f", tensor("x", "INT32", [3])), "INVALID_ARGUMENT", "INT32"),
    "a BOOL byte of 2": (infer("any", tensor("b", "BOOL", [2]), raw=[b"\x02\x01"]), "INVALID_ARGUMENT", "'b'"),
    "a BYTES length past the data": (
        infer("s", tensor("t", "BYTES", [1]), raw=[struct.pack("<I", 1000) + b"ab"]),
        "INVALID_ARGUMENT",
        "'t'",
    ),
    "a BYTES length cut short": (infer("s", tensor("t", "BYTES", [1]), raw=[b"\x01\x00"]), "INVALID_ARGUMENT", "'t'"),
    "more BYTES elements than the shape": (
        infer("s", tensor("t", "BYTES", [1]), raw=[struct.pack("<I", 1) + b"a" + struct.pack("<I", 1) + b"b"]),
        "INVALID_ARGUMENT",
        "'t'",
    ),
    "a billion BYTES elements in 0 bytes": (
        infer("s", tensor("t", "BYTES", [10**9]), raw=[b""]),
        "INVALID_ARGUMENT",
        "'t'",
    ),
    "contents of the wrong kind": (
        infer("f", tensor("x", "FP32", [3], contents=contents(int_contents=[1, 2, 3])), raw=[]),
        "INVALID_ARGUMENT",
        "fp32_contents",
    ),
    "INT8 contents out of range": (
        infer("any", tensor("i", "INT8", [1], contents=contents(int_contents=[1000])), raw=[]),
        "INVALID_ARGUMENT",
        "'i'",
    ),
    "BF16 contents": (
        infer("any", tensor("h", "BF16", [1], contents=contents(fp32_contents=[1])), raw=[]),
        "INVALID_ARGUMENT",
        "'h'",
    ),
    "contents and raw contents": (
        infer("f", tensor("x", "FP32", [3], contents=contents(fp32_contents=[1, 2, 3]))),
        "INVALID_ARGUMENT",
        "'x'",
    ),
    "an input without a name": (infer("f", tensor("", "FP32", [3])), "INVALID_ARGUMENT", "input 0"),
    "an input given twice": (
        infer("any", tensor("x", "FP32", [3]), tensor("x", "FP32", [3]), raw=[X, X]),
        "INVALID_ARGUMENT",
        "'x'",
    ),
    "an input the model lacks": (infer("f", tensor("z", "FP32", [3])), "INVALID_ARGUMENT", "'z'"),
    "an output the model lacks": (
        infer(outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name="zz")]),
        "INVALID_ARGUMENT",
        "'zz'",
    ),
    "an unknown model": (infer("nope"), "NOT_FOUND", "'nope'"),
    "an unknown version": (infer(model_version="٣"), "NOT_FOUND", "'f'"),
    # a name echoed whole would not fit the status's trailer: the client saw RESOURCE_EXHAUSTED instead
    "a model name of 200,000 characters": (infer("n" * 200_000), "NOT_FOUND", "'nnnn"),
    "a version of 200,000 digits": (infer(model_version="9" * 200_000), "NOT_FOUND", "'f'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_malformed_inference_is_refused_naming_its_input(channel: Any, case: str) -> None:
    message, code, named = CASES[case]
    got, details = refusal(channel, "ModelInfer", message)
    assert (got, named in details) == (code, True), details
    assert len(details) <= 600


@pytest.mark.parametrize(
    "data",
    [b"\xff\xff\xff\xff", infer().SerializeToString()[:-3], b"\x0a\x02\xff\xfe", b"\x0a" + b"\xff" * 9 + b"\x01"],
    ids=["garbage", "cut short", "a name not UTF-8", "a length past 2**64"],
)
def test_bytes_that_are_not_a_message_are_invalid_argument(channel: Any, data: bytes) -> None:
    """gRPC itself answered UNKNOWN and logged the protobuf error's traceback."""
    with pytest.raises(grpc.RpcError) as caught:
        raw_call(channel, "ModelInfer", data)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ModelInferRequest" in caught.value.details()
    with pytest.raises(grpc.RpcError) as caught:
        raw_call(channel, "ModelReady", data)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ModelReadyRequest" in caught.value.details()


def test_a_stream_answers_bad_messages_with_errors_and_goes_on(channel: Any) -> None:
    """Good messages, bad ones and bytes that are no message in one ModelStreamInfer: one answer each, in order."""
    sent = [
        infer(id="1"),
        infer(raw=[X[:5]]),
        infer("nope"),
        infer("f", tensor("x", "FP32", [2**62, 2**62])),
        None,  # bytes that are not a message
        infer(id="2"),
    ]
    stream = channel.stream_stream(
        SERVICE + "ModelStreamInfer", response_deserializer=pb.ModelStreamInferResponse.FromString
    )
    data = [b"\xff\xff" if message is None else message.SerializeToString() for message in sent]
    answers = list(stream(iter(data), timeout=30))
    assert [answer.error_message == "" for answer in answers] == [True, False, False, False, False, True]
    assert [answers[0].infer_response.id, answers[-1].infer_response.id] == ["1", "2"]
    assert ["'x'" in answers[1].error_message, "'nope'" in answers[2].error_message] == [True, True]
    assert "ModelInferRequest" in answers[4].error_message


def test_a_stream_that_ends_early_leaves_the_server_serving(channel: Any) -> None:
    """The client cancels a stream whose requests are still coming; the next call is answered."""
    stream = channel.stream_stream(
        SERVICE + "ModelStreamInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelStreamInferResponse.FromString,
    )

    def requests() -> Iterator[Any]:
        yield infer(id="only")
        while True:
            yield infer(raw=[X[:5]])

    answers = stream(requests(), timeout=30)
    assert next(answers).infer_response.id == "only"
    answers.cancel()
    assert call(channel, "ModelInfer", infer(id="after")).id == "after"


def test_parameters_of_every_type_are_taken(channel: Any) -> None:
    kinds: dict[str, dict[str, Any]] = {"b": {"bool_param": True}, "i": {"int64_param": -5}, "s": {"string_param": "x"}}
    kinds |= {"d": {"double_param": float("nan")}, "u": {"uint64_param": 2**64 - 1}, "none": {}}
    given = {key: pb.InferParameter(**value) for key, value in kinds.items()}
    message = infer("f", tensor("x", "FP32", [3], parameters=given), parameters=given, id="a\nb\x00\u2028é")
    assert list(call(channel, "ModelInfer", message).outputs[0].shape) == [3]


GOOD = infer("any", tensor("x", "FP32", [3]), id="good").SerializeToString()


@hypothesis.settings(max_examples=60, deadline=None, derandomize=True, database=None)
@hypothesis.given(
    edits=st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.integers(0, len(GOOD)),
)
def test_mutated_bytes_are_answered_or_refused_as_the_client_s_fault(
    served: tuple[Any, Failures], edits: list[tuple[int, int]], cut: int
) -> None:
    """A valid message's bytes with a few bytes changed and its tail cut: an answer, or a refusal of the
    client's input, and no traceback in the server's log."""
    channel, failures = served
    before = len(failures.lines)
    data = bytearray(GOOD)
    for at, value in edits:
        data[at] = value
    try:
        raw_call(channel, "ModelInfer", bytes(data[:cut]))
    except grpc.RpcError as error:
        assert error.code().name in {"INVALID_ARGUMENT", "NOT_FOUND"}, error.details()
    assert failures.lines[before:] == []


DATATYPES = ["FP32", "INT8", "UINT64", "BOOL", "BYTES", "FP16", "BF16", "FP99", ""]
DIMS = st.integers(-2, 4) | st.sampled_from([2**31, 2**62, 2**63 - 1])
TENSORS = st.builds(
    lambda name, datatype, shape, values: tensor(name, datatype, shape, contents=contents(**values)),
    st.sampled_from(["x", "t", "b", ""]),
    st.sampled_from(DATATYPES),
    st.lists(DIMS, max_size=4),
    st.sampled_from([{}, {"fp32_contents": [1.0, 2.0]}, {"int_contents": [300]}, {"bytes_contents": [b"\xff", b"a"]}]),
)
REQUESTS = st.builds(
    lambda model, tensors, raw, version: pb.ModelInferRequest(
        model_name=model, model_version=version, inputs=tensors, raw_input_contents=raw
    ),
    st.sampled_from(["f", "s", "any", "nope"]),
    st.lists(TENSORS, max_size=3),
    st.lists(st.binary(max_size=16), max_size=3),
    st.sampled_from(["", "1", "2", "x"]),
)


@hypothesis.settings(max_examples=60, deadline=None, derandomize=True, database=None)
@hypothesis.given(message=REQUESTS)
def test_any_message_of_odd_fields_is_answered_or_refused(served: tuple[Any, Failures], message: Any) -> None:
    """ModelInferRequests built of odd names, datatypes, shapes, contents and raw contents: an answer, or a
    refusal of the client's input, and no traceback in the server's log."""
    channel, failures = served
    before = len(failures.lines)
    try:
        call(channel, "ModelInfer", message)
    except grpc.RpcError as error:
        assert error.code().name in {"INVALID_ARGUMENT", "NOT_FOUND"}, error.details()
    assert failures.lines[before:] == []
