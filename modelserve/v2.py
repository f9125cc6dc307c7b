"""The Open Inference Protocol's tensors (KServe V2, Triton HTTP): request bodies to numpy arrays and back.

No ASGI here: `decode_request` turns a body (and the ``Inference-Header-Content-Length`` header) into an
`InferRequest` whose inputs are a `V2Inputs` mapping of name to array, and `encode_response` turns the
outputs of a call into a body, with the binary tensor extension both ways:

* an input whose ``parameters.binary_data_size`` is set is read from the bytes after the JSON header, as a
  `np.frombuffer` view on the body (no copy; the array is read-only); BYTES elements are 4-byte
  little-endian lengths followed by the bytes;
* a header length of 0 is the raw binary request: the whole body is the data of the model's single input;
* an output is sent as binary when its ``parameters.binary_data`` (or the request's
  ``parameters.binary_data_output``) says so; the answer then carries ``Inference-Header-Content-Length``.

A tensor's metadata (`TensorMeta`) decodes the raw binary request; what an API's metadata holds and how a
request is checked against it is `modelserve.v2_signature`.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import orjson

from modelserve.errors import BadRequest, shorten
from modelserve.runtimes._tensors import booleans_in, leaf_types

#: The fixed-size datatypes and their numpy dtypes (little-endian, as the binary extension sends them).
FIXED: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
#: Every datatype a tensor may have: the fixed-size ones, BF16 (binary only) and BYTES.
DATATYPES = (*FIXED, "BF16", "BYTES")
_KNOWN = frozenset(DATATYPES)
_BY_DTYPE: dict[np.dtype[Any], str] = {dtype: name for name, dtype in FIXED.items()}
#: The native dtypes whose arrays orjson writes as JSON as they are (numbers of 4 bytes or more), with their
#: datatypes: an answer's usual case, in one lookup.
_PLAIN: dict[np.dtype[Any], str] = {
    dtype.newbyteorder("="): name for name, dtype in FIXED.items() if dtype.kind in "iuf" and dtype.itemsize >= 4
}
_LENGTH = struct.Struct("<I")
#: The most dimensions a tensor may have (numpy's own limit).
MAX_RANK = 64
#: The most characters a tensor's name may have: a name is quoted in the 400s about its tensor, and one of
#: megabytes made each of them as long (a body of 4 MB answered with 4 MB).
MAX_NAME = 1024
#: The most elements a shape's non-zero dimensions may multiply to. A tensor that holds elements is bounded by
#: the body already (each element takes at least a byte of it); this bounds the shapes of empty tensors
#: (``[0, 2**40, 2**40]``), which numpy cannot represent beyond about 2**63 bytes.
MAX_ELEMENTS = 2**40


def bfloat16() -> np.dtype[Any]:
    """numpy has no bfloat16: BF16 tensors need ml_dtypes (which TensorFlow and tritonclient install)."""
    try:
        import ml_dtypes
    except ImportError:
        raise BadRequest("BF16 tensors need the ml_dtypes package on the server (pip install ml_dtypes)") from None
    bfloat16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
    return bfloat16


def datatype_of(dtype: np.dtype[Any]) -> str:
    """The V2 datatype of a numpy dtype; strings, bytes and objects are BYTES. `TypeError` for the rest."""
    name = _BY_DTYPE.get(dtype)  # numpy dtypes hash by value: float32 finds "<f4" on a little-endian machine
    if name is None and dtype.byteorder == ">":
        name = _BY_DTYPE.get(dtype.newbyteorder("<"))
    if name is not None:
        return name
    if dtype.kind in "OUS":
        return "BYTES"
    if dtype.name == "bfloat16":
        return "BF16"
    raise TypeError(f"numpy dtype {dtype} has no V2 datatype")


class V2Inputs(dict[str, Any]):
    """The inputs of one V2 request by name, as numpy arrays, with the request's `parameters`.

    What a Model class's first stage receives on ``POST /v2/models/<api>/infer``::

        def predict(self, inputs):
            x = inputs["x"]                     # np.ndarray (read-only when it came as binary data)
            scale = inputs.parameters.get("scale", 1.0)
    """

    __slots__ = ("parameters",)
    parameters: dict[str, Any]

    @classmethod
    def of(cls, tensors: Iterable[tuple[str, np.ndarray]] = (), parameters: dict[str, Any] | None = None) -> V2Inputs:
        inputs = cls(tensors)  # dict's own constructor: a Python __init__ would cost every request
        inputs.parameters = parameters or {}
        return inputs


# ------------------------------------------------------------------------------------------------
# requests


@dataclass
class InferRequest:
    """One decoded inference request."""

    id: str | None
    inputs: V2Inputs
    #: The requested outputs and whether each is sent as binary; None: every output, as `binary_output`.
    outputs: dict[str, bool | None] | None
    binary_output: bool


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _shape(value: Any, name: str) -> None:
    raise BadRequest(f"input '{name}': 'shape' must be a list of integers >= 0, got {shorten(value)}")


def long_name(what: str, name: str) -> NoReturn:
    """The 400 for a tensor's name over `MAX_NAME` characters, quoting its beginning only."""
    raise BadRequest(f"{what}'s name has {len(name)} characters, more than {MAX_NAME}: {shorten(name)}")


