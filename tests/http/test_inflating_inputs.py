"""Inputs that a server could inflate, through a real server: each is a 4xx naming what was wrong, decided before
the work or the allocation the input asks for, and its answer quotes the client's values short.

One server holds a Model class that declares nothing (``echo``: every datatype and shape reaches the decoder), one
that declares an FP64 input (``f64``: its JSON requests take the fast path of `Signature.fast_request`), a typed
one (``counts``: ``dict[str, int]``) and a Truss (``binary``: Truss's msgpack bodies). The server's memory is read
from ``/proc/<pid>/status``: its peak (VmHWM, reset before each request through ``clear_refs``) against what it
held before the request.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from modelserve.schema import MAX_ERRORS
from modelserve.v2 import MAX_NAME
from tests.conftest import Server, write_project
from tests.models import iris_onnx

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: echo
            handler: {path: classes.py, class: Echo}
          - name: f64
            handler: {path: classes.py, class: Doubles}
          - name: counts
            handler: {path: classes.py, class: Counts}
          - name: binary
            truss: config.yaml
          - name: text
            handler: {path: classes.py, class: Text}
          - name: iris
            model: {path: iris.onnx}
          - name: tree
            handler: {path: classes.py, class: Trees}
    """,
    "classes.py": """
        import numpy as np
        import pydantic


        class Echo:
            def predict(self, inputs):
                return dict(inputs)


        class Doubles:
            v2_inputs = [{"name": "x", "datatype": "FP64", "shape": [-1]}]

            def predict(self, inputs):
                x = inputs["x"]
                return {"finite": np.array([bool(np.isfinite(x).all())])}


        class Counts:
            def predict(self, counts: dict[str, int]) -> int:
                return sum(counts.values())


        class Text:
            def predict(self, text):
                return len(text)


        class Tree(pydantic.BaseModel):
            children: list["Tree"] = []


        class Trees:
            def predict(self, tree: Tree) -> int:
                return len(tree.children)
    """,
    "config.yaml": "model_name: binary",
    "model/model.py": """
        class Model:
            def predict(self, inputs):
                return {"keys": sorted(str(key) for key in inputs)}
    """,
}


