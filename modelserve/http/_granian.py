"""The granian edge (``--server granian``): the same app served by granian, a Rust HTTP server, in one process.

granian parses HTTP and writes answers in Rust threads (hyper), so a request's HTTP work leaves the Python
thread; the app, the batcher and the model run as under uvicorn. `serve` runs granian's embedded server on an
event loop of this process (uvloop when installed), with the app the command made. Every `TransportLimits`
of modelserve is kept, mapped to a setting of granian or enforced in front of the app (`EdgeLimits`):

- ``max_header_size``: hyper's read buffer (``HTTP1Settings.max_buffer_size``), which bounds the request line
  and headers: larger, hyper answers 431 and closes the connection. hyper's buffer is at least 8 KiB, so a
  smaller limit is refused at start (`check_limits`);
- ``header_timeout``: hyper's ``header_read_timeout`` (at most 60 s in granian; a longer one is refused at
  start): a request whose headers take longer, from its first byte or from the connection's start, is closed;
- ``body_timeout``: enforced in front of the app: a body not complete within it of the request's start ends
  the request as a disconnect (its ``receive`` says ``http.disconnect``) and `EdgeLimits` answers a 408 that
  closes the connection;
- ``refusal_pause``: enforced in front of the app: after a 503 because the line was full, the next request of
  that connection (the same client address and port) waits out the pause before the app sees it, its wait
  in the line counted from when it came (`ARRIVED`). The request was parsed already (in Rust, off the event
  loop), so the pause keeps the loop's turns for the calls in flight as it does under uvicorn;
- two ``Host`` headers: answered by `modelserve.http.guard.more_than_one_host` in front of the app;
- the lingering close of a refused upload: hyper's own way of closing after an answer given before the body
  was read lets the client read its 413 or 503 (tests/http/test_edge_granian.py);
- a lost connection: told through ``receive()`` (a task waits on it for each call that outlasts
  `modelserve.watch.WATCH_AFTER`), as with uvicorn's own protocol;
- the grace period of a shutdown: granian waits for its connections for ever, so the requests still in
  flight ``--graceful-timeout`` seconds after the signal are cancelled (`EdgeLimits.stop_in_flight`), each
  answered a JSON 503 as under uvicorn;
- WebSockets: granian passes ``websocket`` scopes to the app, whose handshake checks (Host, Origin, API key),
  message size limit (1009) and idle close are modelserve's own (`modelserve.http.websocket`), a refused
  handshake the same JSON answer (granian offers ASGI's denial response). granian 2.8 sends a close only once
  no ``receive`` of the connection is waiting, and modelserve's session keeps one waiting (to see the
  client's close), so `_WebSocket` ends that wait before it sends the close (and the app's task waits for
  that close to be sent: granian closes without a code when the app ends first). At the signal, `serve`'s
  ``on_stop`` closes the open sessions with 1001 before granian stops. granian bounds a message at 64 MiB
  (tungstenite's default) before the API's ``max_body_size`` does.

    serve(app, host="127.0.0.1", port=8888, limits=TransportLimits(), ssl={}, log_config=None)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelserve.errors import BadRequest, BodyTimeout, install_hint
from modelserve.http._asgi import ARRIVED, CLOSE, REFUSED, request_headers
from modelserve.http._protocol import TransportLimits
from modelserve.http.errors import send_error
from modelserve.http.guard import host_count, more_than_one_host

logger = logging.getLogger(__name__)

#: The answer to a request whose body hyper ended before it was whole, the app having answered nothing.
BODY_CUT = "the request body is malformed or ended before it was whole"
#: hyper's smallest read buffer, and so the smallest header limit granian can hold to.
MIN_HEADER_SIZE = 8192
#: granian's longest header read timeout, in seconds.
MAX_HEADER_TIMEOUT = 60.0
#: Refusals remembered at most; past it, those whose pause is over are forgotten.
MAX_REMEMBERED = 4096
#: Seconds a shutdown that closed WebSocket sessions waits before stopping granian: granian writes a close
#: from its own threads after the app's ``send`` returned, and stopped before, it would send the client a close
#: without the code (uvicorn's shutdown waits as long for its connections' own closes).
CLOSE_FLUSH = 0.1


def granian_missing() -> str | None:
    """Why granian cannot serve (not installed: the pip command that adds it), or None."""
    try:
        import granian  # noqa: F401
    except ImportError:
        return f"--server granian needs granian, which is not installed. Install it with: {install_hint('granian')}"
    return None


def check_limits(limits: TransportLimits) -> None:
    """`ValueError` naming the option when `limits` cannot be held by granian."""
    if limits.max_header_size < MIN_HEADER_SIZE:
        raise ValueError(
            f"--max-header-size: granian holds at least {MIN_HEADER_SIZE} bytes of headers; "
            f"give {MIN_HEADER_SIZE} or more, or serve with --server uvicorn"
        )
    if limits.header_timeout > MAX_HEADER_TIMEOUT:
        raise ValueError(
            f"--header-timeout: granian waits at most {MAX_HEADER_TIMEOUT:g} seconds for headers; "
            "give less, or serve with --server uvicorn"
        )


def http1_settings(limits: TransportLimits) -> Any:
    """granian's HTTP/1 settings holding `limits` (`check_limits` first)."""
    from granian.http import HTTP1Settings

    return HTTP1Settings(
        header_read_timeout=max(1, round(limits.header_timeout * 1000)),
        max_buffer_size=limits.max_header_size,
    )