def element_count(name: str, shape: Any, room: int) -> int:
    """The element count of input `name`'s declared `shape`, in Python ints, before any array exists: a 400
    for a shape that is not a list of at most `MAX_RANK` integers >= 0 (booleans are not), that declares more
    elements than `room` (the bytes of the body, each element needing at least one) or whose non-zero
    dimensions multiply beyond `MAX_ELEMENTS`."""
    if type(shape) is not list:
        _shape(shape, name)
    if len(shape) > MAX_RANK:
        raise BadRequest(f"input '{name}': 'shape' has {len(shape)} dimensions; at most {MAX_RANK} are supported")
    count = nominal = 1
    for dim in shape:
        if type(dim) is not int or dim < 0:
            _shape(shape, name)
        count *= dim
        if dim:
            nominal *= dim
    if count > room:
        raise BadRequest(
            f"input '{name}': shape {shorten(shape)} declares {count} elements, more than a body of {room} bytes holds"
        )
    if nominal > MAX_ELEMENTS:
        raise BadRequest(
            f"input '{name}': shape {shorten(shape)} is too large; its non-zero dimensions may multiply to at most "
            f"{MAX_ELEMENTS}"
        )
    return count


def decode_request(body: bytes, header_length: int | None, raw_input: TensorMeta | None, text: bool) -> InferRequest:
    """Decode an inference request. `header_length` is ``Inference-Header-Content-Length`` (None: the whole body
    is JSON; 0: the raw binary request of `raw_input`, the model's single input). `text`: BYTES become str
    (a runtime's string tensors) instead of bytes."""
    if header_length == 0:
        if raw_input is None:
            raise BadRequest(
                "a raw binary request (Inference-Header-Content-Length: 0) needs a model with a single input "
                "of known datatype; send a JSON header that names the input"
            )
        return InferRequest(None, V2Inputs.of([(raw_input.name, raw_input.from_raw(body, text))]), None, False)
    if header_length is not None and header_length > len(body):
        raise BadRequest(f"Inference-Header-Content-Length is {header_length}, but the body has only {len(body)} bytes")
    try:
        header = orjson.loads(body if header_length is None else memoryview(body)[:header_length])
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the inference request is not valid JSON: {exc}") from None
    if type(header) is not dict:
        _object(header, "the inference request")
    parameters = header.get("parameters") or {}
    if type(parameters) is not dict:
        _object(parameters, "'parameters'")
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("the inference request needs 'inputs', a non-empty list of tensors")
    offset = len(body) if header_length is None else header_length
    # JSON booleans are numbers to numpy; a numeric tensor's data is searched for them only when the header
    # holds one at all (a fast scan of bytes).
    booleans = body.find(b"true", 0, offset) >= 0 or body.find(b"false", 0, offset) >= 0
    inputs = V2Inputs()
    inputs.parameters = parameters
    # Checks in line, messages built only when they fail: this loop runs on every request.
    for item in raw_inputs:
        if type(item) is not dict:
            _object(item, "each input")
        name = item.get("name")
        if not isinstance(name, str):
            raise BadRequest(f"an input has no 'name' (a string): {shorten(item)}")
        if len(name) > MAX_NAME:
            long_name("an input", name)
        if name in inputs:
            raise BadRequest(f"input '{name}' is given twice")
        datatype = item.get("datatype")
        if type(datatype) is not str or datatype not in _KNOWN:
            raise BadRequest(f"input '{name}': unknown datatype {datatype!r}; known: {', '.join(DATATYPES)}")
        shape = item.get("shape")
        count = element_count(name, shape, len(body))
        params = item.get("parameters")
        size = None
        if params:
            if type(params) is not dict:
                _object(params, f"input '{name}': 'parameters'")
            if "shared_memory_region" in params:
                raise BadRequest(f"input '{name}': shared memory is not supported by modelserve; send the data")
            size = params.get("binary_data_size")
        if size is not None:
            if type(size) is not int or size < 0:
                raise BadRequest(f"input '{name}': 'binary_data_size' must be an integer >= 0, got {size!r}")
            if offset + size > len(body):
                raise BadRequest(
                    f"input '{name}': binary_data_size is {size}, but only {len(body) - offset} bytes of binary "
                    "data are left in the body"
                )
            inputs[name] = from_binary(name, datatype, shape, body, offset, size, text, count)
            offset += size
        elif "data" in item:
            inputs[name] = from_json(name, datatype, shape, item["data"], text, count, booleans)
        else:
            raise BadRequest(f"input '{name}' has neither 'data' nor parameters.binary_data_size")
    if offset != len(body):
        raise BadRequest(f"{len(body) - offset} bytes of binary data after the inputs belong to no input")
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        # The protocol's id is a string (Triton and MLServer refuse others): echoed as given, never as a repr.
        raise BadRequest(f"'id' must be a string, got {type(request_id).__name__}")
    outputs = header.get("outputs")
    return InferRequest(
        request_id,
        inputs,
        _requested_outputs(outputs) if outputs is not None else None,
        bool(_flag(parameters, "binary_data_output", "'parameters'")) if parameters else False,
    )


