"""The realtime endpoint: ``POST /<api>`` runs the API, ``GET``/``HEAD /<api>`` describe it.

A raw ASGI handler (no Request/Response objects on the fast path): read the body, decode it only when a stage
takes the inputs, `Api.call`, encode the result. Every error answer goes through `modelserve.http.errors`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from modelserve import _threads
from modelserve.api import Api, Stream, log_user_error
from modelserve.codecs import (
    DECODE_INLINE_MAX,
    JSON_TYPE,
    decode_payload,
    encode_json,
    encode_result,
    release_in_pieces,
)
from modelserve.context import RequestContext, current
from modelserve.errors import EncodeError, ServiceUnavailable, StreamAborted, UserCodeError
from modelserve.http._asgi import (
    ARRIVED,
    CLOSE,
    Disconnected,
    check_length,
    mark_refused,
    read_body,
    request_headers,
    send_body,
    send_json,
)
from modelserve.http.errors import send_error
from modelserve.http.streaming import send_stream
from modelserve.logs import access_writer

logger = logging.getLogger("modelserve")


class RealtimeEndpoint:
    """The handlers of one realtime API's route, by method."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.name = api.name
        self.access_log = access_writer()

    async def get(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = request_headers(scope)[0]
        await send_json(send, 200, self.api.describe(), request_id)

    async def post(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        request_id, content_type, content_length, accept = request_headers(scope)
        ctx = RequestContext(self.name, request_id)
        token = current.set(ctx)
        api = self.api
        # One coroutine for the whole request (the work and its error answers): a frame less on every request.
        try:
            # Admission before work: a request that will be refused is refused before its body is read.
            limit = api.config.max_body_size
            size = int(content_length) if content_length is not None and content_length.isdigit() else 0
            if size > limit:
                check_length(limit, content_length)  # raises PayloadTooLarge
            try:
                api.admit(size)
            except ServiceUnavailable as exc:
                if size > DECODE_INLINE_MAX:
                    exc.headers.update(CLOSE)  # rather than reading a large body only to drop it
                raise
            try:
                pipeline = api.backend.pipeline
                body = await read_body(receive, limit, None)
                value = None
                if pipeline.needs_inputs:
                    if len(body) > DECODE_INLINE_MAX:
                        value = await _threads.run_sync(decode_payload, content_type, body)
                    else:
                        value = decode_payload(content_type, body)
                request = _request_with_body(scope, body, ctx) if pipeline.needs_request else None
            except BaseException:
                api.unadmit(size)
                raise
            cancelled = Disconnected(receive, scope)
            since = scope.get(ARRIVED)
            result = await api.call(value, ctx, request=request, cancelled=cancelled, admitted=size, since=since)
            if len(body) > DECODE_INLINE_MAX and value is not None:
                # A large value is freed in a worker thread, a piece at a time, rather than on the loop.
                box, value = [value], None
                _threads.submit(_release, box)
            if type(result) is dict:  # the usual result, encoded here: a frame less
                try:
                    encoded = encode_json(result)
                except EncodeError as exc:
                    raise self._encode_failed(ctx, exc) from None
                await send_body(send, 200, encoded, JSON_TYPE, request_id)
                status = 200
            else:
                status = await self._answer(scope, receive, send, ctx, result, accept)
        except asyncio.CancelledError:
            # The server's shutdown cancelled us after its grace period: answer a JSON 503 (the server's own
            # answer would be a plain-text 500) and end the request quietly.
            logger.warning("api '%s': request %s stopped by the server's shutdown (503)", self.name, request_id)
            stopped = ServiceUnavailable("the server is shutting down; retry later")
            try:
                status = await send_error(send, stopped, request_id)
            except Exception:  # the answer had begun, or the connection is gone
                status = 503
        except StreamAborted:
            raise  # the answer has begun: the server ends it without a clean end (logged once, in the stream)
        except Exception as exc:
            mark_refused(scope, exc)
            status = await send_error(send, exc, request_id)
        finally:
            current.reset(token)
        seconds = time.perf_counter() - started
        api.metrics.answered(status, seconds)
        if self.access_log is not None:
            self.access_log(scope, status, seconds, request_id, self.name)

    async def _answer(
        self, scope: Scope, receive: Receive, send: Send, ctx: RequestContext, result: Any, accept: str | None
    ) -> int:
        """Send a result other than a dict: a stream, a user's Response, or any other encodable value."""
        if isinstance(result, Stream):
            return await send_stream(send, result, accept)
        if isinstance(result, Response):
            result.headers["x-request-id"] = ctx.request_id
            await result(scope, receive, send)
            return result.status_code
        try:
            body, content_type_out = encode_result(result)
        except EncodeError as exc:
            raise self._encode_failed(ctx, exc) from None
        await send_body(send, 200, body, content_type_out, ctx.request_id)
        return 200

    def _encode_failed(self, ctx: RequestContext, exc: EncodeError) -> UserCodeError:
        """A result that cannot be encoded is the user's failure (a 500), logged once."""
        error = UserCodeError("encoding the result", exc)
        log_user_error(self.name, ctx, error)
        return error


def _release(box: list[Any]) -> None:
    """In a worker thread: free the value in `box`, which holds the only reference the request had to it."""
    release_in_pieces(box.pop())


def _request_with_body(scope: Scope, body: bytes, ctx: RequestContext) -> Request:
    """A Starlette Request for user code: its receive replays the body already read, then reports a
    disconnect once the call is cancelled (so ``await request.is_disconnected()`` tells the truth)."""
    replayed = False

    async def receive() -> dict[str, Any]:
        nonlocal replayed
        if ctx.cancelled:
            return {"type": "http.disconnect"}
        # A checkpoint before the body: Request.is_disconnected() looks without waiting (its cancel scope is
        # cancelled before it awaits), so it is cancelled here instead of taking the body from request.body().
        await asyncio.sleep(0)
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        while not ctx.cancelled:
            await asyncio.sleep(_DISCONNECT_POLL)
        return {"type": "http.disconnect"}

    return Request(scope, receive)


#: How often a user's own ``await request.receive()`` looks for the end of its call (is_disconnected never waits).
_DISCONNECT_POLL = 0.05