@pytest.fixture(scope="module")
def server(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Server:
    root = write_project(tmp_path_factory.mktemp("inflating"), PROJECT)
    iris_onnx(root / "iris.onnx")
    started: Server = start_server_module(root, "--no-access-log")
    started.wait_ready(timeout=90)
    return started


def memory(server: Server) -> dict[str, int]:
    """The server's VmRSS and VmHWM, in bytes."""
    lines = Path(f"/proc/{server.process.pid}/status").read_text().splitlines()
    return {line.split(":")[0]: int(line.split()[1]) * 1024 for line in lines if line.startswith(("VmRSS", "VmHWM"))}


def reset_peak(server: Server) -> None:
    """The server's VmHWM starts again from its current size (Linux's clear_refs)."""
    Path(f"/proc/{server.process.pid}/clear_refs").write_text("5")


def post_growth(server: Server, path: str, body: bytes, headers: dict[str, str]) -> tuple[httpx.Response, int]:
    """The answer to a POST, and how far the server's memory rose above what it held before it, in bytes."""
    reset_peak(server)
    before = memory(server)["VmRSS"]
    answer = httpx.post(server.url + path, content=body, headers=headers, timeout=60)
    return answer, memory(server)["VmHWM"] - before


MiB = 1024 * 1024


def binary_body(shape: list[int], data: bytes, name: str = "x") -> tuple[bytes, dict[str, str]]:
    tensor = {"name": name, "datatype": "BYTES", "shape": shape, "parameters": {"binary_data_size": len(data)}}
    header = orjson.dumps({"inputs": [tensor]})
    return header + data, {"Inference-Header-Content-Length": str(len(header))}


def element(text: bytes) -> bytes:
    return struct.pack("<I", len(text)) + text


# ------------------------------------------------------------------------------------------------------------
# V2 binary BYTES: the elements are read no further than the shape's count


def test_bytes_beyond_the_shape_are_refused_before_they_become_objects(server: Server) -> None:
    """A shape of [1] over ~10 MB of two-byte elements: the decoder made all 1.6 million of them (about 90 MiB
    more than the server held) before the 400 said there were too many; it stops at the second now."""
    body, headers = binary_body([1], element(b"ab") * 1_600_000)
    answer, growth = post_growth(server, "/v2/models/echo/infer", body, headers)
    assert growth < 50 * MiB, growth  # the body itself, and its copies on the way in: ~10-20 MiB
    assert answer.status_code == 400
    assert answer.json()["error"] == "input 'x': its shape has 1 elements, but the BYTES data holds more"


@pytest.mark.parametrize(
    ("shape", "data", "fragment"),
    [
        ([3], element(b"ab") * 2, "its shape has 3 elements, but the BYTES data holds 2"),
        ([3], b"\0" * 11, "its shape has 3 elements, but 11 bytes of BYTES data hold at most 2"),
        ([0], element(b""), "its shape has 0 elements, but the BYTES data holds more"),
        ([1], element(b"ab")[:-1], "a BYTES element of 2 bytes runs past binary_data_size"),
    ],
)
def test_bytes_that_do_not_fill_their_shape_are_a_400_naming_the_input(
    server: Server, shape: list[int], data: bytes, fragment: str
) -> None:
    body, headers = binary_body(shape, data)
    answer = httpx.post(server.url + "/v2/models/echo/infer", content=body, headers=headers)
    assert answer.status_code == 400
    assert answer.json()["error"] == f"input 'x': {fragment}"


def test_bytes_that_fill_their_shape_are_answered(server: Server) -> None:
    body, headers = binary_body([2, 2], b"".join(element(text) for text in (b"a", b"", b"bc", b"d" * 300)))
    answer = httpx.post(server.url + "/v2/models/echo/infer", content=body, headers=headers)
    assert answer.status_code == 200
    [output] = answer.json()["outputs"]
    assert (output["shape"], output["data"]) == ([2, 2], ["a", "", "bc", "d" * 300])


# ------------------------------------------------------------------------------------------------------------
# V2 JSON FP64: null, "nan" and "inf" are refused by the fast path as by the general one


@pytest.mark.parametrize("value", [None, "nan", "inf", "-Infinity", "1e999"])
def test_a_float64_input_refuses_what_is_not_a_finite_number(server: Server, value: Any) -> None:
    """numpy reads a null as NaN and these strings as NaN or infinity; the general decoder refuses them (JSON has
    no NaN), but a request of the model's own FP64 input took the fast path, which checked FP32 data only: the
    model was called with a NaN."""
    tensor = {"name": "x", "datatype": "FP64", "shape": [2], "data": [1.5, value]}
    answer = httpx.post(server.url + "/v2/models/f64/infer", json={"inputs": [tensor]})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "input 'x': 'data' holds a null or a number out of the range of FP64"
    tensor["data"] = [1.5, 1e300]  # finite, though its square is not
    assert httpx.post(server.url + "/v2/models/f64/infer", json={"inputs": [tensor]}).json()["outputs"] == [
        {"name": "finite", "datatype": "BOOL", "shape": [1], "data": [True]}
    ]


# ------------------------------------------------------------------------------------------------------------
# Names the client chose, quoted short


@pytest.mark.parametrize(
    ("api", "body", "what"),
    [
        ("echo", {"inputs": [{"name": "n" * 4_000_000, "datatype": "FP32", "shape": [2], "data": [1.0]}]}, "an input"),
        ("f64", {"inputs": [{"name": "n" * 4_000_000, "datatype": "FP64", "shape": [1], "data": [1.0]}]}, "an input"),
        (
            "echo",
            {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}],
                "outputs": [{"name": "n" * 4_000_000}],
            },
            "a requested output",
        ),
    ],
)
def test_a_tensor_name_of_megabytes_is_a_short_400(server: Server, api: str, body: Any, what: str) -> None:
    """Every 400 about a tensor quotes its name: a name of 4 MB (a wrong shape, a name the model does not have, an
    output it did not return) made an answer of 4 MB."""
    answer = httpx.post(server.url + f"/v2/models/{api}/infer", json=body, timeout=60)
    assert answer.status_code == 400
    assert answer.json()["error"].startswith(f"{what}'s name has 4000000 characters, more than {MAX_NAME}: 'nnn")
    assert len(answer.content) < 1000


