"""Streamed answers: each chunk of an API's `Stream` is sent as soon as it is produced.

Framing, decided per chunk: ``str`` as UTF-8, ``bytes`` as they are, anything else as one JSON document per
line (NDJSON). With ``Accept: text/event-stream`` every chunk becomes a server-sent event instead; with
``Accept: application/json`` (and no stream type accepted) the chunks are collected into one JSON answer, as
Truss does: strings joined into one string, other chunks as a list.

An error in the middle of a stream is never a clean end: plain streams are aborted (the client sees a broken
chunked body), SSE streams end with an ``event: error`` carrying the usual error body. The failure is logged
once, where it happened (`Api.call`'s `Stream`); the server's own "Exception in ASGI application" line for
the abort is filtered out (`quiet_aborts`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.types import Send

from modelserve.api import Stream
from modelserve.codecs import BYTES_TYPE, JSON_TYPE, TEXT_TYPE, encode_json
from modelserve.errors import StreamAborted
from modelserve.http._asgi import send_body
from modelserve.http.errors import render, send_error

NDJSON_TYPE = b"application/x-ndjson"
SSE_TYPE = b"text/event-stream"


def frame(chunk: Any) -> bytes:
    if isinstance(chunk, str):
        return chunk.encode("utf-8")
    if isinstance(chunk, (bytes, bytearray, memoryview)):
        return bytes(chunk)
    return encode_json(chunk) + b"\n"


def frame_sse(chunk: Any) -> bytes:
    if isinstance(chunk, (bytes, bytearray, memoryview)):
        text = bytes(chunk).decode("utf-8", errors="replace")
    elif isinstance(chunk, str):
        text = chunk
    else:
        text = encode_json(chunk).decode("utf-8")
    if "\r" in text:
        # An event stream ends a line at CR, LF or CRLF: a CR left inside a data line would end it there, and the
        # client would read what follows as a field of its own (and drop it).
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return b"".join(b"data: " + line.encode("utf-8") + b"\n" for line in text.split("\n")) + b"\n"


def content_type_of(chunk: Any) -> bytes:
    if isinstance(chunk, str):
        return TEXT_TYPE
    if isinstance(chunk, (bytes, bytearray, memoryview)):
        return BYTES_TYPE
    return NDJSON_TYPE


def wants_whole_json(accept: str | None) -> bool:
    """``Accept: application/json`` without any streaming type: the client wants one JSON document."""
    if not accept or "application/json" not in accept:
        return False
    return not any(kind in accept for kind in ("text/event-stream", "application/x-ndjson", "text/plain", "*/*"))


async def send_stream(send: Send, stream: Stream, accept: str | None) -> int:
    """Send a stream's chunks as they come; returns the status for the access log and the metrics."""
    if wants_whole_json(accept):
        return await _send_collected(send, stream)
    sse = accept is not None and "text/event-stream" in accept
    request_id = stream.ctx.request_id
    started = False
    try:
        chunk = await stream.next()
        headers = [
            (b"content-type", SSE_TYPE if sse else TEXT_TYPE if chunk is Stream.END else content_type_of(chunk)),
            (b"x-request-id", request_id.encode()),
            (b"cache-control", b"no-cache"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        started = True
        encode = frame_sse if sse else frame
        while chunk is not Stream.END:
            data = encode(chunk)
            if data:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            chunk = await stream.next()
        if stream.watch.fired:  # on_disconnect: notify: the client left, and the generator then stopped by itself
            raise stream.api.cancelled(stream.ctx)
        stream.watch.disarm()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return 200
    except (Exception, asyncio.CancelledError) as caught:
        error: Exception
        if isinstance(caught, asyncio.CancelledError):
            # Cancelled while a chunk waited to be sent (the client had stopped reading): by the stream's watch
            # (the client left, the timeout passed), its 499 or 504 as while it waits for a chunk; by anything
            # else (the server's shutdown), on it goes.
            if not stream.watch.fired:
                raise
            stream.watch.absorb_cancel()
            error = stream.api.cancelled(stream.ctx)
        else:
            error = caught
        stream.watch.disarm()
        if not started:
            return await send_error(send, error, request_id)
        status, body, _ = render(error, request_id)
        if sse:
            await send({"type": "http.response.body", "body": b"event: error\ndata: " + body + b"\n\n"})
            return status
        raise StreamAborted(f"stream of request {request_id} failed", status) from None
    finally:
        await stream.aclose()


async def _send_collected(send: Send, stream: Stream) -> int:
    chunks: list[Any] = []
    try:
        while (chunk := await stream.next()) is not Stream.END:
            chunks.append(chunk)
        if stream.watch.fired:  # as in `send_stream`
            raise stream.api.cancelled(stream.ctx)
        stream.watch.disarm()
        if chunks and all(isinstance(chunk, str) for chunk in chunks):
            value: Any = "".join(chunks)
        elif chunks and all(isinstance(chunk, (bytes, bytearray)) for chunk in chunks):
            value = b"".join(chunks).decode("utf-8", errors="replace")
        else:
            value = chunks
        await send_body(send, 200, encode_json(value), JSON_TYPE, stream.ctx.request_id)
        return 200
    except Exception as error:
        stream.watch.disarm()
        return await send_error(send, error, stream.ctx.request_id)
    finally:
        await stream.aclose()


def _keep_unless_abort(record: logging.LogRecord) -> bool:
    if record.exc_info:
        return not isinstance(record.exc_info[1], StreamAborted)
    return _ABORTED not in str(record.msg)  # granian writes the exception's traceback into the message


#: How a `StreamAborted` raised by `send_stream` ends a traceback written as text.
_ABORTED = "StreamAborted: stream of request "


#: The loggers where the server logs an exception the app raised: uvicorn's, and granian's (its Rust side logs
#: "Application callable raised an exception" there, at ERROR).
_SERVER_ERROR_LOGGERS = ("uvicorn.error", "_granian.utils")


def quiet_aborts() -> None:
    """Keep the server (uvicorn or granian) from logging a second, traceback-only line for a stream we aborted on
    purpose: its failure is logged once already, and a client that leaves mid-stream is no error."""
    for name in _SERVER_ERROR_LOGGERS:
        error_logger = logging.getLogger(name)
        if _keep_unless_abort not in error_logger.filters:
            error_logger.addFilter(_keep_unless_abort)
