"""ModelInfer's fast path (`modelserve.grpc.codec.RawPlan`) and its edges: the usual request (raw contents of
exactly the model's inputs) is decoded in one pass, and every other request goes through the general
`decode_infer` and the signature's check, which answer it or name what is wrong. Through a real server and a
bare gRPC channel, and, without a server, the plan compared with the general path that is its reference."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.conftest import write_project
from tests.grpc.test_grpc import grpc_served, raw_call
from tests.http.test_triton_examples import simple_onnx

grpc = pytest.importorskip("grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")

PROJECT = """
apis:
  - name: simple
    model: {path: simple.onnx}
  - name: pairs
    handler: {path: model.py, class: Pairs}
  - name: ids
    handler: {path: model.py, class: Ids}
"""

MODEL = """
import numpy as np

import modelserve


class Ids:
    v2_inputs = [{"name": "x", "datatype": "FP32", "shape": [-1]}]

    def predict(self, inputs):
        return {"id": np.array([modelserve.current_request_id()], dtype=object)}


class Pairs:
    v2_inputs = [{"name": "x", "datatype": "FP64", "shape": [-1, 2]}]

    def predict(self, inputs):
        return {"y": inputs["x"] * inputs.parameters.get("scale", 2)}
"""

A = np.arange(32, dtype=np.int32).reshape(2, 16)
B = np.full((2, 16), 5, np.int32)


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = write_project(tmp_path_factory.mktemp("fast"), {"modelserve.yaml": PROJECT, "model.py": MODEL})
    simple_onnx(root / "simple.onnx")
    with grpc_served(root) as served:
        yield served


def request_of(*tensors: tuple[str, str, list[int], bytes], model: str = "simple", **fields: Any) -> Any:
    """A ModelInferRequest of raw contents: (name, datatype, shape, data) per input."""
    request = service_pb2.ModelInferRequest(model_name=model, **fields)
    for name, datatype, shape, data in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(data)
    return request


def simple(a: np.ndarray = A, b: np.ndarray = B, **fields: Any) -> Any:
    return request_of(
        ("INPUT0", "INT32", list(a.shape), a.tobytes()), ("INPUT1", "INT32", list(b.shape), b.tobytes()), **fields
    )


def outputs_of(response: Any) -> dict[str, np.ndarray]:
    return {
        output.name: np.frombuffer(raw, np.int32 if output.datatype == "INT32" else np.float64).reshape(
            list(output.shape)
        )
        for output, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    }


def infer(address: str, request: Any) -> dict[str, np.ndarray]:
    return outputs_of(raw_call(address, "ModelInfer", request, service_pb2.ModelInferResponse))


def refusal(address: str, request: Any) -> tuple[str, str]:
    with pytest.raises(grpc.RpcError) as error:
        raw_call(address, "ModelInfer", request, service_pb2.ModelInferResponse)
    return error.value.code().name, error.value.details() or ""


# ------------------------------------------------------------------------------------------------
# answered: by the plan, or by the general path where the plan steps aside


def reversed_inputs() -> Any:
    return request_of(("INPUT1", "INT32", [2, 16], B.tobytes()), ("INPUT0", "INT32", [2, 16], A.tobytes()))


def with_parameters() -> Any:
    request = simple()
    request.parameters["priority"].int64_param = 1
    return request


def with_an_unknown_field() -> Any:
    request = simple()
    request.MergeFromString(bytes((15 << 3, 1)))  # field 15 (none in the protocol), the varint 1
    return request


ANSWERED = {
    "the usual request": simple,
    "an id": lambda: simple(id="abc"),
    "a field the protocol does not have": with_an_unknown_field,
    "inputs in another order": reversed_inputs,
    "request parameters": with_parameters,
    "one row": lambda: simple(A[:1], B[:1]),
}


@pytest.mark.parametrize("case", list(ANSWERED))
def test_requests_are_answered_by_either_path(address: str, case: str) -> None:
    request = ANSWERED[case]()
    tensors = zip(request.inputs, request.raw_input_contents, strict=True)
    given = {tensor.name: np.frombuffer(raw, np.int32) for tensor, raw in tensors}
    outputs = infer(address, request)
    assert outputs["OUTPUT0"].ravel().tolist() == (given["INPUT0"] + given["INPUT1"]).tolist()
    assert outputs["OUTPUT1"].ravel().tolist() == (given["INPUT0"] - given["INPUT1"]).tolist()


def test_requested_outputs_take_the_general_path(address: str) -> None:
    request = simple(id="named")
    request.outputs.add(name="OUTPUT1")
    response = raw_call(address, "ModelInfer", request, service_pb2.ModelInferResponse)
    assert response.id == "named" and [output.name for output in response.outputs] == ["OUTPUT1"]
    assert outputs_of(response)["OUTPUT1"].tolist() == (A - B).tolist()


def test_an_empty_batch_takes_the_general_path(address: str) -> None:
    empty = np.zeros((0, 16), np.int32)
    outputs = infer(address, simple(empty, empty))
    assert outputs["OUTPUT0"].shape == (0, 16)


def test_a_model_class_with_declared_inputs_and_its_parameters(address: str) -> None:
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    plain = request_of(("x", "FP64", [2, 2], x.tobytes()), model="pairs")
    assert infer(address, plain)["y"].tolist() == (x * 2).tolist()
    scaled = request_of(("x", "FP64", [2, 2], x.tobytes()), model="pairs")
    scaled.parameters["scale"].int64_param = 3
    assert infer(address, scaled)["y"].tolist() == (x * 3).tolist()


@pytest.mark.parametrize(
    ("given", "metadata", "expected"),
    [("from-request", (), "from-request"), ("", (("x-request-id", "from-metadata"),), "from-metadata")]
    + [("from-request", (("x-request-id", "from-metadata"),), "from-request"), ("", (), None)],
)
def test_the_request_id_comes_from_the_request_then_the_metadata(
    address: str, given: str, metadata: tuple[tuple[str, str], ...], expected: str | None
) -> None:
    request = request_of(("x", "FP32", [1], bytes(4)), model="ids", id=given)
    response = raw_call(address, "ModelInfer", request, service_pb2.ModelInferResponse, metadata=metadata)
    raw = response.raw_output_contents[0]
    seen = raw[4 : 4 + int.from_bytes(raw[:4], "little")].decode()
    if expected is None:
        assert re.fullmatch("[0-9a-f]{32}", seen), seen  # a new one
    else:
        assert seen == expected


# ------------------------------------------------------------------------------------------------
# refused: every edge the plan does not take is named by the general path


def with_contents_too() -> Any:
    request = simple()
    request.inputs[0].contents.int_contents.extend([1] * 32)
    return request


def int_bytes(count: int) -> bytes:
    return bytes(4 * count)


REFUSED = {
    "an input given twice": (
        request_of(("INPUT0", "INT32", [1, 16], int_bytes(16)), ("INPUT0", "INT32", [1, 16], int_bytes(16))),
        "input 'INPUT0' is given twice",
    ),
    "an unknown input": (
        request_of(("INPUT0", "INT32", [1, 16], int_bytes(16)), ("INPUT9", "INT32", [1, 16], int_bytes(16))),
        "unknown input 'INPUT9'",
    ),
    "a missing input": (request_of(("INPUT0", "INT32", [1, 16], int_bytes(16))), "missing input 'INPUT1'"),
    "another datatype": (
        request_of(("INPUT0", "INT64", [1, 16], bytes(128)), ("INPUT1", "INT32", [1, 16], int_bytes(16))),
        "input 'INPUT0': datatype INT64",
    ),
    "another fixed dimension": (
        request_of(("INPUT0", "INT32", [2, 8], int_bytes(16)), ("INPUT1", "INT32", [1, 16], int_bytes(16))),
        "input 'INPUT0': shape [2, 8]",
    ),
    "another rank": (
        request_of(("INPUT0", "INT32", [16], int_bytes(16)), ("INPUT1", "INT32", [1, 16], int_bytes(16))),
        "input 'INPUT0': shape [16]",
    ),
    "a negative dimension": (
        request_of(("INPUT0", "INT32", [-1, 16], int_bytes(16)), ("INPUT1", "INT32", [1, 16], int_bytes(16))),
        "input 'INPUT0'",
    ),
    "data one element short": (
        request_of(("INPUT0", "INT32", [1, 16], int_bytes(16)), ("INPUT1", "INT32", [1, 16], int_bytes(15))),
        "input 'INPUT1'",
    ),
    "contents beside raw contents": (with_contents_too(), "input 'INPUT0' has both"),
    "raw contents for one input of two": (
        request_of(("INPUT0", "INT32", [1, 16], int_bytes(16)), ("INPUT1", "INT32", [1, 16], int_bytes(16))),
        "raw_input_contents holds 1 entries for 2 inputs",
    ),
}
# The last case: raw contents for the first input only (the second's data left out).
del REFUSED["raw contents for one input of two"][0].raw_input_contents[1]


@pytest.mark.parametrize("case", list(REFUSED))
def test_requests_off_the_plan_are_refused_naming_the_input(address: str, case: str) -> None:
    request, words = REFUSED[case]
    code, details = refusal(address, request)
    assert code == "INVALID_ARGUMENT", details
    assert words in details


# ------------------------------------------------------------------------------------------------
# the plan against its reference, without a server


def test_the_plan_decodes_as_the_general_path_does() -> None:
    from modelserve.errors import BadRequest
    from modelserve.grpc.codec import RawPlan, decode_infer
    from modelserve.v2 import TensorMeta
    from modelserve.v2_signature import Signature

    signature = Signature(
        "onnx_onnxv1",
        (TensorMeta("INPUT0", "INT32", (-1, 16)), TensorMeta("INPUT1", "INT32", (-1, 16))),
        (TensorMeta("OUTPUT0", "INT32", (-1, 16)),),
        text=True,
    )
    plan = RawPlan.of(signature)
    assert plan is not None
    taken = 0
    requests = [ANSWERED[case]() for case in ANSWERED] + [request for request, _ in REFUSED.values()]
    # Twice: the second time the tensors' descriptions are those the plan has seen (`RawPlan.seen`). The model's
    # name of 1 to 4 bytes moves the raw contents in the message: views where they are aligned, else copies.
    for index, request in enumerate(requests * 2):
        request.model_name = "s" * (1 + index % 4)
        fast = plan.decode(request.SerializeToString())
        try:
            general = decode_infer(request, signature.text, request.ByteSize())
            signature.check(general)
        except BadRequest:
            assert fast is None  # the plan never answers what the general path refuses
            continue
        if fast is None:
            continue
        taken += 1
        assert (fast.id, fast.outputs, fast.binary_output) == (general.id, general.outputs, general.binary_output)
        assert fast.inputs.keys() == general.inputs.keys() and fast.inputs.parameters == general.inputs.parameters
        for name, array in fast.inputs.items():
            reference = general.inputs[name]
            assert (array.dtype, array.shape, array.flags.writeable) == (reference.dtype, reference.shape, False)
            assert array.flags.aligned
            assert array.tolist() == reference.tolist()
    assert taken == 8  # the usual request, another order, one row, an id; twice each
    assert plan.seen  # the descriptions were kept


@pytest.mark.parametrize(
    ("inputs", "planned"),
    [
        ((("x", "FP32", (-1, 4)),), True),
        ((("x", "FP16", None), ("y", "UINT8", (2,))), True),
        ((("x", "BYTES", (-1,)),), False),  # strings: decoded by the general path only
        ((("x", "BOOL", (-1,)),), False),
        ((("x", "BF16", (-1,)),), False),
    ],
)
def test_plans_are_made_only_for_viewable_inputs(inputs: Any, planned: bool) -> None:
    from modelserve.grpc.codec import RawPlan
    from modelserve.v2 import TensorMeta
    from modelserve.v2_signature import Signature

    signature = Signature("python", tuple(TensorMeta(*tensor) for tensor in inputs), None)
    assert (RawPlan.of(signature) is not None) == planned
    assert RawPlan.of(Signature("python", None, None)) is None


ANSWERS: dict[str, dict[str, np.ndarray]] = {
    "one FP32 row": {"probabilities": np.array([[0.1, 0.2, 0.7]], np.float32)},
    "two outputs, longer than 127 bytes": {"a": np.arange(64, dtype=np.int64).reshape(8, 8), "b": np.ones(3, np.uint8)},
    "a scalar and an empty batch": {"s": np.array(2.5), "e": np.zeros((0, 16), np.int16)},
    "a transposed view": {"t": np.arange(6, dtype=np.float16).reshape(2, 3).T},
    "big-endian: the message": {"x": np.arange(3, dtype=">i4")},
    "a BYTES output: the message": {"x": np.array([b"ab"], dtype=object)},
}


@pytest.mark.parametrize("case", list(ANSWERS))
@pytest.mark.parametrize(("request_id", "wanted"), [(None, None), ("r-1", None), ("r-2", "first")])
def test_the_written_answer_is_the_message_s_bytes(case: str, request_id: str | None, wanted: str | None) -> None:
    from modelserve.grpc.codec import RawAnswer, encode_infer
    from modelserve.grpc.server import written
    from modelserve.v2 import InferRequest, V2Inputs

    outputs = ANSWERS[case]
    names: dict[str, bool | None] | None = None if wanted is None else {next(iter(outputs)): None}
    request = InferRequest(request_id, V2Inputs(), names, True)
    writer = RawAnswer("m" * 200, "12")  # a name whose length takes a varint of two bytes
    written_bytes = writer.encode(request, outputs)
    reference = encode_infer("m" * 200, "12", request, outputs)
    serialize = written(type(reference).SerializeToString)
    if case.endswith("the message"):
        assert written_bytes is None  # encode_infer answers it
        return
    assert written_bytes == reference.SerializeToString() == serialize(written_bytes) == serialize(reference)
    assert writer.encode(request, outputs) == written_bytes  # the descriptions kept from the first call


def test_new_request_ids_are_distinct_uuid4_hex() -> None:
    import uuid

    from modelserve.grpc.servicer import _counted_ids

    new = _counted_ids()
    ids = [new() for _ in range(1000)] + [_counted_ids()() for _ in range(10)]
    assert len(set(ids)) == len(ids)
    for given in ids:
        assert re.fullmatch("[0-9a-f]{32}", given) and uuid.UUID(hex=given).version == 4, given
        assert uuid.UUID(hex=given).variant == uuid.RFC_4122
