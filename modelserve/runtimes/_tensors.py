"""Tensor descriptions, and the conversion of request values to a model's inputs.

A `TensorSpec` is what ``GET /<api>`` shows of an input or output: a name, a dtype and a shape whose
symbolic dimensions are None or their name. `InputConverter` turns a request's values (JSON lists, numbers,
or what a pre_inference hook returned) into numpy arrays of the right dtype and checks their rank and fixed
dimensions. Anything it cannot use is a 400 (`BadRequest`) that names the input, what was expected and
what was received: bad input is never a 500.

A value of a lower rank than its input's is reshaped to the input's shape with the unknown dimensions taken
as 1, when its element count fits, as Cortex did: four numbers fit ``[batch, 4]`` as ``[1, 4]``, a scalar
fits ``[None]`` as ``[1]``. That check runs only when the rank differs, so matching values pay nothing.

The converters are chosen once per input, at load; the request path only runs them.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from modelserve.errors import BadRequest

#: A dimension: a fixed size, a symbolic name, or None (unknown).
Dim = int | str | None


@dataclass(frozen=True)
class TensorSpec:
    """An input or output of a model. `dtype` is None for values that are not tensors (ONNX sequences, maps);
    `shape` is None when even the rank is unknown."""

    name: str
    dtype: np.dtype[Any] | None
    shape: tuple[Dim, ...] | None
    #: The runtime's own type name, for values numpy has no dtype for (e.g. ``seq(map(int64,tensor(float)))``).
    type_name: str | None = None

    @property
    def dtype_name(self) -> str:
        if self.dtype is None:
            return self.type_name or "unknown"
        return "string" if self.dtype.kind in "OUS" else self.dtype.name

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype_name, "shape": None if self.shape is None else list(self.shape)}

    def example(self) -> np.ndarray:
        """An array this input accepts (zeros, symbolic dimensions as 1): used to warm a model up."""
        shape = tuple(d if isinstance(d, int) and d >= 0 else 1 for d in (self.shape or ()))
        if self.dtype is None or self.dtype.kind == "O":
            return np.full(shape, "", dtype=object)
        return np.zeros(shape, dtype=self.dtype)


def shape_text(shape: Sequence[Dim] | None) -> str:
    if shape is None:
        return "any shape"
    dims = ", ".join("null" if d is None else str(d) for d in shape)
    return f"[{dims}]"


def _quoting() -> reprlib.Repr:
    quoting = reprlib.Repr()
    quoting.maxlevel, quoting.maxlist, quoting.maxtuple, quoting.maxdict = 4, 16, 16, 8
    quoting.maxstring = quoting.maxother = quoting.maxlong = 60
    return quoting


#: Quotes the first items of a value only: ``repr`` of a whole refused body (600,000 rows) took 5 times as long
#: as converting it, and a text of its size.
_QUOTING = _quoting()


def _short(value: Any) -> str:
    text = _QUOTING.repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _reason(exc: Exception) -> str:
    """numpy's message about a value, cut short: it quotes the value, which may be a string of megabytes."""
    text = str(exc)
    return text if len(text) <= 200 else text[:197] + "..."


class _Unusable(Exception):
    """A value that cannot become the input's dtype; the message says why."""


def holds_bool(data: Any) -> bool:
    """Whether decoded JSON `data` holds a true or a false: numpy reads them as 1 and 0, and a numeric input
    takes numbers only. `data` is nested lists that numpy has already found regular (every item of a list is a
    list, or none is), so each level is looked at through its first item."""
    if type(data) is not list:
        return type(data) is bool
    rows = [data]
    while rows:
        items = rows.pop()
        if items and type(items[0]) is list:
            rows.extend(items)
        elif bool in map(type, items):  # the types compared in C: a fraction of numpy's conversion of the items
            return True
    return False


def leaf_types(data: Any) -> set[type]:
    """The types of the items of decoded JSON `data` (nested lists, regular or not), lists left out.

    Looked at before numpy makes an array of them: numpy gives nested lists that hold a string one string dtype
    as wide as the longest string, so a body of a million short items and one long string would ask for a
    million times the long one (``[1, 1, ..., "x" * 5_000_000]``: 18 TiB). Each list's items are typed in one
    call (``set(map(type, items))``), about what numpy's conversion of them costs."""
    if type(data) is not list:
        return {type(data)}
    found: set[type] = set()
    rows = [data]
    while rows:
        items = rows.pop()
        types = set(map(type, items))
        if list in types:
            types.discard(list)
            rows.extend(item for item in items if type(item) is list)
        found |= types
    return found


