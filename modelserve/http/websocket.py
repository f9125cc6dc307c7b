"""WebSocket routes: Truss's ``/v1/websocket`` and modelserve's own ``/<api>/ws`` for a streaming API.

::

    WS /v1/websocket    a Truss API's ``async def websocket(self, websocket)``, given a Starlette WebSocket
                        (FastAPI's is the same class), accepted first as Truss does
    WS /<api>/ws        a realtime API: one message in (its inputs, JSON text or bytes), the result out (each
                        chunk of a stream a message: text as text, bytes as bytes, anything else as JSON text),
                        then a close with 1000

A WebSocket handshake goes through the same checks as a request (`check`): the Host check, the ``Origin`` (a
browser's cross-site handshake: allowed when CORS allows the origin, or when it names the Host itself), and the
API key, in a header or, for a browser, as the subprotocol ``bearer.<key>`` (echoed back when accepted). A refused
handshake is answered with the usual JSON error (401, 400, 403, 503) where the server offers ASGI's denial
response, else closed before it is accepted (a 403).

A connection is one call of its API through `Api.call`: admitted to its line (or refused with a 503), holding one
of its ``max_concurrency`` slots while it is open, under its ``timeout``. Each message a client sends is bounded
by the API's ``max_body_size`` (a larger one closes with 1009; the server's own bound, uvicorn's ``ws_max_size``,
16 MiB, is met first); a text message longer than ``codecs.DECODE_INLINE_MAX`` is parsed in a worker thread, as
an HTTP body is. Close codes: 1000 when the call ends, 1003 for a Truss API without a websocket method (as
Truss), 1011 when user code fails (the reason names no internals; the traceback is in the log with the request
id), 1013 when the call took longer than the API's timeout. Pings are uvicorn's (``ws_ping_interval``).

With tracing on, a session is a server span continuing the handshake's ``traceparent``, and each message it
handles a child span (`modelserve.tracing.WebSocketTrace`): `serve` begins and ends it, `Session` tells it the
messages and puts ``traceparent`` on the accept.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import TYPE_CHECKING, Any

import orjson
from starlette.types import Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from modelserve import _threads
from modelserve.api import Api, Stream
from modelserve.codecs import DECODE_INLINE_MAX, encode_json, loads
from modelserve.context import RequestContext, sane_request_id
from modelserve.errors import (
    BadRequest,
    ClientDisconnected,
    Forbidden,
    GatewayTimeout,
    HTTPError,
    NotFound,
    ServiceUnavailable,
    UserCodeError,
)
from modelserve.http._asgi import request_headers
from modelserve.http.auth import Access
from modelserve.http.errors import render, send_error
from modelserve.http.guard import host_count, two_hosts
from modelserve.http.routing import Route, RouteTable, route_path
from modelserve.logs import access_writer

if TYPE_CHECKING:
    from modelserve.http.guard import Guard
    from modelserve.server import ModelServer
    from modelserve.tracing import Tracing, WebSocketTrace

logger = logging.getLogger("modelserve")

PATH = "/v1/websocket"
#: Truss's close reasons (truss_server.py), which its tests read.
NOT_IMPLEMENTED = "WebSocket is not implemented on this deployment."
MODEL_ERROR = "Internal Server Error (in model/chainlet)."
#: The subprotocol a browser sends its API key in (it cannot set headers on a WebSocket).
KEY_PROTOCOL = "bearer."
#: Close codes (RFC 6455, section 7.4.1, and IANA's registry).
NORMAL, GOING_AWAY, UNSUPPORTED, POLICY, TOO_BIG, INTERNAL = 1000, 1001, 1003, 1008, 1009, 1011
TRY_AGAIN = 1013


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return dict(scope["headers"])


def _key_protocol(scope: Scope) -> str | None:
    """The ``bearer.<key>`` subprotocol the client offered, if any."""
    for protocol in scope.get("subprotocols", ()):
        if protocol.startswith(KEY_PROTOCOL):
            return str(protocol)
    return None


def check(guard: Guard | None, scope: Scope, path: str) -> Exception | None:
    """Why a handshake is refused (an `HTTPError`), or None: the guard's checks of a request, for a WebSocket."""
    headers = _headers(scope)
    if len(headers) < len(scope["headers"]) and host_count(scope["headers"]) > 1:  # which one would be checked?
        return two_hosts()
    origin = headers.get(b"origin")
    host = headers.get(b"host")
    if guard is not None and guard.hosts is not None and not guard.hosts.allows(host):
        return BadRequest("this server does not answer for the Host of this request (see allowed_hosts)")
    if origin is not None and not _same_origin(origin, host):
        if guard is None or guard.cors is None or not guard.cors.allows(origin):
            return Forbidden("a WebSocket from this Origin is not allowed (see cors.allow_origins)")
    if guard is not None and guard.keys is not None and (access := guard.access(path)) is not Access.OPEN:
        protocol = _key_protocol(scope)
        authorization = headers.get(b"authorization")
        if protocol is not None and authorization is None:
            authorization = b"Bearer " + protocol[len(KEY_PROTOCOL) :].encode("latin-1")
        refused = guard.keys.check(access, authorization, headers.get(b"x-api-key"))
        if refused is not None:
            return refused.error(access)
    return None


