"""Payload codecs: request bodies in by Content-Type, results out by Python type.

Requests: ``application/json`` and ``*/*+json`` become Python objects, ``text/plain`` a str (decoded with
the ``charset`` parameter, utf-8 by default), anything else the raw bytes. JSON bodies over `LARGE_JSON` are
parsed in pieces that hold the GIL briefly each (`modelserve._chunked_json`), to the same value.

Results: bytes become application/octet-stream; everything else JSON, as Truss and Cortex answered: dict,
list, tuple, numbers, bool, None, and a str too (``"iris-setosa"``, quotes included; send text with a
Starlette ``Response``). numpy arrays and scalars become lists and numbers, pydantic models their own JSON
serialisation (``model_dump(mode="json")``; pydantic is never imported for this). An `Answer` (a body that
already has its media type, as a backend that follows another server's answers builds it) is sent as it is.
"""

from __future__ import annotations

import asyncio
import codecs as _stdlib_codecs
import inspect
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from modelserve import _chunked_json, _threads
from modelserve.errors import BadRequest, EncodeError

logger = logging.getLogger("modelserve")

JSON_TYPE = b"application/json"
TEXT_TYPE = b"text/plain; charset=utf-8"
BYTES_TYPE = b"application/octet-stream"


def parse_content_type(header: str | None) -> tuple[str, dict[str, str]]:
    """Split ``text/plain; charset=latin-1`` into ("text/plain", {"charset": "latin-1"})."""
    if not header:
        return "", {}
    media_type, _, rest = header.partition(";")
    params = {}
    for part in rest.split(";"):
        key, sep, value = part.partition("=")
        if sep:
            params[key.strip().lower()] = value.strip().strip('"')
    return media_type.strip().lower(), params


class Decoder:
    """Turns a request body into the value a handler receives."""

    name = "bytes"

    def decode(self, body: bytes, params: dict[str, str]) -> Any:
        return body


#: Bodies up to this size are decoded on the event loop; larger ones in a worker thread, so that no request's
#: parsing stalls the loop (orjson parses about 1 MiB of JSON numbers in 5-10 ms on this machine's cores).
DECODE_INLINE_MAX = 64 * 1024

#: JSON bodies larger than this are parsed in pieces (`modelserve._chunked_json`), one body at a time in the
#: process: orjson holds the GIL for all of one call, 35 ms for 10 MiB of numbers on a quiet core here.
LARGE_JSON = 1024 * 1024
_large_json = threading.Lock()


class JSONDecoder(Decoder):
    name = "json"

    def decode(self, body: bytes, params: dict[str, str]) -> Any:
        try:
            if len(body) > LARGE_JSON and type(body) is bytes:
                return _decode_large(body)
            return orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from None


def loads(body: bytes) -> Any:
    """``orjson.loads(body)`` (its value, or its `orjson.JSONDecodeError`) as the JSON decoder parses a body: over
    `LARGE_JSON`, in pieces, off the event loop (`_decode_large`). For a body that is not a request's own (a
    WebSocket message, the body a shared OpenAI path reads its ``model`` from), given to a worker thread when
    longer than `DECODE_INLINE_MAX`."""
    if len(body) > LARGE_JSON and type(body) is bytes:
        return _decode_large(body)
    return orjson.loads(body)


