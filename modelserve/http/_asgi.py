"""Raw ASGI helpers of the HTTP edge: read the headers and the body, send a whole answer, wait for a disconnect."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import Receive, Scope, Send

from modelserve.codecs import JSON_TYPE, encode_json
from modelserve.context import new_request_id, sane_request_id
from modelserve.errors import ClientDisconnected, PayloadTooLarge, QueueFull


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            decoded: str = value.decode("latin-1")
            return decoded
    return None


def request_headers(scope: Scope) -> tuple[str, str | None, str | None, str | None]:
    """(request id, content-type, content-length, accept) from one pass over the headers."""
    request_id = content_type = content_length = accept = None
    for key, value in scope["headers"]:
        if key == b"content-type":
            content_type = value.decode("latin-1")
        elif key == b"content-length":
            content_length = value.decode("latin-1")
        elif key == b"x-request-id":
            request_id = value.decode("latin-1")
        elif key == b"accept":
            accept = value.decode("latin-1")
    return (
        sane_request_id(request_id) if request_id is not None else new_request_id(),
        content_type,
        content_length,
        accept,
    )


#: The scope key of a request refused because its API's line was full, set to the `time.monotonic()` of the
#: refusal: the transport reads the connection's next request no sooner than a moment after it
#: (`modelserve.http._protocol`), so that a client resending at once cannot take the loop's turns from the calls
#: in flight.
REFUSED = "modelserve.refused"
#: The scope key of a request that the transport held back that way: the `time.monotonic()` at which its first
#: bytes came. Its wait in the line counts from then.
ARRIVED = "modelserve.arrived"
#: The scope key of a request's number among the requests modelserve's own protocol parsed (`ARRIVALS.count`
#: then). Requests parsed later, before its call begins, show that the server is busy (`Api.call`'s `crowded`).
ORDER = "modelserve.order"


class Arrivals:
    """How many requests modelserve's protocol has parsed in this process (`ORDER`)."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


ARRIVALS = Arrivals()


def mark_refused(scope: Scope, exc: BaseException) -> None:
    """Mark `scope` when `exc` refuses its request because the line was full."""
    if isinstance(exc, QueueFull):
        scope[REFUSED] = time.monotonic()


#: Sent with a refusal that leaves a body unread: the server closes the connection instead of reading (and
#: dropping) the rest of a body it refused, which could be as long as the client likes when it is chunked.
CLOSE = {"connection": "close"}


def check_length(limit: int, content_length: str | None) -> None:
    """`PayloadTooLarge` for a declared length over `limit`, before a byte of the body is read."""
    if content_length is not None and content_length.isdigit() and int(content_length) > limit:
        raise PayloadTooLarge(
            f"request body of {content_length} bytes is larger than the limit of {limit} bytes", headers=CLOSE
        )


async def read_body(receive: Receive, limit: int, content_length: str | None) -> bytes:
    """The whole request body, or `PayloadTooLarge` as soon as it is known to exceed `limit` bytes (`content_length`:
    the header's value when the caller has not checked it yet)."""
    if content_length is not None:
        check_length(limit, content_length)
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientDisconnected()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise PayloadTooLarge(f"request body is larger than the limit of {limit} bytes")
        return body
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            too_large = f"request body is larger than the limit of {limit} bytes"
            raise PayloadTooLarge(too_large, headers=CLOSE if message.get("more_body", False) else None)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


#: The scope key of ``answering(status, request_id)``, set by whatever serves a request around its exchange
#: (`modelserve.tracing`: the request's server span): called as the answer's status line is sent, it returns the
#: headers to send with it (``traceparent``), so that no wrapped `send` is needed. The exchange
#: (`exchange_route`) honours it on every answer it sends.
ANSWERING = "modelserve.answering"
#: ``answering(status, request_id)``: the headers to add to an answer (`ANSWERING`).
Answering = Callable[[int, "str | None"], list[tuple[bytes, bytes]]]


def with_answering(send: Send, answering: Answering, request_id: str | None) -> Send:
    """`send` adding the headers of `answering` to the answer's start (for answers that send themselves: an
    error, a stream, a user's Response)."""

    async def send_answer(message: Any) -> None:
        if message["type"] == "http.response.start":
            extra = answering(message["status"], request_id)
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return send_answer


#: The scope key of the transport that calls back when the connection is lost (modelserve's own protocol, see
#: `modelserve.http._protocol`): its ``subscribe(callback)`` returns what undoes it, or None once lost.
LOST = "modelserve.lost"


class Disconnected:
    """`Api.call`'s `cancelled` for an HTTP request (a `modelserve.watch.Subscribable`): awaited, it completes
    when the client disconnects (after the body was read, the server's next message for the request is the
    disconnect); where the transport tells of a lost connection itself (`LOST` in the scope), `subscribe` hands
    it the callback, and no task has to wait on ``receive``."""

    __slots__ = ("receive", "scope")

    def __init__(self, receive: Receive, scope: Scope) -> None:
        self.receive = receive
        self.scope = scope

    def __call__(self) -> Awaitable[str]:
        return wait_disconnect(self.receive)

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        transport = self.scope.get(LOST)
        if transport is None:
            return None
        unsubscribe: Callable[[], None] | None = transport.subscribe(callback)
        return unsubscribe


async def wait_disconnect(receive: Receive) -> str:
    """Wait until the client disconnects (a `cancelled` awaitable for `Api.call`, with ``partial``)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return "disconnect"


async def send_body(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes,
    request_id: str,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode()),
    ]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, value: Any, request_id: str) -> None:
    await send_body(send, status, encode_json(value), JSON_TYPE, request_id)


def without_body(send: Send) -> Send:
    """A `send` that answers HEAD: the GET answer's status and headers, no body."""

    async def send_head(message: Any) -> None:
        if message["type"] == "http.response.body":
            if message.get("more_body", False):
                return
            message = {"type": "http.response.body", "body": b""}
        await send(message)

    return send_head