def _same_origin(origin: bytes, host: bytes | None) -> bool:
    """Whether an Origin (``scheme://host[:port]``) names the Host the handshake was sent to."""
    return host is not None and origin.partition(b"://")[2].lower() == host.lower()


async def deny(scope: Scope, send: Send, error: Exception, request_id: str) -> None:
    """Refuse a handshake: the JSON error answer where the server offers ASGI's denial response, else a close
    before accepting (the server answers 403)."""
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": POLICY})
        return

    async def as_denial(message: Message) -> None:
        await send({**message, "type": "websocket." + message["type"]})

    await send_error(as_denial, error, request_id)


async def serve(scope: Scope, receive: Receive, send: Send, table: RouteTable, guard: Guard | None) -> None:
    """A WebSocket handshake to the app: the route's WebSocket endpoint, once the guard's checks pass."""
    path = route_path(scope)
    request_id = sane_request_id(_headers(scope).get(b"x-request-id", b"").decode("latin-1") or None)
    found = table.match(path)
    get = found[0].handlers.get("GET") if found is not None else None
    endpoint = getattr(getattr(get, "__self__", None), "websocket", None)
    # The checks come before the 404, as the guard's do for a request: a handshake without a key (or from a
    # refused Host or Origin) learns nothing of which WebSocket routes exist, a guarded API's included.
    refused = check(guard, scope, path)
    if endpoint is None:
        await deny(scope, send, refused or NotFound(f"no WebSocket at {path}"), request_id)
        return
    owner = endpoint.__self__
    tracing = owner.tracing
    traced = (
        tracing.websocket(scope, found[0].path if found else path, owner.api.name, request_id)
        if tracing is not None
        else None
    )
    if refused is not None:
        await deny(scope, send, refused, request_id)
        if traced is not None:
            traced.end(getattr(refused, "status_code", Forbidden.status_code))
        return
    session = Session(receive, send, owner.api.config.max_body_size, owner.api.config.websocket_idle_timeout)
    session.trace = traced
    owner.sessions.add(session)
    error: BaseException | None = None
    try:
        await endpoint(scope, session, request_id)
    except BaseException as exc:
        error = exc
        raise
    finally:
        owner.sessions.discard(session)
        session.end()
        if traced is not None:
            traced.end(session.status, error)


