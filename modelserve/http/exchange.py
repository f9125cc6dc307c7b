"""One HTTP exchange: the steps that every call of an API over HTTP shares, written once, around a spec.

A spec is a wire protocol's part of a request (the realtime route in `modelserve.http.realtime`, V2's infer
in `modelserve.http.v2`, the job routes in `modelserve.http.jobs`): which headers it reads (`read_head`),
how the body becomes the value its API is called with (`decode`), and how the result becomes an answer
(`encode`); where it has none of its own, the codecs decide (by Content-Type in, JSON, bytes or a stream
out: the native wire format). A spec subclasses `Exchange`; the exchange does everything else, in one
coroutine, in order:

1. the headers and the request context (`modelserve.context.current`, which log lines and user code read);
2. admission before the body: a declared length over ``max_body_size`` is a 413, and the API's line
   (`Api.admit`) refuses a request that could not wait before a byte of its body is read;
3. the body (`read_body`), decoded inline or, when longer than `DECODE_INLINE_MAX`, in a worker thread (where
   a refused decode's half-decoded values are freed too, `_threads.freed_on_failure`); and a Starlette
   `Request` that replays it, when a stage of the API takes the request;
4. the call: `Api.call`, cancelled when the client disconnects (`Disconnected`), counted from the moment
   the transport first saw the request (`ARRIVED`);
5. a value decoded from a large body freed a piece at a time in a worker thread, never on the loop;
6. the answer: sent whole, or by its own sender (a stream, a user's Response);
7. any failure through the one error map (`modelserve.http.errors`), a refusal because the line was full
   marked for the transport's pause (`mark_refused`), and a request that the server's shutdown stopped
   answered with one JSON 503 (`SHUTTING_DOWN`) on every route;
8. the API's metrics and the access line.

A spec's routes (its module's ``routes(server)``, registered in `modelserve.http.specs`) run the exchange
as a method made by `exchange_route`, whose function is the spec's own, so that the route table, the API
keys and the OpenAPI document can tell the routes apart::

    class Shout(Exchange):
        def decode(self, body, head, ctx):
            return {"text": body.decode()}

        def encode(self, result, value, head, ctx):
            return result["text"].upper().encode(), TEXT_TYPE, None

        post = exchange_route()

The hooks are plain functions, never coroutines, and the codecs run in line rather than behind a hook: the
exchange is the request's only coroutine between the route table and `Api.call`, and the native route calls
nothing the route it replaced did not (a coroutine more costs about 0.3 us, 3% of a small model's request
served in-process, and a call about 1.5%: `benchmarks/asgi_overhead.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import types
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any, TypeVar

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
from modelserve.codecs import Answer as Encoded
from modelserve.context import RequestContext, current
from modelserve.errors import EncodeError, ServiceUnavailable, StreamAborted, UserCodeError
from modelserve.http._asgi import (
    ANSWERING,
    ARRIVALS,
    ARRIVED,
    CLOSE,
    ORDER,
    Disconnected,
    check_length,
    header,
    mark_refused,
    read_body,
    request_headers,
    send_body,
    with_answering,
)
from modelserve.http.errors import send_error
from modelserve.http.streaming import send_stream
from modelserve.logs import access_writer

logger = logging.getLogger("modelserve")

#: What a spec reads of a request's line and headers: (request id, content type, content length, the spec's
#: own: the realtime route's Accept, V2's other headers, a job's id from the path).
Head = tuple[str, str | None, str | None, Any]
#: An answer that is not sent whole: sends itself, returns its status (a stream, a user's Response).
Sender = Callable[[Scope, Receive, Send], Awaitable[int]]
#: What `Exchange.encode` returns: (body, content type, more headers or None), sent with 200; a JSON body alone
#: (bytes); or a `Sender`.
Answer = bytes | tuple[bytes, bytes, list[tuple[bytes, bytes]] | None] | Sender

#: The one answer to a request that the server's shutdown stopped after its grace period, on every route.
SHUTTING_DOWN = "the server is shutting down; retry later"

_Method = TypeVar("_Method", bound=Callable[..., Any])


def writes_access_line(method: _Method) -> _Method:
    """Marks a route method that runs an exchange: it writes its own access line, at the end of the exchange,
    so the route table leaves it unwrapped (`modelserve.http.app`)."""
    method.writes_access_line = True  # type: ignore[attr-defined]
    return method


def exchange_route() -> Callable[[Any, Scope, Receive, Send], Coroutine[Any, Any, None]]:
    """The exchange as a route method of a spec (``post = exchange_route()``): a function of its own with the
    code of `Exchange.exchange`, so that the route table, the API keys and the OpenAPI document tell each
    spec's routes apart by their function, with no call on the request's path but the exchange's own (a
    method that returns ``self.exchange(...)`` costs a call more: about 0.5% of a small model's request
    served in-process, `benchmarks/asgi_overhead.py`)."""
    run = Exchange.exchange
    # A code object of its own too: Python 3.11 keeps what it learns while running a function (the types of
    # `self` and of the attributes it reads) in its code object, which routes of two specs would take from each
    # other on every request.
    code = run.__code__.replace()
    route = types.FunctionType(code, run.__globals__, run.__name__, run.__defaults__, run.__closure__)
    route.__doc__ = run.__doc__
    route.honours_answering = True  # type: ignore[attr-defined]  # every answer it sends: `ANSWERING`
    return writes_access_line(route)


class Exchange:
    """The shared steps of an HTTP request to one API; a spec subclasses it and fills in the hooks below."""

    #: Decode every body (V2 checks each request against the model; a job's payload is checked when it is
    #: submitted), or, when False, only when a stage takes the inputs: an API whose stages take the request
    #: alone accepts any body on the realtime route.
    always_decode = True
    #: Bodies longer than this are decoded, and their values freed, in a worker thread.
    inline_max = DECODE_INLINE_MAX
    #: Undoes what the transport wrapped the body in before it is decoded (V2's Content-Encoding); None: nothing.
    #: Returns the body, or the work that makes it (a function of no arguments), which runs in a worker thread:
    #: inflating a compressed body takes longer than parsing it (a 10 MiB JSON body out of gzip: 40-90 ms).
    prepare: Callable[[bytes, Head], bytes | Callable[[], bytes]] | None = None

    def __init__(self, api: Api) -> None:
        self.api = api
        self.name = api.name
        self.access_log = access_writer()
        #: Before the body is read, ``admit(size)`` takes a place in the API's line (or refuses, 503), and
        #: ``unadmit(size)`` gives it back when the request will not call; then
        #: ``await call(value, ctx, request=, cancelled=, admitted=, since=)``. None: the API's own (`Api.admit`,
        #: `Api.unadmit`, `Api.call`). A spec that calls otherwise sets its own (V2 asks `Api.call` for a model
        #: file's tensor entry; a job is stored instead). The API's are called as its methods rather than held
        #: here as bound methods, which Python 3.11 calls slower (a request served in-process: ~1,400 machine
        #: instructions of ~80,000, counted by callgrind).
        self.admit: Callable[[int], None] | None = None
        self.unadmit: Callable[[int], None] | None = None
        self.call: Callable[..., Awaitable[Any]] | None = None
        # Held by the instance, as the hooks above: the exchange reads them on every request, and Python 3.11
        # specialises the lookup of an instance's attribute, not of a class's attribute read through an instance
        # or of a static method (measured in one process, the exchange against the realtime route it replaced:
        # 1.10x its time with them on the class, 1.02x on the instance).
        for name in _PER_REQUEST:
            setattr(self, name, getattr(self, name))

    # ------------------------------------------------------------------------------------------------
    # the spec's part

    #: The request id and the headers the spec reads, in one pass over them (by default the request id,
    #: Content-Type, Content-Length and Accept).
    read_head: Callable[[Scope], Head] = staticmethod(request_headers)

    #: ``decode(body, head, ctx)``: the value the API is called with, or a 4xx (`modelserve.errors`) for a body
    #: the spec refuses; it runs in a worker thread for a body longer than `inline_max`. None: the body is
    #: decoded by its Content-Type (``head[1]``, `codecs.decode_payload`), as the native routes take it.
    decode: Callable[[bytes, Head, RequestContext], Any] | None = None
    #: ``encode(result, value, head, ctx)``: the answer to `result` (`Answer`); `value` is what `decode` gave.
    #: None: a dict is sent as JSON, a `Stream` streamed (framed by the Accept in ``head[3]``,
    #: `modelserve.http.streaming`), a Starlette Response as it is, anything else by `codecs.encode_result`.
    encode: Callable[[Any, Any, Head, RequestContext], Any] | None = None

    # ------------------------------------------------------------------------------------------------
    # the exchange

    async def exchange(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one request (see the module's docstring for the steps)."""
        started = time.perf_counter()
        read_head = self.read_head  # loaded as an attribute, which 3.11 specialises (as a method it does not)
        head = read_head(scope)
        ctx = RequestContext(self.name, head[0])
        token = current.set(ctx)
        api = self.api
        answering = scope.get(ANSWERING)  # the headers a server span adds to the answer (`ANSWERING`), or None
        # One coroutine for the whole request, its error answers included: a frame less on every request.
        try:
            limit = api.config.max_body_size
            length = head[2]
            # The server's HTTP parser refuses a Content-Length of anything but ASCII digits.
            size = int(length) if length is not None and length.isdigit() else 0
            if size > limit:
                check_length(limit, length)  # PayloadTooLarge, and the connection closed
            admit = self.admit
            try:
                if admit is None:
                    api.admit(size)
                else:
                    admit(size)
            except ServiceUnavailable as exc:
                # Rather than reading a large body only to drop it, or a chunked one, which may be as long as the
                # client likes (its length is not known: a request that has none would have said 0).
                if size > self.inline_max or (length is None and header(scope, b"transfer-encoding") is not None):
                    exc.headers.update(CLOSE)
                raise
            try:
                body = await read_body(receive, limit, None)
                if length is None and body and admit is None:
                    # A chunked body: its bytes count in max_queued_bytes once read (unknown when it was admitted).
                    size = len(body)
                    api.limiter.count(size)
                # Requests parsed after this one while it waited for the loop: the server is busy (`Api.call`;
                # known before decoding, which a spec may leave to the call's worker thread then, as V2 does).
                order = scope.get(ORDER)
                if order is not None and ARRIVALS.count > order:
                    ctx.crowded = True
                if self.prepare is not None:
                    prepared = self.prepare(body, head)
                    body = prepared if isinstance(prepared, bytes) else await _threads.run_sync(prepared)
                pipeline = api.backend.pipeline
                value = None
                if pipeline.needs_inputs or self.always_decode:
                    decode = self.decode
                    if len(body) > self.inline_max:
                        # A refused decode's half-decoded values are freed in the thread too (`freed_on_failure`).
                        freed_on_failure = _threads.freed_on_failure
                        if decode is None:
                            value = await _threads.run_sync(freed_on_failure, decode_payload, head[1], body)
                        else:
                            value = await _threads.run_sync(freed_on_failure, decode, body, head, ctx)
                    elif decode is None:  # the codecs in line, not behind a hook: a call less (1.5%, as below)
                        value = decode_payload(head[1], body)
                    else:
                        value = decode(body, head, ctx)
                request = replayed_request(scope, body, ctx) if pipeline.needs_request else None
            except BaseException:
                unadmit = self.unadmit
                if unadmit is None:
                    api.unadmit(size)
                else:
                    unadmit(size)
                raise
            call = self.call
            cancelled = Disconnected(receive, scope)
            if call is None:
                result = await api.call(
                    value, ctx, request=request, cancelled=cancelled, admitted=size, since=scope.get(ARRIVED)
                )
            else:
                result = await call(
                    value, ctx, request=request, cancelled=cancelled, admitted=size, since=scope.get(ARRIVED)
                )
            encode = self.encode
            if encode is None and type(result) is dict:  # the usual answer, in line: a call less (1.5%, as above)
                try:
                    answer: Any = encode_json(result)
                except EncodeError as exc:
                    raise self._not_encoded(ctx, exc) from None
            elif encode is None:
                answer = self._answer(result, head, ctx)
            else:
                answer = encode(result, value, head, ctx)
            if value is not None and len(body) > self.inline_max:
                # A large value is freed in a worker thread, a piece at a time, rather than on the loop.
                box, value = [value], None
                _threads.submit(_release, box)
            if type(answer) is bytes:
                extra = None if answering is None else answering(200, ctx.request_id)
                await send_body(send, 200, answer, JSON_TYPE, ctx.request_id, extra)
                status = 200
            elif type(answer) is tuple:
                extra = answer[2]
                if answering is not None:
                    extra = [*(extra or ()), *answering(200, ctx.request_id)]
                await send_body(send, 200, answer[0], answer[1], ctx.request_id, extra)
                status = 200
            elif answering is None:
                status = await answer(scope, receive, send)
            else:
                status = await answer(scope, receive, with_answering(send, answering, ctx.request_id))
        except asyncio.CancelledError:
            if answering is not None:
                send = with_answering(send, answering, ctx.request_id)
            status = await self._stopped(send, ctx.request_id)
        except StreamAborted as aborted:
            # The answer has begun: the server ends it without a clean end (the failure logged once, in the
            # stream); counted, and written in the access log, with the status of what ended it.
            seconds = time.perf_counter() - started
            api.metrics.answered(aborted.status, seconds)
            if self.access_log is not None:
                self.access_log(scope, aborted.status, seconds, ctx.request_id, self.name)
            raise
        except Exception as exc:
            mark_refused(scope, exc)
            if answering is not None:
                send = with_answering(send, answering, ctx.request_id)
            status = await send_error(send, exc, ctx.request_id)
        finally:
            current.reset(token)
        seconds = time.perf_counter() - started
        api.metrics.answered(status, seconds)
        if self.access_log is not None:
            self.access_log(scope, status, seconds, ctx.request_id, self.name)

    def _answer(self, result: Any, head: Head, ctx: RequestContext) -> Any:
        """The answer to a result other than a dict, when the spec has no `encode`."""
        if isinstance(result, Stream):
            return partial(_send_stream, result, head[3])
        if isinstance(result, Response):
            return partial(_send_response, result, ctx.request_id)
        if type(result) is Encoded:
            return partial(_send_encoded, result, ctx.request_id)
        try:
            body, content_type = encode_result(result)
        except EncodeError as exc:
            raise self._not_encoded(ctx, exc) from None
        return body, content_type, None

    def _not_encoded(self, ctx: RequestContext, exc: EncodeError) -> UserCodeError:
        """A result that cannot be encoded is the user's failure (a 500), logged once."""
        error = UserCodeError("encoding the result", exc)
        log_user_error(self.name, ctx, error)
        return error

    async def _stopped(self, send: Send, request_id: str) -> int:
        """The server's shutdown cancelled the request after its grace period: answer a JSON 503 (the server's
        own answer would be a plain-text 500) and end the request quietly."""
        logger.warning("api '%s': request %s stopped by the server's shutdown (503)", self.name, request_id)
        try:
            return await send_error(send, ServiceUnavailable(SHUTTING_DOWN), request_id)
        except Exception:  # the answer had begun, or the connection is gone
            return 503


#: The spec's attributes the exchange reads on every request (see `Exchange.__init__`).
_PER_REQUEST = ("always_decode", "inline_max", "prepare", "read_head", "decode", "encode")


async def _send_stream(stream: Stream, accept: str | None, scope: Scope, receive: Receive, send: Send) -> int:
    return await send_stream(send, stream, accept)


async def _send_response(response: Response, request_id: str, scope: Scope, receive: Receive, send: Send) -> int:
    response.headers["x-request-id"] = request_id
    await response(scope, receive, send)
    return response.status_code


async def _send_encoded(encoded: Encoded, request_id: str, scope: Scope, receive: Receive, send: Send) -> int:
    """A backend's encoded answer, then its callbacks (Cortex runs them after the response is sent)."""
    await send_body(send, 200, encoded.body, encoded.media_type.encode("latin-1"), request_id)
    encoded.start_background()
    return 200


def _release(box: list[Any]) -> None:
    """In a worker thread: free the value in `box`, which holds the only reference the request had to it."""
    release_in_pieces(box.pop())


def replayed_request(scope: Scope, body: bytes, ctx: RequestContext) -> Request:
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