def test_a_name_of_the_longest_length_is_served(server: Server) -> None:
    name = "n" * MAX_NAME
    tensor = {"name": name, "datatype": "FP32", "shape": [1], "data": [1.0]}
    answer = httpx.post(server.url + "/v2/models/echo/infer", json={"inputs": [tensor], "outputs": [{"name": name}]})
    assert answer.status_code == 200
    assert [output["name"] for output in answer.json()["outputs"]] == [name]


X = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}


@pytest.mark.parametrize(
    ("api", "body", "error"),
    [
        (
            "echo",
            {"inputs": [X], "outputs": [{"name": f"o{index}"} for index in range(100_000)]},
            "unknown output 'o0', 'o1', 'o2', 'o3', 'o4', 'o5', 'o6', 'o7', 'o8', 'o9' and 99,990 more; "
            "the model returned 'x'",
        ),
        (
            "f64",
            {"inputs": [{**X, "name": f"i{index}"} for index in range(50_000)]},
            "unknown input 'i0'; unknown input 'i1'; unknown input 'i2'; unknown input 'i3'; unknown input 'i4'; "
            "unknown input 'i5'; unknown input 'i6'; unknown input 'i7'; unknown input 'i8'; unknown input 'i9'; "
            "49,990 more unknown inputs; missing input 'x'; the model's inputs are 'x' (FP64 [-1])",
        ),
    ],
)
def test_a_400_lists_ten_of_the_tensors_a_request_names_and_counts_the_rest(
    server: Server, api: str, body: Any, error: str
) -> None:
    """Each unknown output, and each unknown input of a model that declares its inputs, was named: a body of
    1.5 MB (100,000 requested outputs) answered a 400 of 1.5 MB."""
    answer = httpx.post(server.url + f"/v2/models/{api}/infer", json=body, timeout=60)
    assert answer.status_code == 400
    assert answer.json()["error"] == error


def test_a_model_file_s_400_names_ten_of_the_unknown_keys_short(server: Server) -> None:
    """A model file's own route takes an object of its inputs by name: each unknown key was named whole."""
    body = {"k" * 1_000_000: 1, **{f"k{index}": 1 for index in range(50_000)}}
    answer = httpx.post(server.url + "/iris", json=body, timeout=60)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error.startswith(f"missing input 'input'; unknown input '{'k' * 77}...', 'k0', 'k1', ")
    assert "'k8' and 49,991 more; the model's inputs are 'input' (float32 [batch, 4])" in error
    assert len(answer.content) < 1000


def test_the_keys_of_a_typed_body_are_quoted_short(server: Server) -> None:
    """A ``dict[str, int]`` body whose keys are 400 KB each and whose values are not integers: the 400 named each
    failing key whole, twice (its error and its detail), an answer of 16 MB to a body of 8 MB."""
    body = {f"k{index}" + "x" * 400_000: "not a number" for index in range(MAX_ERRORS + 5)}
    answer = httpx.post(server.url + "/counts", json=body, timeout=60)
    assert answer.status_code == 400
    error = answer.json()
    assert error["error_count"] == MAX_ERRORS + 5
    assert [issue["loc"][0][:3] for issue in error["detail"][:2]] == ["k0x", "k1x"]
    assert all(issue["msg"] == "Input should be a valid integer" for issue in error["detail"])
    assert len(answer.content) < 64 * 1024
    assert httpx.post(server.url + "/counts", json={"a" * 300: 2, "b": 3}).json() == 5


def test_a_large_body_refused_in_too_many_places_to_list_says_how_many(server: Server) -> None:
    """A model's own validator (a nested, recursive one) does not stop at its first error: past 256 of them in a
    large body they are counted, not built, and the 400 said "the inputs do not match Tree:  (and 1,500 more:
    1,500 fields fail)", naming nothing before its "more"."""
    body = {"children": [{"children": [1] * 50} for _ in range(30)]}
    answer = httpx.post(server.url + "/tree", json=body)
    assert answer.status_code == 400
    error = answer.json()
    assert error["error"] == "the inputs do not match Tree: 1,500 fields fail, too many in this large body to list them"
    assert (error["detail"], error["error_count"]) == ([], 1500)
    assert httpx.post(server.url + "/tree", json={"children": [{"children": [{}] * 50}] * 30}).json() == 30


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ({b"nd": True, b"type": "x" * 4_000_000, b"kind": b"", b"shape": [0], b"data": b""}, "data type"),
        ({b"__dt_datetime_iso__": True, b"data": "x" * 4_000_000}, "isoformat"),
    ],
)
def test_a_truss_binary_body_s_400_quotes_its_value_short(server: Server, value: Any, fragment: str) -> None:
    """numpy's and datetime's messages quote the value: a dtype or a date of 4 MB made a 400 of 4 MB."""
    msgpack = pytest.importorskip("msgpack")
    answer = httpx.post(
        server.url + "/v1/models/binary:predict",
        content=msgpack.packb({"value": value}),
        headers={"content-type": "application/octet-stream"},
        timeout=60,
    )
    assert answer.status_code == 400
    assert answer.json()["error"].startswith("the body is not Truss's msgpack")
    assert fragment in answer.json()["error"]
    assert len(answer.content) < 1000