def _decode_large(body: bytes) -> Any:
    """A large body, in pieces, one body at a time: several threads decoding at once would take turns with the
    GIL, and the event loop would wait for its turn behind each of them. On an event loop's own thread the body
    is parsed whole: pieces would not let that loop run any sooner, and the lock could make it wait for
    another thread's decode."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        with _large_json:
            return _chunked_json.loads(body)
    return orjson.loads(body)


class TextDecoder(Decoder):
    name = "text"

    def decode(self, body: bytes, params: dict[str, str]) -> Any:
        charset = params.get("charset", "utf-8")
        try:
            codec = _stdlib_codecs.lookup(charset)
        except LookupError:
            raise BadRequest(f"unknown charset {charset!r} in the Content-Type header") from None
        if codec.name in _NOT_FOR_BODIES:
            raise BadRequest(f"charset {charset!r} in the Content-Type header is not a charset for a request body")
        try:
            return body.decode(charset)
        except UnicodeDecodeError as exc:
            raise BadRequest(f"request body is not valid {charset} text: {exc.reason} at byte {exc.start}") from None
        except (LookupError, UnicodeError):
            # A codec that is not a text encoding (rot13, base64, zlib, hex) or that refuses everything
            # (undefined): str.decode names neither as a charset problem, so say it here.
            raise BadRequest(f"charset {charset!r} in the Content-Type header is not a text encoding") from None


#: Text codecs that are no charset of a body. punycode spells host names, and its decoder (pure Python) takes time
#: that grows with the square of its input: a body of 1 MB took 27 s of CPU, so one of 10 MB would take most of an
#: hour, in a worker thread that nothing stops. Every other codec of the standard library decodes 200 KB within
#: a few milliseconds here.
_NOT_FOR_BODIES = frozenset({"punycode"})

_JSON = JSONDecoder()
_TEXT = TextDecoder()
_BYTES = Decoder()

DECODERS: dict[str, Decoder] = {
    "application/json": _JSON,
    "text/plain": _TEXT,
}


def decoder_for(media_type: str) -> Decoder:
    """The decoder of a media type: exact match, then any ``+json`` type, else raw bytes."""
    decoder = DECODERS.get(media_type)
    if decoder is not None:
        return decoder
    if media_type.endswith("+json"):
        return _JSON
    return _BYTES


def decode_payload(content_type: str | None, body: bytes) -> Any:
    """Decode a request body according to its Content-Type header (a 400 `BadRequest` when it can't)."""
    known = _parsed.get(content_type)
    if known is None:
        media_type, params = parse_content_type(content_type)
        known = decoder_for(media_type), params
        if len(_parsed) < _PARSED_MAX:
            _parsed[content_type] = known
    decoder, params = known
    return decoder.decode(body, params)


# Clients send the same few Content-Type headers over and over: each is parsed once. Bounded, so that
# a client sending endless variations cannot grow it.
_parsed: dict[str | None, tuple[Decoder, dict[str, str]]] = {}
_PARSED_MAX = 256


def _numpy_default(value: Any) -> Any:
    # orjson encodes C-contiguous numeric arrays itself; this catches the rest (views, object arrays,
    # numpy types orjson does not know), pydantic models, and anything else fails with the type's name.
    # The module first: a missing attribute of a pydantic model costs ~4 us (its __getattr__ formats an error).
    if type(value).__module__ == "numpy":
        tolist = getattr(value, "tolist", None)
        if tolist is not None:
            return tolist()
    pydantic = sys.modules.get("pydantic")  # a pydantic model exists only if pydantic was imported
    if pydantic is not None:
        if isinstance(value, pydantic.BaseModel):
            return value.model_dump(mode="json")
        v1 = sys.modules.get("pydantic.v1")
        if v1 is not None and isinstance(value, v1.BaseModel):
            return orjson.loads(value.json())
    failure = EncodeError(value)
    _failures.last = failure  # older orjson drops this exception for its own: encode_json finds it here
    raise failure


# The EncodeError that _numpy_default raised last in this thread (read only on the error path).
_failures = threading.local()


_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def encode_json(value: Any) -> bytes:
    try:
        return orjson.dumps(value, default=_numpy_default, option=_JSON_OPTIONS)
    except orjson.JSONEncodeError as exc:
        kept, _failures.last = getattr(_failures, "last", None), None
        # Newer orjson chains the default's exception; older orjson replaces it with its own, so it was kept.
        cause = exc.__cause__ if isinstance(exc.__cause__, EncodeError) else kept
        if isinstance(cause, EncodeError):
            raise cause from None
        # A value orjson refuses without asking the default (an integer beyond 64 bits, say): named by its type.
        raise EncodeError(value) from exc


@dataclass(eq=False)
class Answer:
    """A result whose body is already encoded: what a backend returns when its user code's contract decides
    how a value is sent (Cortex sends a str as text/plain), so that no backend builds an HTTP response.

    `background` runs in a worker thread once the answer is sent (Cortex's ``(result, callback)`` and
    ``post_predict``): the HTTP exchange calls `start_background` after the send; `encode_result`, for the
    other callers (the jobs worker), once the body is encoded. The attribute names are a Starlette ``Response``'s, since
    Cortex's ``post_predict(response)`` reads them::

        Answer(b"setosa", "text/plain; charset=utf-8", background=[lambda: print("sent")])
    """

    body: bytes
    media_type: str
    background: list[Callable[[], Any]] = field(default_factory=list)
    #: Sent with 200, as every result is.
    status_code = 200

    @property
    def headers(self) -> dict[str, str]:
        return {"content-type": self.media_type, "content-length": str(len(self.body))}

    def start_background(self) -> None:
        """Hand the callbacks to a worker thread, in order; the caller does not wait for them."""
        if self.background:
            _threads.submit(_run_background, self.background)


def _run_background(callbacks: list[Callable[[], Any]]) -> None:
    """In a worker thread: an answer's callbacks in order (an async one on a loop of its own); a failure is
    logged and the next one still runs, as the answer has gone."""
    for callback in callbacks:
        try:
            outcome = callback()
            if inspect.isawaitable(outcome):
                asyncio.run(_awaited(outcome))
        except Exception:
            logger.exception("a callback run after the answer raised")


async def _awaited(outcome: Any) -> Any:
    return await outcome


def encode_result(value: Any) -> tuple[bytes, bytes]:
    """Encode a handler's result: (body, content-type). Raises `EncodeError` for unknown types.

    bytes are sent as they are (``application/octet-stream``); an `Answer` with its own media type (its
    background handed to a worker thread); anything else is JSON, a str included::

        encode_result("iris-setosa") == (b'"iris-setosa"', b"application/json")
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), BYTES_TYPE
    if type(value) is Answer:
        value.start_background()
        return value.body, value.media_type.encode("latin-1")
    return encode_json(value), JSON_TYPE


#: Deallocated this many elements at a time by `release_in_pieces`.
_PIECE = 16384


def release_in_pieces(value: Any, depth: int = 0) -> None:
    """Drop a large decoded value (in a worker thread) a piece at a time: a list of a million floats is freed by
    one deallocation that holds the GIL for about 10 ms, during which the event loop cannot run. Only lists and
    dicts that nothing else refers to are taken apart (user code may have kept a part: that part is left whole).
    """
    # Two references when nobody else holds `value`: this call's argument, and getrefcount's.
    if depth > 64 or sys.getrefcount(value) > 2:
        return
    if type(value) is list:
        while value:
            last = value[-1]
            if type(last) is list or type(last) is dict:
                del last
                release_in_pieces(value.pop(), depth + 1)
            else:
                del last
                del value[-_PIECE:]
    elif type(value) is dict:
        while value:
            release_in_pieces(value.popitem()[1], depth + 1)