@dataclass
class _Refusals:
    """When each connection (client address and port) was last refused because the line was full."""

    pause: float
    at: dict[Any, float] = field(default_factory=dict)

    def note(self, client: Any, refused_at: float) -> None:
        at = self.at
        if len(at) >= MAX_REMEMBERED:
            over = time.monotonic() - self.pause
            for key in [key for key, when in at.items() if when <= over]:
                del at[key]
        at[client] = refused_at


class _Request:
    """One request's ``receive`` with the body deadline, and its ``send`` noting whether the answer started.

    The deadline is one timer, armed at the first ``receive`` and cancelled once the body is whole (usually that
    same first message): when it fires while the request waits on ``receive``, it cancels the request's task
    and that wait ends as ``http.disconnect``. (``asyncio.wait_for`` on each receive made a task per request.)"""

    __slots__ = (
        "_receive",
        "_send",
        "_task",
        "_timer",
        "_waiting",
        "cut",
        "deadline",
        "expired",
        "reading",
        "started",
    )

    def __init__(self, receive: Receive, send: Send, deadline: float) -> None:
        self._receive = receive
        self._send = send
        #: When the body must be whole, in `time.monotonic` seconds.
        self.deadline = deadline
        self.reading = True
        self.expired = False
        #: Whether the body ended before it was whole (hyper ends a malformed one so, as a lost client's).
        self.cut = False
        self.started = False
        self._task: asyncio.Task[Any] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._waiting = False

    async def receive(self) -> Message:
        if not self.reading:
            return await self._receive()
        if self.expired:
            self.reading = False
            return {"type": "http.disconnect"}
        if self._timer is None:
            self._task = asyncio.current_task()
            self._timer = asyncio.get_running_loop().call_later(self.deadline - time.monotonic(), self._expire)
        self._waiting = True
        try:
            message = await self._receive()
        except asyncio.CancelledError:
            if not self.expired:
                raise
            uncancel = getattr(self._task, "uncancel", None)  # Python 3.11+: the cancel was ours, undo its count
            if uncancel is not None:
                uncancel()
            self.reading = False
            return {"type": "http.disconnect"}
        finally:
            self._waiting = False
        if message["type"] != "http.request":
            self.cut = True
            self.close()
        elif not message.get("more_body", False):
            self.close()
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    def close(self) -> None:
        """The body is whole, or the request over: no deadline any more."""
        self.reading = False
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self) -> None:
        if not self.reading:
            return
        self.expired = True
        if self._waiting and self._task is not None:
            self._task.cancel()