# ------------------------------------------------------------------------------------------------------------
# text/plain: a charset whose decoder's time grows with the square of the body


@pytest.mark.parametrize("charset", ["punycode", "PunyCode"])
def test_a_punycode_body_is_refused_before_it_is_decoded(server: Server, charset: str) -> None:
    """punycode is a text codec to Python, for host names; its decoder took 0.8 s of CPU for these 200 KB, 27 s
    for 1 MB, and would take most of an hour for a body of 10 MB, in a worker thread that nothing stops."""
    body = ("\u00e9" * 200_000).encode("punycode")
    answer = httpx.post(
        server.url + "/text", content=body, headers={"content-type": f"text/plain; charset={charset}"}, timeout=60
    )
    assert answer.status_code == 400
    assert answer.json()["error"] == (
        f"charset {charset!r} in the Content-Type header is not a charset for a request body"
    )
    for other in ("utf-8", "latin-1", "utf-16"):
        text = "\u00e9t\u00e9" if other != "utf-16" else "\u4e00"
        headers = {"content-type": f"text/plain; charset={other}"}
        assert httpx.post(server.url + "/text", content=text.encode(other), headers=headers).json() == len(text)


hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")

#: What a JSON float tensor's items may be: numbers of either width, null, and strings numpy reads as numbers.
ITEMS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-(2**63), 2**63 - 1),
    st.none(),
    st.sampled_from(["1.5", "nan", "NaN", "inf", "-inf", "Infinity", "1e39", "1e999", "x"]),
)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(datatype=st.sampled_from(["FP32", "FP64"]), data=st.lists(ITEMS, min_size=1, max_size=6))
def test_the_fast_path_takes_no_request_the_decoder_refuses(datatype: str, data: list[Any]) -> None:
    """`Signature.fast_request` answers the same request as `decode_request` and `Signature.check`, or leaves it to
    them: a request it takes, they take, with the same arrays."""
    import numpy as np

    from modelserve.errors import BadRequest
    from modelserve.v2 import TensorMeta, decode_request
    from modelserve.v2_signature import Signature

    signature = Signature("python", (TensorMeta("x", datatype, (-1,)),), None)
    body = orjson.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": [len(data)], "data": data}]})
    fast = signature.fast_request(body)
    try:
        general = decode_request(body, None, signature.raw_input, signature.text)
        signature.check(general)
    except BadRequest:
        assert fast is None
        return
    if fast is not None:
        assert np.array_equal(fast.inputs["x"], general.inputs["x"])
        assert fast.inputs["x"].dtype == general.inputs["x"].dtype


@pytest.mark.parametrize("dtype", ["|S0", "<U0", "S"])
def test_a_truss_binary_array_of_items_without_bytes_is_refused(server: Server, dtype: str) -> None:
    """The bytes of an array bound its shape (each item takes its dtype's size), except for items of no bytes: a
    body of 60 bytes was an array of 2**40 empty strings, handed to the model."""
    msgpack = pytest.importorskip("msgpack")
    array = {b"nd": True, b"type": dtype, b"kind": b"", b"shape": [2**40], b"data": b""}
    headers = {"content-type": "application/octet-stream"}
    answer = httpx.post(server.url + "/v1/models/binary:predict", content=msgpack.packb({"a": array}), headers=headers)
    assert answer.status_code == 400
    assert answer.json()["error"].endswith("cannot be sent: its items hold no bytes")
    array.update({b"type": "|S1", b"shape": [2], b"data": b"ab"})
    answer = httpx.post(server.url + "/v1/models/binary:predict", content=msgpack.packb({"a": array}), headers=headers)
    assert msgpack.unpackb(answer.content) == {"keys": ["a"]}
