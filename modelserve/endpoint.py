"""The realtime endpoint: ``POST /<api>`` runs the API, ``GET /<api>`` describes it.

It is a raw ASGI app (no Request/Response objects on the fast path): it reads the body, decodes it only
when a stage takes the inputs, waits for a concurrency slot, runs the pipeline under a `Watch` (timeout and
client disconnect), and encodes the result.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from modelserve import streaming
from modelserve._http import ClientGone, read_body, request_headers, send_body, send_error, send_http_error, send_json
from modelserve.apis import Api
from modelserve.codecs import EncodeError, decode_payload, encode_result
from modelserve.context import RequestContext, current
from modelserve.errors import GatewayTimeout, HTTPError, ServiceUnavailable, UserCodeError
from modelserve.limiter import QueueFull
from modelserve.logs import access_writer
from modelserve.pipeline import RequestCancelled, StageFailed
from modelserve.watch import Watch, Watchdog

logger = logging.getLogger("modelserve")

#: HTTP status logged for a request whose client went away (nginx's convention).
CLIENT_CLOSED = 499


class RealtimeEndpoint:
    """ASGI app of one realtime API."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.name = api.name
        self.watchdog = Watchdog()
        self.access_log = access_writer()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        request_id, content_type, content_length, accept = request_headers(scope)
        if scope["method"] == "GET":
            await send_json(send, 200, self.api.describe(), request_id)
            return
        try:
            status = await self._serve(scope, receive, send, request_id, content_type, content_length, accept)
        except Exception as exc:
            # A bug of ours: answer a 500 as Starlette's error middleware would (this endpoint is called
            # directly, without it), unless the response has begun; then the server closes the connection.
            logger.error("api '%s': unexpected error: %r", self.name, exc, exc_info=exc)
            try:
                await send_http_error(send, HTTPError(), request_id)
            except Exception:
                raise exc from None
            status = 500
        seconds = time.perf_counter() - started
        self.api.metrics.answered(status, seconds)
        if self.access_log is not None:
            self.access_log(scope, status, seconds, request_id, self.name)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        request_id: str,
        content_type: str | None,
        content_length: str | None,
        accept: str | None,
    ) -> int:
        api = self.api
        ctx = RequestContext(self.name, request_id)
        token = current.set(ctx)
        try:
            if not api.ready:
                raise self._not_ready()
            pipeline = api.backend.pipeline
            body = await read_body(receive, api.config.max_body_size, content_length)
            value = decode_payload(content_type, body) if pipeline.needs_inputs else None
            request = None
            if pipeline.needs_request:
                request = Request(scope, receive, send)
                request._body = body
            return await self._run(scope, receive, send, ctx, value, request, accept)
        except HTTPError as exc:
            if isinstance(exc, QueueFull):
                api.metrics.queue_full.inc()
            await send_http_error(send, exc, request_id)
            return exc.status_code
        except ClientGone:
            return CLIENT_CLOSED
        finally:
            current.reset(token)

    def _not_ready(self) -> ServiceUnavailable:
        if self.api.state == "failed":
            return ServiceUnavailable(f"api '{self.name}' failed to load; see the server log", retry_after=30)
        return ServiceUnavailable(f"api '{self.name}' is loading; retry later")

    async def _run(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        ctx: RequestContext,
        value: Any,
        request: Request | None,
        accept: str | None,
    ) -> int:
        api = self.api
        limiter = api.limiter
        watch = Watch(self.watchdog, ctx, receive, api.config.timeout)
        acquired = answering = False
        try:
            await limiter.acquire()
            acquired = True
            ctx.release_slot = limiter.release
            result = await api.backend.pipeline.run(value, request, ctx)
            answering = True
            if streaming.is_stream(result):
                watch.watch_now()
                return await streaming.send_stream(send, result, ctx, watch, accept)
            watch.disarm()
            return await self._answer(scope, receive, send, ctx, result)
        except (asyncio.CancelledError, RequestCancelled):
            if not watch.fired():
                if not answering:
                    await self._stopped(send, ctx)
                raise
            watch.absorb_cancel()
            return await self._cancelled(send, ctx)
        except StageFailed as exc:
            watch.disarm()
            logger.error(
                "api '%s': %s raised %s: %s",
                self.name,
                exc.stage,
                type(exc.error).__name__,
                exc.error,
                exc_info=exc.error,
            )
            await send_http_error(send, UserCodeError(), ctx.request_id)
            return 500
        except HTTPException as exc:
            watch.disarm()
            await send_error(send, exc.status_code, str(exc.detail), ctx.request_id, dict(exc.headers or {}))
            return exc.status_code
        finally:
            watch.disarm()
            if acquired and ctx.leave():
                limiter.release()

    async def _cancelled(self, send: Send, ctx: RequestContext) -> int:
        reason = ctx.reason or "disconnect"
        self.api.metrics.cancelled(reason)
        if reason == "timeout":
            timeout = self.api.config.timeout
            logger.warning("api '%s': request timed out after %s s (504)", self.name, timeout)
            await send_http_error(
                send, GatewayTimeout(f"request took longer than the timeout of {timeout} s"), ctx.request_id
            )
            return 504
        logger.info("api '%s': client disconnected; request cancelled (%d)", self.name, CLIENT_CLOSED)
        return CLIENT_CLOSED

    async def _stopped(self, send: Send, ctx: RequestContext) -> None:
        """Cancelled by the server (the grace period of a shutdown has passed): a JSON 503 rather than the
        server's own plain-text 500, then the cancellation goes on."""
        logger.warning("api '%s': request stopped by the server's shutdown (503)", self.name)
        try:
            await send_http_error(send, ServiceUnavailable("the server is shutting down; retry later"), ctx.request_id)
        except Exception:  # the connection is gone already
            pass

    async def _answer(self, scope: Scope, receive: Receive, send: Send, ctx: RequestContext, result: Any) -> int:
        if isinstance(result, Response):
            result.headers["x-request-id"] = ctx.request_id
            await result(scope, receive, send)
            return result.status_code
        try:
            body, content_type = encode_result(result)
        except EncodeError as exc:
            logger.error("api '%s': the result could not be encoded: %s", self.name, exc)
            await send_http_error(send, UserCodeError(), ctx.request_id)
            return 500
        await send_body(send, 200, body, content_type, ctx.request_id)
        return 200