class _WebSocket:
    """A WebSocket's ``receive`` and ``send`` under granian: a close sent while a ``receive`` waits ends that
    wait first (its task is cancelled, and the wait returns ``websocket.disconnect`` with the close's code), as
    granian would hold the close until the client sent something. The app may end on that disconnect before a
    close sent from another task (the server's shutdown) is written, and granian closes a connection whose app
    ended with a close of its own, without a code: `finished` waits for the close to be sent."""

    __slots__ = ("_receive", "_reader", "_released", "_send", "_sent", "closed")

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        #: The task waiting on granian's ``receive``, if any.
        self._reader: asyncio.Task[Any] | None = None
        #: Set when that wait is over, for the close waiting on it.
        self._released: asyncio.Future[None] | None = None
        #: Set once the close is sent, when one is being sent.
        self._sent: asyncio.Future[None] | None = None
        #: The code of the close sent, once sent.
        self.closed: int | None = None

    async def finished(self) -> None:
        """Wait until the close being sent, if any, is sent (the app is over: granian may close then)."""
        if self._sent is not None and not self._sent.done():
            await asyncio.wait((self._sent,))

    async def receive(self) -> Message:
        if self.closed is not None:
            return {"type": "websocket.disconnect", "code": self.closed}
        self._reader = asyncio.current_task()
        try:
            return await self._receive()
        except asyncio.CancelledError:
            if self.closed is None or self._released is None:
                raise
            uncancel = getattr(self._reader, "uncancel", None)  # Python 3.11+: the cancel was ours, undo its count
            if uncancel is not None:
                uncancel()
            return {"type": "websocket.disconnect", "code": self.closed}
        finally:
            self._reader = None
            if self._released is not None and not self._released.done():
                self._released.set_result(None)

    async def send(self, message: Message) -> None:
        if message["type"] != "websocket.close" or self.closed is not None:
            await self._send(message)
            return
        self.closed = message.get("code", 1000)
        loop = asyncio.get_running_loop()
        self._sent = loop.create_future()
        try:
            reader = self._reader
            if reader is not None and reader is not asyncio.current_task():
                self._released = loop.create_future()
                reader.cancel()
                await self._released
            await self._send(message)
        finally:
            self._sent.set_result(None)


class EdgeLimits:
    """What uvicorn's protocol does for modelserve and granian does not, in front of the app: the body deadline,
    the refusal pause and the 400 for two Host headers (see the module's docstring)."""

    def __init__(self, app: ASGIApp, limits: TransportLimits) -> None:
        self.app = app
        self.body_timeout = limits.body_timeout
        self.refusals = _Refusals(limits.refusal_pause)
        #: The tasks of the requests in flight, for `stop_in_flight`.
        self.in_flight: set[asyncio.Task[Any]] = set()
        #: The tasks of the open WebSocket sessions (in `in_flight` too).
        self.sessions: set[asyncio.Task[Any]] = set()

    def stop_in_flight(self) -> None:
        """Cancel every request still in flight (the grace period of a shutdown is over): each call ends as
        under uvicorn, with a JSON 503, and granian can close its connections."""
        for task in list(self.in_flight):
            task.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] != "websocket":
                await self.app(scope, receive, send)
                return
            session = asyncio.current_task()  # a session outlasting the grace period is cancelled too
            if session is not None:
                self.in_flight.add(session)
                self.sessions.add(session)
            websocket = _WebSocket(receive, send)
            try:
                await self.app(scope, websocket.receive, websocket.send)
                await websocket.finished()
            finally:
                self.in_flight.discard(session)
                self.sessions.discard(session)
            return
        headers = scope["headers"]
        if len(dict(headers)) < len(headers) and host_count(headers) > 1:  # a name came twice: Host?
            await more_than_one_host(scope, receive, send)
            return
        task = asyncio.current_task()
        if task is not None:
            self.in_flight.add(task)
        client = scope.get("client")
        refused = self.refusals.at
        request = _Request(receive, send, time.monotonic() + self.body_timeout)
        try:
            if refused and client in refused:
                now = time.monotonic()
                wait = refused.pop(client) + self.refusals.pause - now
                if wait > 0:
                    scope[ARRIVED] = now
                    request.deadline += wait
                    await asyncio.sleep(wait)
            await self.app(scope, request.receive, request.send)
        finally:
            request.close()
            self.in_flight.discard(task)
            refused_at = scope.pop(REFUSED, None)
            if refused_at is not None and self.refusals.pause > 0:
                self.refusals.note(client, refused_at)
        if request.started:
            return
        if request.expired:
            await send_error(send, BodyTimeout(headers=CLOSE), request_headers(scope)[0])
        elif request.cut:
            # A body hyper could not read (a malformed chunk, a length it never reached): granian would answer
            # the app's silence with a plain-text 500; uvicorn's parser answers such a request 400. To a client
            # that left, nothing is sent.
            with contextlib.suppress(Exception):
                await send_error(send, BadRequest(BODY_CUT, headers=CLOSE), request_headers(scope)[0])