def booleans_in(value: Any, array: np.ndarray) -> bool:
    """Whether decoded JSON `value`, which numpy made `array` of, held a true or a false.

    `holds_bool` looks at every item, at about the cost of numpy's conversion of them (measured: 16384 floats,
    1.5 ms against 1.4 ms on a busy 2-core machine). Above `_LOOK_FIRST` items the array is looked at first, in
    one vectorised pass: a boolean became a 0 or a 1, so an array with neither held none."""
    if array.size > _LOOK_FIRST and array.dtype.kind in "biuf":
        flat = array.reshape(-1)
        if not ((flat == 0) | (flat == 1)).any():
            return False
    return holds_bool(value)


#: Items from which `booleans_in` looks at the array before the items (two ufuncs cost more below).
_LOOK_FIRST = 256
_BOOLEANS = "holds true or false, which is not a number"
_NOT_BOOL = "holds a value that is not true, false, 0 or 1"
_STRINGS = "holds a string, which is not a number"


# ------------------------------------------------------------------------------------------------
# One function per dtype kind: value -> array of exactly `dtype`, or _Unusable.


def _to_float(dtype: np.dtype[Any]) -> Callable[[Any], np.ndarray]:
    blas = dtype in (np.float32, np.float64)

    def convert(value: Any) -> np.ndarray:
        if isinstance(value, np.ndarray):
            if value.dtype == dtype:
                return value
            if value.dtype.kind in "biuf":
                return value.astype(dtype)
        try:
            array = np.asarray(value, dtype=dtype)
        except (ValueError, TypeError, OverflowError, RuntimeWarning) as exc:
            raise _Unusable(f"cannot be converted to {dtype.name} ({_reason(exc)})") from None
        if booleans_in(value, array):
            raise _Unusable(_BOOLEANS)
        # JSON has no NaN or infinity: one here came from a null, or a number too large for the dtype. For
        # float32 and float64 the dot product of the array with itself (one BLAS call) is finite when every
        # element is, and takes a fraction of ``np.isfinite(array).all()`` (two ufunc calls, microseconds even
        # for four numbers); it may also overflow for elements above ~1e19 (float32): then the full test decides.
        if blas:
            flat = array.reshape(-1)
            try:
                if math.isfinite(flat.dot(flat)):
                    return array
            except RuntimeWarning:  # the overflow warning, where warnings are errors (tests)
                pass
        if not np.isfinite(array).all():
            raise _Unusable(f"holds a null or a number out of the range of {dtype.name}")
        return array

    return convert


#: The largest magnitude below which every integer is a float64 exactly. A float beyond it may not be the
#: number the client wrote: JSON parsers give an integer outside 64 bits as the nearest float (-2**63 - 1
#: arrives as -2.0**63), so an int64 or uint64 input refuses such floats rather than round them.
_EXACT_FLOAT_INT = 2**53


def _to_int(dtype: np.dtype[Any]) -> Callable[[Any], np.ndarray]:
    info = np.iinfo(dtype)
    bounds = f"the range of {dtype.name}, {info.min} to {info.max}"
    float_limit = min(_EXACT_FLOAT_INT, info.max)

    def out_of_range(number: Any) -> _Unusable:
        return _Unusable(f"holds {number}, out of {bounds}")

    def convert(value: Any) -> np.ndarray:
        if not isinstance(value, np.ndarray):
            # The items' types before numpy makes an array of them: it would widen a string among them into one
            # string dtype as wide as the longest (`leaf_types`).
            types = leaf_types(value)
            if bool in types:
                raise _Unusable(_BOOLEANS)
            if str in types or bytes in types:
                raise _Unusable(_STRINGS)
        try:
            raw = value if isinstance(value, np.ndarray) else np.asarray(value)
        except OverflowError:  # a Python int beyond 64 bits
            raise _too_large_int(value, info.min, info.max, out_of_range) from None
        except (ValueError, TypeError) as exc:
            raise _Unusable(f"cannot be converted to {dtype.name} ({_reason(exc)})") from None
        if raw.dtype == dtype:  # the fast path: JSON integers parsed straight into the input's dtype
            return raw
        kind = raw.dtype.kind
        if kind in "iuf" and raw.size:
            if kind == "f" and not (np.isfinite(raw).all() and (raw == np.floor(raw)).all()):
                raise _Unusable(f"holds a value that is not an integer, which {dtype.name} needs")
            low, high = raw.min(), raw.max()
            if low < info.min or high > info.max:
                raise out_of_range(low if low < info.min else high)
            if kind == "f" and (low < -float_limit or high > float_limit):
                raise _Unusable(
                    f"holds {low if low < -float_limit else high}, a float too large to be an exact integer; "
                    f"send JSON integers (without a decimal point or exponent) within {bounds}"
                )
        elif kind == "O" and raw.size:
            numbers = [item for item in raw.flat if isinstance(item, int) and not isinstance(item, bool)]
            if numbers and (min(numbers) < info.min or max(numbers) > info.max):
                raise out_of_range(min(numbers) if min(numbers) < info.min else max(numbers))
        if kind not in "biuf":
            try:
                return raw.astype(dtype)
            except (ValueError, TypeError, OverflowError) as exc:
                raise _Unusable(f"cannot be converted to {dtype.name} ({_reason(exc)})") from None
        return raw.astype(dtype)

    return convert