class Session:
    """One connection's `receive` and `send`: a message larger than `limit` bytes closes it with 1009, and
    `idle` seconds without a message either way close it with 1001 (noticed while the app waits for a message;
    pings are the server's and do not count). `going_away` closes it with 1001 at the server's shutdown."""

    def __init__(self, receive: Receive, send: Send, limit: int, idle: float) -> None:
        self._receive, self._send = receive, send
        self.limit, self.idle = limit, idle
        self.last = time.monotonic()
        #: The server's `receive` in progress, kept across the waits that the idle bound cuts short.
        self._pending: asyncio.Future[Message] | None = None
        self.closed = False
        #: Whether the server's shutdown closed the session.
        self.gone = False
        #: The status the session ended with (`_Endpoint.answered`); 0 until then.
        self.status = 0
        #: With tracing on, its span (`modelserve.tracing.WebSocketTrace`): told each message as it arrives, and
        #: that the one before was handled when the app asks for the next.
        self.trace: WebSocketTrace | None = None

    async def send(self, message: Message) -> None:
        if self.closed and message["type"] != "websocket.accept":
            if message["type"] == "websocket.close":
                return
            raise ConnectionResetError("the WebSocket is closed")  # what stops a stream once it was closed
        if message["type"] == "websocket.close":
            self.closed = True
        elif message["type"] == "websocket.accept" and self.trace is not None:
            message = self.trace.accepted(message)
        self.last = time.monotonic()
        await self._send(message)

    async def receive(self) -> Message:
        if self.trace is not None:
            self.trace.handled()
        if self._pending is None:
            self._pending = asyncio.ensure_future(self._receive())
        while not self._pending.done():
            left = self.last + self.idle - time.monotonic()
            if left <= 0:
                return await self._refuse(GOING_AWAY, f"no message for {self.idle:g} s (websocket_idle_timeout)")
            await asyncio.wait((self._pending,), timeout=left)
        message, self._pending = self._pending.result(), None
        self.last = time.monotonic()
        if message["type"] == "websocket.receive":
            data = message.get("bytes")
            text = message.get("text")
            size = len(data) if data is not None else len(text.encode("utf-8")) if text is not None else 0
            if size > self.limit:
                return await self._refuse(TOO_BIG, f"message larger than the limit of {self.limit} bytes")
            if self.trace is not None:
                self.trace.received(message)
        return message

    async def _refuse(self, code: int, reason: str) -> Message:
        """Close with `code` (unless closed already); what the app receives instead of a message."""
        if not self.closed:
            self.closed = True
            try:
                await self._send({"type": "websocket.close", "code": code, "reason": reason})
            except OSError:
                pass  # the client is gone already
        return {"type": "websocket.disconnect", "code": code, "reason": reason}

    async def going_away(self) -> None:
        """The server's shutdown: close with 1001 before the server's own close (uvicorn's is 1012)."""
        self.gone = True
        await self._refuse(GOING_AWAY, "the server is shutting down")

    def end(self) -> None:
        if self._pending is not None:
            self._pending.cancel()


async def _close(websocket: WebSocket, code: int, reason: str = "") -> None:
    if (
        websocket.application_state == WebSocketState.CONNECTED
        and websocket.client_state != WebSocketState.DISCONNECTED
    ):
        try:
            await websocket.close(code, reason)
        except (RuntimeError, OSError):
            pass  # the client closed first


def _close_code(error: BaseException) -> tuple[int, str]:
    """The close code and reason a failed call ends its connection with: its own words for a refusal of the
    client's input (1008), none of the internals for a failure (1011)."""
    if isinstance(error, GatewayTimeout):
        return TRY_AGAIN, "the call took longer than the API's timeout"
    if isinstance(error, HTTPError) and error.status_code < 500:
        return POLICY, _reason(error.message)
    return INTERNAL, MODEL_ERROR


def _reason(message: str) -> str:
    """`message` cut to the 123 bytes of UTF-8 a close frame's reason may hold, on a character's boundary: a
    longer one (120 characters of a name the client sent in another script) failed the close itself."""
    return message.encode("utf-8", "replace")[:123].decode("utf-8", "ignore")