def _flag(parameters: dict[str, Any], key: str, where: str) -> bool | None:
    """A boolean parameter, or None when absent; another value is a 400 (bool("false") is true)."""
    value = parameters.get(key)
    if value is not None and type(value) is not bool:
        raise BadRequest(f"{where}: '{key}' must be true or false, got {type(value).__name__}")
    return value


def _requested_outputs(raw: Any) -> dict[str, bool | None] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise BadRequest("'outputs' must be a list of {\"name\": ...} objects")
    outputs: dict[str, bool | None] = {}
    for item in raw:
        item = _object(item, "each requested output")
        name = item.get("name")
        if not isinstance(name, str):
            raise BadRequest(f"a requested output has no 'name' (a string): {shorten(item)}")
        if len(name) > MAX_NAME:
            long_name("a requested output", name)
        params = _object(item.get("parameters") or {}, f"output '{name}': 'parameters'")
        for unsupported in ("shared_memory_region", "classification"):
            if params.get(unsupported):
                raise BadRequest(f"output '{name}': {unsupported} is not supported by modelserve")
        outputs[name] = _flag(params, "binary_data", f"output '{name}': 'parameters'")  # None: the request's decides
    return outputs


def from_json(
    name: str,
    datatype: str,
    shape: Sequence[int],
    data: Any,
    text: bool,
    count: int | None = None,
    booleans: bool = True,
) -> np.ndarray:
    """The array of a tensor given as JSON ``data`` (nested or flat, row-major). `count`: the shape's element
    count, checked by `element_count`; `booleans`: whether the data may hold JSON booleans, which only a BOOL
    tensor takes."""
    if count is None:
        count = element_count(name, list(shape), MAX_ELEMENTS)
    dtype = FIXED.get(datatype)
    if dtype is not None and dtype.kind == "f":  # the common case, in line
        try:
            array = np.asarray(data, dtype=dtype)
        except (ValueError, TypeError, OverflowError, RuntimeWarning) as exc:  # the warning where it is an error
            raise BadRequest(f"input '{name}': 'data' is not a list of {datatype} values ({_cut(exc)})") from None
        # JSON has no NaN or infinity: one here was a null, or a number out of the datatype's range. For float32/64
        # the dot product of the array with itself (one BLAS call, a tenth of ``np.isfinite(array).all()`` for a
        # few numbers; see runtimes._tensors) is finite when every element is; the full test when it is not.
        finite = False
        if dtype.itemsize >= 4:
            flat = array.reshape(-1)
            try:
                finite = math.isfinite(flat.dot(flat))
            except RuntimeWarning:  # an overflow, where warnings are errors (tests)
                pass
        if not finite and not np.isfinite(array).all():
            raise BadRequest(f"input '{name}': 'data' holds a null or a number out of the range of {datatype}")
        if booleans and booleans_in(data, array):
            raise BadRequest(f"input '{name}': 'data' must be numbers for {datatype}, not true or false")
    elif datatype == "BYTES":
        array = _strings_from_json(name, shape, data, text, count)
    elif datatype == "BF16":
        raise BadRequest(f"input '{name}': BF16 tensors travel only as binary data (parameters.binary_data_size)")
    else:
        array = _numbers_from_json(name, datatype, FIXED[datatype], data)
        if booleans and datatype != "BOOL" and booleans_in(data, array):
            raise BadRequest(f"input '{name}': 'data' must be integers for {datatype}, not true or false")
    if array.size != count:
        raise BadRequest(f"input '{name}': shape {list(shape)} has {count} elements, but 'data' has {array.size}")
    return array.reshape(shape)