def _too_large_int(value: Any, low: int, high: int, out_of_range: Callable[[Any], _Unusable]) -> _Unusable:
    """The error for nested lists holding a Python int that numpy cannot hold: names the first one."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        elif isinstance(item, int) and not low <= item <= high:
            return out_of_range(item)
    return _Unusable("holds an integer too large for any integer dtype")


def _to_bool(dtype: np.dtype[Any]) -> Callable[[Any], np.ndarray]:
    def convert(value: Any) -> np.ndarray:
        if not isinstance(value, np.ndarray):
            types = leaf_types(value)  # before numpy widens strings into one dtype (`leaf_types`)
            if str in types or bytes in types:
                raise _Unusable(_NOT_BOOL)
        try:
            raw = value if isinstance(value, np.ndarray) else np.asarray(value)
        except (ValueError, TypeError) as exc:
            raise _Unusable(f"cannot be converted to bool ({_reason(exc)})") from None
        if raw.dtype.kind == "b":
            return raw
        if raw.dtype.kind in "iuf" and ((raw == 0) | (raw == 1)).all():
            return raw.astype(np.bool_)
        raise _Unusable(_NOT_BOOL)

    return convert


def _to_string(dtype: np.dtype[Any]) -> Callable[[Any], np.ndarray]:
    def convert(value: Any) -> np.ndarray:
        try:
            # The strings themselves, not numpy's string dtype as wide as the longest of them (`leaf_types`);
            # a number stays a number, and is refused below.
            raw = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=object)
        except (ValueError, TypeError) as exc:
            raise _Unusable(f"cannot be converted to strings ({_reason(exc)})") from None
        if raw.dtype.kind in "US":
            return raw.astype(object)
        if raw.dtype.kind == "O" and all(isinstance(item, (str, bytes)) for item in raw.flat):
            return raw
        raise _Unusable("holds a value that is not a string")

    return convert


def converter_for(dtype: np.dtype[Any]) -> Callable[[Any], np.ndarray]:
    kind = dtype.kind
    if kind == "f":
        return _to_float(dtype)
    if kind in "iu":
        return _to_int(dtype)
    if kind == "b":
        return _to_bool(dtype)
    if kind in "OUS":
        return _to_string(dtype)
    raise TypeError(f"inputs of dtype {dtype} are not supported")


class InputConverter:
    """Turns request values into the feeds of a model: ``{input name: array}``."""

    def __init__(self, inputs: Sequence[TensorSpec]) -> None:
        self.inputs = tuple(inputs)
        self.names = tuple(spec.name for spec in inputs)
        self._single = self.inputs[0] if len(self.inputs) == 1 else None
        self._steps: dict[str, tuple[TensorSpec, Callable[[Any], np.ndarray], int, tuple[tuple[int, int], ...]]] = {}
        #: The shape a value of lower rank is reshaped to: the input's, unknown dimensions as 1.
        self._fits: dict[str, tuple[int, ...]] = {}
        for spec in self.inputs:
            if spec.dtype is None:
                kind = spec.type_name or "unknown"
                what = (
                    f"a tensor of {kind[7:-1]}, a dtype numpy lacks"
                    if kind.startswith("tensor(")
                    else f"of type {kind}, not a tensor"
                )
                raise TypeError(
                    f"input '{spec.name}' is {what}; the inputs served are tensors of numbers, bool or strings"
                )
            rank = -1 if spec.shape is None else len(spec.shape)
            fixed = tuple((i, d) for i, d in enumerate(spec.shape or ()) if isinstance(d, int) and d >= 0)
            self._steps[spec.name] = (spec, converter_for(spec.dtype), rank, fixed)
            self._fits[spec.name] = tuple(d if isinstance(d, int) and d >= 0 else 1 for d in (spec.shape or ()))
        # Inputs that share a named dimension ("batch") must agree on its size; the runtime would fail deep
        # inside the graph otherwise (a 500 for bad input).
        axes: dict[str, list[tuple[str, int]]] = {}
        for spec in self.inputs:
            for axis, dim in enumerate(spec.shape or ()):
                if isinstance(dim, str):
                    axes.setdefault(dim, []).append((spec.name, axis))
        self._shared = tuple((dim, tuple(where)) for dim, where in axes.items() if len(where) > 1)

    def expected(self) -> str:
        return ", ".join(f"'{spec.name}' ({spec.dtype_name} {shape_text(spec.shape)})" for spec in self.inputs)

    def __call__(self, value: Any) -> dict[str, np.ndarray]:
        """The feeds of one call; `value` is a dict keyed by input names, or the value of a lone input."""
        single = self._single
        if not isinstance(value, dict):
            if single is None:
                raise BadRequest(
                    f"expected an object keyed by the model's input names ({self.expected()}), "
                    f"received {type(value).__name__}"
                )
            return {single.name: self._convert(single.name, value)}
        if single is not None and len(value) == 1:  # the usual case, without the generic loops below
            name = single.name
            if name in value:
                return {name: self._convert(name, value[name])}
        if len(value) != len(self.names) or any(name not in value for name in self.names):
            self._refuse_names(value)
        feeds = {name: self._convert(name, item) for name, item in value.items()}
        if self._shared:
            self._check_shared(feeds)
        return feeds

    def _check_shared(self, feeds: dict[str, np.ndarray]) -> None:
        for dim, where in self._shared:
            sizes = {name: feeds[name].shape[axis] for name, axis in where}
            if len(set(sizes.values())) > 1:
                found = ", ".join(f"'{name}' has {size}" for name, size in sizes.items())
                raise BadRequest(
                    f"inputs {', '.join(repr(name) for name in sizes)} share the dimension '{dim}', "
                    f"which must have one size; received {found}; the model's inputs are {self.expected()}"
                )

    def _refuse_names(self, value: dict[Any, Any]) -> None:
        unknown = [str(name) for name in value if name not in self._steps]
        missing = [name for name in self.names if name not in value]
        problems = []
        if missing:
            problems.append("missing input " + ", ".join(f"'{name}'" for name in missing))
        if unknown:
            # The body's own keys: any number of them, of any length (a 400 of megabytes named each whole).
            shown = ", ".join(f"'{name if len(name) <= 80 else name[:77] + '...'}'" for name in unknown[:10])
            more = f" and {len(unknown) - 10:,} more" if len(unknown) > 10 else ""
            problems.append(f"unknown input {shown}{more}")
        raise BadRequest(f"{'; '.join(problems)}; the model's inputs are {self.expected()}")

    def _convert(self, name: str, value: Any) -> np.ndarray:
        spec, convert, rank, fixed = self._steps[name]
        try:
            array = convert(value)
        except _Unusable as exc:
            raise BadRequest(
                f"input '{name}': expected {spec.dtype_name} with shape {shape_text(spec.shape)}; "
                f"received {_short(value)}, which {exc}"
            ) from None
        shape = array.shape
        if rank >= 0 and len(shape) != rank:
            array = self._reshape(name, array)
            shape = array.shape
        for axis, size in fixed:
            if shape[axis] != size:
                raise BadRequest(
                    f"input '{name}': expected {spec.dtype_name} with shape {shape_text(spec.shape)}; "
                    f"received shape {list(shape)} (dimension {axis} is {shape[axis]}, not {size})"
                )
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        return array

    def _reshape(self, name: str, array: np.ndarray) -> np.ndarray:
        """A value of lower rank, reshaped to the input's shape with unknown dimensions as 1 (Cortex's rule);
        a higher rank, or an element count that does not fit, is the precise 400."""
        spec, _, rank, _ = self._steps[name]
        target = self._fits[name]
        if array.ndim < rank and array.size == math.prod(target):
            return array.reshape(target)
        fits = "" if array.ndim > rank else f", and its {array.size} values do not fill {list(target)}"
        raise BadRequest(
            f"input '{name}': expected {spec.dtype_name} with shape {shape_text(spec.shape)} (rank {rank}); "
            f"received shape {list(array.shape)} (rank {array.ndim}){fits}"
        )
