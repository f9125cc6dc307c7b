"""Truss's binary wire format: msgpack, with Truss's tags for dates, times, decimals and UUIDs and
msgpack-numpy's layout for NumPy arrays and scalars (truss/templates/shared/serialization.py), so that a Truss
client's ``application/octet-stream`` bodies and answers read the same here.

``msgpack`` is the ``truss-binary`` extra, imported on the first binary request; NumPy only when a body or a
result holds an array.
"""

from __future__ import annotations

import uuid
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from modelserve.errors import BadRequest, EncodeError, HTTPError, MsgpackMissing

MEDIA_TYPE = "application/octet-stream"


def is_binary(content_type: str | None) -> bool:
    """Whether a request's Content-Type asks for Truss's binary format (as Truss tells it: the media type)."""
    return content_type is not None and content_type.partition(";")[0].strip().lower() == MEDIA_TYPE


def _msgpack() -> Any:
    try:
        import msgpack
    except ImportError:
        raise MsgpackMissing() from None
    return msgpack


def loads(body: bytes) -> Any:
    """The inputs of a binary body; `BadRequest` naming what is wrong with a body that is not Truss's msgpack."""
    msgpack = _msgpack()
    try:
        return msgpack.unpackb(body, object_hook=_decode, strict_map_key=False)
    except BadRequest:
        raise
    except Exception as exc:  # msgpack's own errors, and a tag whose data is not what it says
        # Cut short: numpy's and datetime's messages quote the value whole (a dtype or a date of megabytes).
        reason = str(exc)
        if len(reason) > 200:
            reason = reason[:197] + "..."
        raise BadRequest(f"the body is not Truss's msgpack ({type(exc).__name__}: {reason})") from None


def dumps(result: Any) -> bytes:
    """A result in Truss's binary format (bytes as they are); `EncodeError` for one msgpack cannot hold."""
    if isinstance(result, (bytes, bytearray, memoryview)):
        return bytes(result)
    dump = getattr(result, "model_dump", None)  # a pydantic model, as Truss dumps it
    if callable(dump):
        result = dump(mode="python")
    try:
        return bytes(_msgpack().packb(result, default=_encode))
    except HTTPError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise EncodeError(result, getattr(exc, "type_name", None)) from None


def _encode(value: Any) -> Any:
    if isinstance(value, datetime):
        text = value.isoformat()
        return {b"__dt_datetime_iso__": True, b"data": text[:-6] + "Z" if text.endswith("+00:00") else text}
    if isinstance(value, date):
        return {b"__dt_date_iso__": True, b"data": value.isoformat()}
    if isinstance(value, time):
        if value.utcoffset() is not None:
            raise ValueError("a time with a timezone cannot be sent")
        return {b"__dt_time_iso__": True, b"data": value.isoformat()}
    if isinstance(value, timedelta):
        return {b"__dt_timedelta__": True, b"data": (value.days, value.seconds, value.microseconds)}
    if isinstance(value, Decimal):
        return {b"__decimal__": True, b"data": str(value)}
    if isinstance(value, uuid.UUID):
        return {b"__uuid__": True, b"data": str(value)}
    if type(value).__module__ == "numpy":
        import numpy as np

        if isinstance(value, np.ndarray) and value.dtype.kind not in "OV":
            data = value.tobytes() if not value.flags["C_CONTIGUOUS"] else value.data
            return {b"nd": True, b"type": value.dtype.str, b"kind": b"", b"shape": value.shape, b"data": data}
        if isinstance(value, (np.bool_, np.number)):
            return {b"nd": False, b"type": value.dtype.str, b"data": value.tobytes()}
    if isinstance(value, complex):
        return {b"complex": True, b"data": repr(value)}
    raise EncodeError(value)


_DATES: dict[bytes, Any] = {
    b"__dt_datetime_iso__": datetime.fromisoformat,
    b"__dt_date_iso__": date.fromisoformat,
    b"__dt_time_iso__": time.fromisoformat,
    b"__decimal__": Decimal,
    b"__uuid__": uuid.UUID,
}


def _decode(value: dict[Any, Any]) -> Any:
    if b"data" not in value:
        return value
    for tag, parse in _DATES.items():
        if tag in value:
            return parse(value[b"data"])
    if b"__dt_timedelta__" in value:
        days, seconds, microseconds = value[b"data"]
        return timedelta(days=days, seconds=seconds, microseconds=microseconds)
    if b"nd" in value:
        return _array(value)
    if b"complex" in value:
        return complex(value[b"data"])
    return value


def _array(value: dict[Any, Any]) -> Any:
    """A NumPy array or scalar in msgpack-numpy's layout, read in place from the body's bytes (no copy)."""
    import numpy as np

    dtype = np.dtype(value[b"type"])
    if dtype.hasobject or dtype.kind == "V" or value.get(b"kind", b"") == b"V":
        raise BadRequest(f"an array of dtype {dtype} cannot be sent (numbers, booleans and strings can)")
    if not dtype.itemsize:
        # Strings of no bytes ("S0", "U0", which numpy never gives data): the bytes would not bound the shape, and
        # a body of 60 bytes was an array of 2**40 items for user code to touch (tolist, astype, a loop).
        raise BadRequest(f"an array of dtype {dtype} cannot be sent: its items hold no bytes")
    data = value[b"data"]
    if value[b"nd"] is not True:
        return np.frombuffer(data, dtype=dtype, count=1)[0]
    shape = tuple(value[b"shape"])
    if any(not isinstance(n, int) or n < 0 for n in shape) or len(data) != dtype.itemsize * _product(shape):
        raise BadRequest(f"an array's shape {list(shape)} of {dtype} does not match its {len(data)} bytes")
    return np.ndarray(shape, dtype=dtype, buffer=data)


def _product(shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n
    return count