def _numbers_from_json(name: str, datatype: str, dtype: np.dtype[Any], data: Any) -> np.ndarray:
    """Integers and booleans (floats are decoded in `from_json`): exact, or a 400."""
    kind = dtype.kind
    types = leaf_types(data)  # before numpy widens every item to the longest string among them (`leaf_types`)
    if str in types or bytes in types:
        wanted = "true or false" if kind == "b" else "integers"
        raise BadRequest(f"input '{name}': 'data' of a {datatype} tensor must be {wanted}, not strings")
    try:
        raw = np.asarray(data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise BadRequest(f"input '{name}': 'data' is not a list of {datatype} values ({_cut(exc)})") from None
    if raw.size == 0:
        return raw.astype(dtype)
    if kind == "b":
        if raw.dtype.kind != "b":
            raise BadRequest(f"input '{name}': 'data' of a BOOL tensor must be true or false")
        return raw
    if raw.dtype.kind in "fO":
        # numpy makes floats (or objects) of integers beyond int64 mixed with others: look at the JSON values.
        raw = np.array(data, dtype=object)
        if not all(type(item) is int for item in raw.flat):
            raise BadRequest(f"input '{name}': 'data' of a {datatype} tensor must be integers")
    elif raw.dtype.kind not in "iu":
        raise BadRequest(f"input '{name}': 'data' of a {datatype} tensor must be integers, got {raw.dtype.name} values")
    info = np.iinfo(dtype)
    low, high = raw.min(), raw.max()
    if low < info.min or high > info.max:
        raise BadRequest(
            f"input '{name}': 'data' holds {low if low < info.min else high}, out of the range of {datatype}"
        )
    return raw.astype(dtype, copy=False)


def _strings_from_json(name: str, shape: Sequence[int], data: Any, text: bool, count: int) -> np.ndarray:
    try:
        raw = np.array(data, dtype=object)
    except ValueError as exc:
        raise BadRequest(f"input '{name}': 'data' is not a list of strings ({_cut(exc)})") from None
    if raw.size != count:  # before each string is looked at, and encoded: a copy of every one of them
        raise BadRequest(f"input '{name}': shape {list(shape)} has {count} elements, but 'data' has {raw.size}")
    flat = raw.reshape(-1)
    for i, item in enumerate(flat):
        if not isinstance(item, str):
            raise BadRequest(f"input '{name}': 'data' of a BYTES tensor must be strings, got {shorten(item)}")
        if not text:
            flat[i] = item.encode()
    return flat


def from_binary(
    name: str,
    datatype: str,
    shape: Sequence[int],
    body: bytes,
    offset: int,
    size: int,
    text: bool,
    count: int | None = None,
) -> np.ndarray:
    """The array of a tensor sent as binary data: ``body[offset:offset + size]``, viewed, not copied. `count`:
    the shape's element count, checked by `element_count`."""
    if count is None:
        count = element_count(name, list(shape), len(body))
    if datatype == "BYTES":
        return _strings_from_binary(name, body, offset, size, count, text).reshape(shape)
    dtype = bfloat16() if datatype == "BF16" else FIXED[datatype]
    if size != count * dtype.itemsize:
        raise BadRequest(
            f"input '{name}': shape {list(shape)} of {datatype} needs {count * dtype.itemsize} bytes, "
            f"binary_data_size is {size}"
        )
    array = np.frombuffer(body, dtype=dtype, count=count, offset=offset)
    if datatype == "BOOL" and count and array.view(np.uint8).max() > 1:
        raise BadRequest(f"input '{name}': a BOOL tensor's bytes must be 0 or 1")
    return array.reshape(shape)


def _strings_from_binary(name: str, body: bytes, offset: int, size: int, count: int, text: bool) -> np.ndarray:
    # Each element takes at least its 4-byte length, and the elements are read no further than the shape's count:
    # a shape of [1] over 10 MB of short elements made millions of objects (124 MiB) before its 400.
    if size < 4 * count:
        raise BadRequest(
            f"input '{name}': its shape has {count} elements, but {size} bytes of BYTES data hold at most {size // 4}"
        )
    end = offset + size
    items: list[Any] = []
    unpack = _LENGTH.unpack_from
    while offset < end:
        if len(items) == count:
            raise BadRequest(f"input '{name}': its shape has {count} elements, but the BYTES data holds more")
        if offset + 4 > end:
            raise BadRequest(f"input '{name}': BYTES data ends inside an element's 4-byte length")
        (length,) = unpack(body, offset)
        offset += 4
        if offset + length > end:
            raise BadRequest(f"input '{name}': a BYTES element of {length} bytes runs past binary_data_size")
        item = body[offset : offset + length]
        if text:
            try:
                items.append(item.decode())
            except UnicodeDecodeError:
                raise BadRequest(f"input '{name}': the model's string input needs UTF-8 text") from None
        else:
            items.append(item)
        offset += length
    if len(items) != count:
        raise BadRequest(f"input '{name}': its shape has {count} elements, but the BYTES data holds {len(items)}")
    array = np.empty(count, dtype=object)
    array[:] = items
    return array


# ------------------------------------------------------------------------------------------------
# answers


def outputs_of(result: Any) -> dict[str, np.ndarray]:
    """A Model class's result as V2 outputs: a mapping of name to array (or list, or scalar), or one value for
    an output named ``output``. `TypeError` for a result numpy cannot make an array of."""
    if isinstance(result, Mapping):
        items = list(result.items())
    else:
        items = [("output", result)]
    outputs = {}
    for name, value in items:
        try:
            array = value if isinstance(value, np.ndarray) else np.asarray(value)
        except ValueError as exc:  # ragged lists: the class's result, not the server's failure
            raise TypeError(f"output {name!r} is not a tensor ({exc})") from None
        if array.dtype.kind == "O" and not all(isinstance(item, (str, bytes)) for item in array.flat):
            raise TypeError(f"output {name!r} is not a tensor (it holds {type(next(iter(array.flat), None)).__name__})")
        outputs[str(name)] = array
    return outputs


def encode_response(
    model_name: str,
    request: InferRequest,
    outputs: Mapping[str, np.ndarray],
    version: str = "1",
) -> tuple[bytes, int | None]:
    """The answer to `request` by version `version` of the model: (body, header length); the header length is
    None without binary outputs.

    Outputs the request did not ask for are left out (all of them are sent when it named none). A datatype
    numpy cannot give raises `TypeError` (the model's fault, a 500); a BYTES output that is not UTF-8 asked
    for as JSON is a 400 (ask for it as binary)."""
    wanted = request.outputs
    names: Iterable[str] = outputs if wanted is None else wanted
    described = []
    binaries: list[Any] = []
    for name in names:
        array = outputs[name]
        binary = request.binary_output if wanted is None or wanted[name] is None else bool(wanted[name])
        plain = _PLAIN.get(array.dtype)
        if plain is not None and not binary:  # `_to_json`'s usual case, in line
            described.append({"name": name, "datatype": plain, "shape": list(array.shape), "data": array.ravel()})
            continue
        dtype = array.dtype
        datatype = _BY_DTYPE.get(dtype) or datatype_of(dtype)
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary:
            data = to_binary(array, datatype)
            tensor["parameters"] = {"binary_data_size": len(data)}
            binaries.append(data)
        else:
            tensor["data"] = _to_json(name, array, datatype)
        described.append(tensor)
    answer: dict[str, Any] = {"model_name": model_name, "model_version": version}
    if request.id is not None:
        answer["id"] = request.id
    answer["outputs"] = described
    header = orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY)
    if not binaries:
        return header, None
    return b"".join([header, *binaries]), len(header)