def probe_bind(host: str, port: int) -> None:
    """`OSError` when `host`:`port` cannot be listened on (in use, an unknown host), found by binding it once:
    granian would say so only as a `RuntimeError` with a Rust backtrace."""
    import socket

    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as granian's own socket
        probe.bind(address)


def serve(
    app: ASGIApp,
    *,
    host: str,
    port: int,
    limits: TransportLimits,
    ssl: dict[str, Any],
    log_config: dict[str, Any] | None,
    graceful_timeout: float = 30.0,
    on_ready: Callable[[Callable[[], None]], None] | None = None,
    on_stop: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve `app` with granian on `host`:`port` until SIGINT or SIGTERM, on a new event loop of this thread.

    On a signal granian stops accepting and waits for the connections it has; the requests still in flight
    `graceful_timeout` seconds later are cancelled (a JSON 503 each, as under uvicorn). `ssl` holds
    modelserve's TLS settings (`modelserve.launch.ssl_settings`). `on_ready` is given, once the loop runs, a
    function that stops the server from any thread; `on_stop` is awaited when the server begins to stop (the
    CLI's closes the open WebSocket sessions with 1001). `OSError` when the address cannot be listened on;
    `ValueError` when granian cannot hold `limits` (`check_limits`)."""
    from granian.constants import HTTPModes, Interfaces
    from granian.log import LogLevels
    from granian.server.embed import Server

    check_limits(limits)
    probe_bind(host, port)
    tls: dict[str, Any] = {}
    if ssl:
        from pathlib import Path

        tls = {
            "ssl_cert": Path(ssl["ssl_certfile"]),
            "ssl_key": Path(ssl["ssl_keyfile"] or ssl["ssl_certfile"]),
            "ssl_key_password": ssl.get("ssl_keyfile_password"),
        }
    shown_host = f"[{host}]" if ":" in host else host
    edge = EdgeLimits(app, limits)
    server = Server(
        edge,
        address=host,
        port=port,
        interface=Interfaces.ASGI,
        http=HTTPModes.http1,
        websockets=True,
        backlog=2048,
        http1_settings=http1_settings(limits),
        log_enabled=True,
        log_level=LogLevels.error,  # not its "experimental" warning nor its start lines: modelserve logs its own
        log_dictconfig=log_config,
        **tls,
    )

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stopping: list[asyncio.TimerHandle] = []
        stop_serving: Callable[[], None] = server.stop  # granian's: not annotated
        closing: set[asyncio.Task[None]] = set()

        async def close_then_stop() -> None:
            assert on_stop is not None
            try:
                open_sessions = set(edge.sessions)
                await on_stop()
                if open_sessions:  # their closes sent, and then written by granian
                    await asyncio.wait(open_sessions, timeout=graceful_timeout)
                    await asyncio.sleep(CLOSE_FLUSH)
            finally:
                stop_serving()

        def stop() -> None:
            if not stopping:
                if on_stop is not None:
                    closing.add(loop.create_task(close_then_stop()))
                else:
                    stop_serving()
                stopping.append(loop.call_later(graceful_timeout, edge.stop_in_flight))

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop)
        scheme = "https" if tls else "http"
        logger.info("granian serving on %s://%s:%d (press CTRL+C to quit)", scheme, shown_host, port)
        if on_ready is not None:

            def stop_from_any_thread() -> None:
                loop.call_soon_threadsafe(stop)

            on_ready(stop_from_any_thread)
        try:
            await server.serve()
        finally:
            for timer in stopping:
                timer.cancel()

    loop: asyncio.AbstractEventLoop
    try:
        import uvloop

        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is part of uvicorn[standard]
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(main())
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        asyncio.set_event_loop(None)
        loop.close()