class _Endpoint:
    """What both WebSocket routes share: the plain-HTTP answer, admission, the call, and the close."""

    def __init__(self, api: Api, sessions: Sessions, tracing: Tracing | None = None) -> None:
        self.api = api
        self.access_log = access_writer()
        self.sessions = sessions
        #: With tracing on, what makes each session's span (`serve`).
        self.tracing = tracing

    def answered(self, scope: Scope, session: Session, status: int, started: float, request_id: str) -> None:
        """The connection's metrics and access line, when it ends: 101 (the handshake's status) for a session
        that ended as it should, 499 when the client left in the middle of a call, 503 when the server's
        shutdown closed it, else the error's status."""
        if session.gone:
            status = ServiceUnavailable.status_code
        session.status = status
        seconds = time.perf_counter() - started
        self.api.metrics.answered(status, seconds)
        if self.access_log is not None:
            self.access_log({**scope, "method": "GET"}, status, seconds, request_id, self.api.name)

    async def get(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A plain HTTP GET: this route speaks WebSocket only."""
        error = BadRequest("this route is a WebSocket: connect with ws:// (Upgrade: websocket)")
        error.headers["upgrade"] = "websocket"
        await send_error(send, error, request_headers(scope)[0])

    async def _run(
        self, websocket: WebSocket, session: Session, value: Any, ctx: RequestContext, **call: Any
    ) -> tuple[Any, int]:
        """One call of the API, admitted already: (its result, 101), or (`_FAILED`, the status it ended with)
        once a failure has closed the connection with its code."""
        try:
            return await self.api.call(value, ctx, admitted=0, **call), SWITCHED
        except ClientDisconnected as exc:
            logger.info("api '%s': the client closed the WebSocket (request %s)", self.api.name, ctx.request_id)
            return _FAILED, exc.status_code
        except Exception as exc:
            if session.closed:  # closed by the server (idle, shutdown) while user code still used it
                logger.info("api '%s': WebSocket closed by the server (request %s)", self.api.name, ctx.request_id)
                return _FAILED, ClientDisconnected.status_code
            return _FAILED, await _failed(websocket, exc, ctx.request_id)

    async def _admitted(self, scope: Scope, session: Session, request_id: str) -> bool:
        try:
            self.api.admit(0)
        except ServiceUnavailable as exc:
            session.status = exc.status_code
            await deny(scope, session.send, exc, request_id)
            return False
        return True


_FAILED = object()
#: The status a `/<api>/ws` session that ended before its message is counted with, by the server's close code
#: (the message was too large, the idle bound passed); a client's close is a 499.
_NO_MESSAGE = {TOO_BIG: 413, GOING_AWAY: 408}
#: The status a WebSocket session is counted with when it ended as it should (its handshake's).
SWITCHED = 101


async def _failed(websocket: WebSocket, exc: Exception, request_id: str) -> int:
    """Close the connection with the code of `exc`; its status (a failure not yet logged is logged here)."""
    status = render(exc, request_id)[0] if not isinstance(exc, (UserCodeError, GatewayTimeout)) else exc.status_code
    await _close(websocket, *_close_code(exc))
    return status


class TrussWebSocket(_Endpoint):
    """``/v1/websocket`` of a Truss API: its ``websocket`` method, or a close with 1003 when it has none."""

    async def websocket(self, scope: Scope, session: Session, request_id: str) -> None:
        websocket = WebSocket(scope, session.receive, session.send)
        entry = getattr(self.api.backend, "entries", {}).get("websocket")
        if entry is None and self.api.ready:  # counted as 501, the HTTP answer to a method the server lacks
            started = time.perf_counter()
            logger.error("api '%s': %s", self.api.name, NOT_IMPLEMENTED)
            await websocket.accept()
            await websocket.close(UNSUPPORTED, NOT_IMPLEMENTED)
            self.answered(scope, session, 501, started, request_id)
            return
        if not await self._admitted(scope, session, request_id):
            return
        started = time.perf_counter()
        await websocket.accept(_key_protocol(scope))
        ctx = RequestContext(self.api.name, request_id)
        entry = self.api.backend.entries["websocket"]  # type: ignore[attr-defined]
        result, status = await self._run(websocket, session, websocket, ctx, pipeline=entry)
        if result is not _FAILED or status == ClientDisconnected.status_code:  # a client's close ends a session
            await _close(websocket, NORMAL)
            status = SWITCHED
        self.answered(scope, session, status, started, request_id)


class ApiWebSocket(_Endpoint):
    """``/<api>/ws``: one message in, the result (each chunk of a stream) out, then a close with 1000."""

    async def websocket(self, scope: Scope, session: Session, request_id: str) -> None:
        websocket = WebSocket(scope, session.receive, session.send)
        if not await self._admitted(scope, session, request_id):
            return
        started = time.perf_counter()
        await websocket.accept(_key_protocol(scope))
        ctx = RequestContext(self.api.name, request_id)
        try:
            message = await websocket.receive()  # a silent client is closed with 1001 (`Session`)
        except BaseException:
            self.api.unadmit(0)
            raise
        if message["type"] == "websocket.disconnect":  # before its message: no call, but a session to count
            self.api.unadmit(0)
            status = _NO_MESSAGE.get(message.get("code", 0), 499) if session.closed else 499
            self.answered(scope, session, status, started, request_id)
            return
        traced, session.trace = session.trace, None  # the one message handled: `_Closed`'s reads are not
        session.idle = math.inf  # the call's own bound is the API's timeout; a stream's chunks are sent as made
        text = message.get("text")
        if text is not None and len(text) > DECODE_INLINE_MAX:  # as an HTTP body: parsed in a worker thread
            value: Any = await _threads.run_sync(parsed_text, text)
        elif text is not None:
            try:
                value = orjson.loads(text)
            except orjson.JSONDecodeError:
                value = text
        else:
            value = message.get("bytes", b"")
        result, status = await self._run(websocket, session, value, ctx, cancelled=_Closed(websocket))
        if result is not _FAILED:
            status = await self._answer(websocket, result, request_id)
        if traced is not None:
            traced.handled()
        self.answered(scope, session, status, started, request_id)

    async def _answer(self, websocket: WebSocket, result: Any, request_id: str) -> int:
        """Send the result (each chunk of a stream), then close with 1000; the status the session ends with."""
        try:
            if isinstance(result, Stream):
                try:
                    while (chunk := await result.next()) is not Stream.END:
                        await _send_chunk(websocket, chunk)
                    result.watch.disarm()
                finally:
                    await result.aclose()
            else:
                await _send_chunk(websocket, result)
        except (WebSocketDisconnect, ClientDisconnected):
            logger.info("api '%s': the client closed the WebSocket (request %s)", self.api.name, request_id)
            return ClientDisconnected.status_code
        except Exception as exc:
            return await _failed(websocket, exc, request_id)
        await _close(websocket, NORMAL)
        return SWITCHED


class _Closed:
    """`Api.call`'s `cancelled` for a WebSocket: completes when the client closes the connection."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket

    async def __call__(self) -> str:
        while True:
            message = await self.websocket.receive()
            if message["type"] == "websocket.disconnect":
                return "disconnect"


def parsed_text(text: str) -> Any:
    """In a worker thread: a long text message's value, as the JSON it holds (parsed in pieces above 1 MiB, as an
    HTTP body is: `codecs.loads`), else the text itself."""
    try:
        return loads(text.encode("utf-8", "surrogatepass"))
    except orjson.JSONDecodeError:
        return text


async def _send_chunk(websocket: WebSocket, chunk: Any) -> None:
    if isinstance(chunk, str):
        await websocket.send_text(chunk)
    elif isinstance(chunk, (bytes, bytearray, memoryview)):
        await websocket.send_bytes(bytes(chunk))
    else:
        await websocket.send_text(encode_json(chunk).decode("utf-8"))


def routes(server: ModelServer) -> list[Route]:
    """``/v1/websocket`` of a project's Truss API, and ``/<api>/ws`` of each realtime API."""
    table = []
    realtime = [api for api in server.apis.values() if api.config.kind == "realtime"]
    truss = [
        api for api in realtime if api.config.truss is not None or "websocket" in getattr(api.backend, "endpoints", {})
    ]
    with_method = [api for api in truss if "websocket" in getattr(api.backend, "endpoints", {})]
    if len(with_method) > 1:
        logger.warning("several APIs have a websocket method; /v1/websocket serves '%s'", with_method[0].name)
    sessions = Sessions()
    server.companions.append(sessions)
    tracing = _tracing(server)
    if with_method or len(truss) == 1:
        table.append(Route(PATH, {"GET": TrussWebSocket((with_method or truss)[0], sessions, tracing).get}))
    for api in realtime:
        table.append(Route(f"/{api.name}/ws", {"GET": ApiWebSocket(api, sessions, tracing).get}))
    return table


def _tracing(server: ModelServer) -> Tracing | None:
    """The process's tracing when the server's project has it on (`modelserve.tracing`, imported only then)."""
    if not server.project.tracing:
        return None
    from modelserve.tracing import install

    return install()


class Sessions(set[Session]):
    """The open WebSocket sessions of a server, a companion of it (`ModelServer.companions`): its `stop` closes
    them with 1001, as `going_away` does before the HTTP server's own shutdown closes every connection."""

    async def start(self) -> None:
        return None

    async def stop(self, grace: float | None = None) -> None:
        for session in list(self):
            await session.going_away()


async def going_away(server: ModelServer) -> None:
    """Close the server's open WebSocket sessions with 1001 (going away). The CLI calls it when its shutdown
    begins, before uvicorn closes the connections that remain with 1012 (service restart)."""
    for companion in server.companions:
        if isinstance(companion, Sessions):
            await companion.stop()