def to_binary(array: np.ndarray, datatype: str) -> Any:
    """A tensor's data as the binary extension (and gRPC's ``raw_output_contents``) sends it: little-endian
    values, or each BYTES element as a 4-byte length and its bytes; a buffer over the array where it can be."""
    if datatype == "BYTES":
        parts = []
        for item in array.reshape(-1):
            data = item.encode() if isinstance(item, str) else bytes(item)
            parts.append(_LENGTH.pack(len(data)))
            parts.append(data)
        return b"".join(parts)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data  # joined into the body without a copy


def _to_json(name: str, array: np.ndarray, datatype: str) -> Any:
    if datatype == "BYTES":
        try:
            return [item.decode() if isinstance(item, bytes) else str(item) for item in array.reshape(-1)]
        except UnicodeDecodeError:
            raise BadRequest(
                f"output '{name}' holds bytes that are not UTF-8 text; ask for it as binary data "
                '(outputs: [{"name": ..., "parameters": {"binary_data": true}}])'
            ) from None
    if datatype in ("FP16", "BF16"):
        array = array.astype(np.float32)  # exact; orjson writes no float16
    elif array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return array.ravel()  # C order, a view when it can be


# ------------------------------------------------------------------------------------------------
# a tensor's metadata, and the raw binary request it decodes


