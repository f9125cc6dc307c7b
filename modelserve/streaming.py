"""Streaming answers: a predict that yields sends each chunk as soon as it is produced.

Framing, decided per chunk: ``str`` as UTF-8, ``bytes`` as they are, anything else as one JSON document per
line (NDJSON). With ``Accept: text/event-stream`` every chunk becomes a server-sent event instead.

Sync generators are advanced in the thread pool, never on the event loop. When the client leaves, the
generator is closed (``aclose()`` / ``close()``) so that its ``finally`` runs. An error in the middle of a
stream is never a clean end: plain streams are aborted (the client sees a broken chunked body), SSE streams
end with an ``event: error``.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any

from modelserve._http import send_error
from modelserve.codecs import BYTES_TYPE, TEXT_TYPE, EncodeError, encode_json
from modelserve.context import RequestContext
from modelserve.errors import UserCodeError, error_body
from modelserve.pipeline import run_in_thread

if TYPE_CHECKING:
    from starlette.types import Send

    from modelserve.watch import Watch

logger = logging.getLogger("modelserve")

NDJSON_TYPE = b"application/x-ndjson"
SSE_TYPE = b"text/event-stream"
_END = object()


class StreamAborted(Exception):
    """Raised to the server after a failed stream, so that it ends the response without a clean end."""


def is_stream(value: Any) -> bool:
    return inspect.isgenerator(value) or inspect.isasyncgen(value)


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
    return b"".join(b"data: " + line.encode("utf-8") + b"\n" for line in text.split("\n")) + b"\n"


def content_type_of(chunk: Any) -> bytes:
    if isinstance(chunk, str):
        return TEXT_TYPE
    if isinstance(chunk, (bytes, bytearray, memoryview)):
        return BYTES_TYPE
    return NDJSON_TYPE


class _Chunks:
    """Pulls chunks from a sync or async generator; sync ones are advanced in a worker thread."""

    def __init__(self, gen: Any, ctx: RequestContext) -> None:
        self.gen = gen
        self.ctx = ctx
        self.is_async = inspect.isasyncgen(gen)

    def _step(self) -> Any:
        try:
            return next(self.gen)
        except StopIteration:
            return _END

    async def next(self) -> Any:
        if self.is_async:
            try:
                return await self.gen.__anext__()
            except StopAsyncIteration:
                return _END
        return await run_in_thread(self._step, ctx=self.ctx, on_abandon=self.gen.close)

    async def close(self) -> None:
        if self.is_async:
            await self.gen.aclose()
            return
        try:
            self.gen.close()
        except ValueError:
            pass  # still running in its worker thread, which closes it when next() returns


async def send_stream(send: Send, gen: Any, ctx: RequestContext, watch: Watch, accept: str | None) -> int:
    """Send a generator's chunks as they come; returns the status for the access metrics."""
    sse = accept is not None and "text/event-stream" in accept
    chunks = _Chunks(gen, ctx)
    started = False
    try:
        chunk = await chunks.next()
        if chunk is _END:
            chunk = ""
        content_type = SSE_TYPE if sse else content_type_of(chunk)
        headers = [
            (b"content-type", content_type),
            (b"x-request-id", ctx.request_id.encode()),
            (b"cache-control", b"no-cache"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        started = True
        encode = frame_sse if sse else frame
        while chunk is not _END:
            data = encode(chunk)
            if data:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            chunk = await chunks.next()
        watch.disarm()
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return 200
    except Exception as error:
        logger.error(
            "api '%s': the stream failed after %s: %s: %s",
            ctx.api,
            "it started" if started else "no chunk",
            type(error).__name__,
            error,
            exc_info=error if not isinstance(error, EncodeError) else None,
        )
        watch.disarm()
        if not started:
            await send_error(send, 500, UserCodeError.default_message, ctx.request_id)
            return 500
        if sse:
            payload = error_body(UserCodeError.default_message, ctx.request_id)
            await send({"type": "http.response.body", "body": b"event: error\ndata: " + payload + b"\n\n"})
            return 500
        raise StreamAborted(f"stream of request {ctx.request_id} failed") from None
    finally:
        await chunks.close()