@dataclass(frozen=True)
class TensorMeta:
    """An input or output as the metadata route shows it: ``-1`` for a variable dimension; `shape` is None
    when even the rank is unknown (shown as ``[-1]``)."""

    name: str
    datatype: str
    shape: tuple[int, ...] | None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape or [-1])}

    def text(self) -> str:
        return f"'{self.name}' ({self.datatype} {self.describe()['shape']})"

    def from_raw(self, body: bytes, text: bool) -> np.ndarray:
        """The raw binary request's input: the whole body, its one variable dimension deduced from its size."""
        shape = self.shape
        variable = [i for i, d in enumerate(shape or ()) if d < 0]
        if shape is None or len(variable) > 1:
            raise BadRequest(
                f"a raw binary request needs an input with at most one variable dimension; {self.text()} has more"
            )
        if self.datatype == "BYTES":
            return _raw_strings(self, body, shape, variable, text)
        dtype = bfloat16() if self.datatype == "BF16" else FIXED[self.datatype]
        known = math.prod(d for d in shape if d >= 0) * dtype.itemsize
        if (known == 0 and len(body)) or (known and len(body) % known) or (not variable and len(body) != known):
            raise BadRequest(f"a raw binary request of {len(body)} bytes does not fit input {self.text()}")
        if variable:
            shape = tuple(len(body) // known if i == variable[0] else d for i, d in enumerate(shape))
        return from_binary(self.name, self.datatype, shape, body, 0, len(body), text)


def _raw_strings(meta: TensorMeta, body: bytes, shape: tuple[int, ...], variable: list[int], text: bool) -> np.ndarray:
    if variable:
        known = math.prod(d for d in shape if d >= 0)
        items = _count_strings(body)
        if not known or items % known:
            raise BadRequest(f"a raw binary request of {items} BYTES elements does not fit input {meta.text()}")
        shape = tuple(items // known if i == variable[0] else d for i, d in enumerate(shape))
    return from_binary(meta.name, "BYTES", shape, body, 0, len(body), text)


def _count_strings(body: bytes) -> int:
    """How many length-prefixed elements a BYTES body holds (a bad prefix is found when it is decoded)."""
    count, offset = 0, 0
    while offset + 4 <= len(body):
        offset += 4 + _LENGTH.unpack_from(body, offset)[0]
        count += 1
    return count


def _cut(exc: Exception) -> str:
    """numpy's message about the data, cut short: it quotes the value, which may be a string of megabytes."""
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."


#: The most names a 400 lists (of inputs, requested outputs); it counts the rest.
LISTED_MAX = 10


def listed(names: Sequence[str]) -> str:
    """The first `LISTED_MAX` of `names`, quoted, and a count of the others: a request may name any number of
    tensors (400,000 unknown outputs were a 400 of 4 MB that listed each)."""
    text = ", ".join(repr(name) for name in names[:LISTED_MAX])
    return text if len(names) <= LISTED_MAX else f"{text} and {len(names) - LISTED_MAX:,} more"
