"""Transport limits uvicorn's httptools protocol lacks: a header size limit, deadlines for the headers and the body,
the lingering close of a refused upload, and a 400 for two Host headers.

httptools (llhttp) bounds neither the request line nor the headers, and uvicorn times out only an idle
keep-alive connection: a client that sends its headers (or its body) a byte a second holds a connection and
a growing buffer for ever. `LimitedHttpToolsProtocol` is uvicorn's own protocol with five additions, made
through the parser callbacks httptools documents (``on_headers_complete``, ``on_message_complete``) and
asyncio's protocol methods (it reads uvicorn's ``url`` and ``headers`` of the request only to size a header
block that may be too large, the scope of its current ``cycle`` and its read ``flow`` control only for the
refusal pause, and adds modelserve's keys to the request's ``scope``; the lingering close replaces the
``transport`` of a ``cycle`` whose body is still coming, and the Host check the ``app`` it starts). Those names
are uvicorn's internals: `modelserve.http._uvicorn.missing` checks them once per process, and
`transport_protocol()` serves with uvicorn's own protocol, with one warning naming what is lost, when one is
missing. `TransportConfig` (a `uvicorn.Config`) carries the limits to the protocol and passes it as ``http``:

- request line plus headers over `TransportLimits.max_header_size` bytes: when they are complete, the
  ``on_headers_complete`` callback raises, so the parser fails and uvicorn answers 400 and closes the
  connection; while they are still arriving, the connection is closed as soon as they pass the limit (so
  that at most the limit and one read are held);
- the headers of a request (from the connection's start, or the request's first byte) not complete within
  `header_timeout` seconds: the connection is closed;
- the body not complete within `body_timeout` seconds of the end of the headers: the connection is closed
  (the app's ``receive`` then says ``http.disconnect``, and the request ends as a disconnect);
- the request after one refused because its API's line was full (the app marks its scope with `REFUSED`):
  not read sooner than `refusal_pause` seconds after the refusal. When its first bytes come earlier, they
  are held and the connection is not read until then; the request then counts its wait in the line from
  when they came (`ARRIVED`). A client that resends at once otherwise makes the event loop spend its turns
  on refusals, and the calls that hold the slots wait for those turns: under a closed flood of 150 clients
  at an async 50 ms API, the refusals every loop turn ran before a call's timer made each call 5-7 ms late
  (87-88% of the capacity answered); a 10 ms pause halves the refusals and the calls run on time (98-100%)
  (`benchmarks/overload.py`). Nothing is dropped. The check costs a request only a dict lookup when its
  first bytes come (a hook at the end of every answer cost about 1 us of a 60 us request, measured);
- a lost connection is told to the calls that asked (the scope's `LOST` is the protocol, whose `subscribe`
  the app's `Disconnected` calls for a call still running after `modelserve.watch.WATCH_AFTER`), so that a
  long call is not watched by a task waiting on ``receive()``: at a few hundred connections, when most calls
  outlast that, the task was a tenth of a batched request's cost.

- an answer that closes the connection while its request's body is still coming (a 503 or 413 refusing an
  upload): the connection lingers (`_Lingering`, docs/large-bodies.md): our side is shut down for writing
  once the answer is sent, and what the client still sends is dropped, for at most `linger_time` seconds and
  `linger_size` bytes, so that the client reads its answer instead of a reset;
- a request with more than one ``Host`` header (RFC 9112, section 3.2): answered by
  `modelserve.http.guard.more_than_one_host` (a JSON 400 that closes the connection) instead of the app, so
  that a server without a Host check refuses it too. A request in which no header name comes twice pays a
  ``dict`` of its headers.

A deadline is armed only when a request is still incomplete after the bytes at hand were parsed, so a
request that arrives whole costs no timer (nor the lingering close its small wrapper). Without httptools,
`LingeringH11Protocol` (uvicorn's h11 protocol) bounds the headers (``h11_max_incomplete_event_size``) and
lingers, but has no deadlines, no refusal pause and no Host count of its own (`transport_protocol`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import uvicorn
from uvicorn.config import Config

from modelserve.errors import HeadersTooLarge
from modelserve.http._asgi import ARRIVALS, ARRIVED, LOST, ORDER, REFUSED
from modelserve.http._uvicorn import missing
from modelserve.http.guard import host_count, more_than_one_host

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # pragma: no cover - httptools is part of uvicorn[standard]
    HttpToolsProtocol = None  # type: ignore[assignment, misc]

logger = logging.getLogger(__name__)

#: The limits' defaults, as the CLI shows them.
MAX_HEADER_SIZE = 32 * 1024
HEADER_TIMEOUT = 10.0
BODY_TIMEOUT = 60.0
REFUSAL_PAUSE = 0.01
LINGER_TIME = 5.0
LINGER_SIZE = 64 * 1024 * 1024
#: At most this many connections of a process linger at once; past it a refused upload's connection is closed.
MAX_LINGERING = 256


@dataclass(frozen=True)
class TransportLimits:
    """Bounds on what one client may make the server hold while it sends a request."""

    #: Bytes of the request line and the headers (names, values and separators) of one request.
    max_header_size: int = MAX_HEADER_SIZE
    #: Seconds from a connection's start, or a request's first byte, to the end of its headers.
    header_timeout: float = HEADER_TIMEOUT
    #: Seconds from the end of a request's headers to the end of its body.
    body_timeout: float = BODY_TIMEOUT
    #: Seconds after a refusal because the line was full before the connection's next request is read (0: at once).
    refusal_pause: float = REFUSAL_PAUSE
    #: Seconds a connection closed before its request's body was read goes on reading (and dropping) it.
    linger_time: float = LINGER_TIME
    #: Bytes of such a body read and dropped at most (fewer when it declared a smaller Content-Length).
    linger_size: int = LINGER_SIZE


class _Lingering:
    """The lingering close of refused uploads, for uvicorn's two protocols (mixed in before them).

    Closing a socket with unread bytes in the kernel's buffer sends a reset instead of a FIN, and a reset makes
    the client's kernel drop what it had received and not yet handed over: a client that writes its whole
    upload before it reads (most do) never reads the 503 or 413 that refused it. So, as nginx's lingering
    close: when an answer closes the connection while its request's body is still coming, shut down our side
    for writing once the answer is sent (the client reads the answer, then the end), then read and drop what
    comes until the client closes, the declared body has come, `TransportLimits.linger_size` bytes were
    dropped or `TransportLimits.linger_time` seconds have passed. At most `MAX_LINGERING` connections of a
    process linger at once; nothing is kept of what is dropped.
    """

    transport: asyncio.Transport
    flow: Any
    loop: asyncio.AbstractEventLoop
    _unset_keepalive_if_required: Callable[[], None]
    #: Connections of this process lingering now.
    lingering_now = 0

    def _linger_setup(self, limits: TransportLimits) -> None:
        self._linger_time = limits.linger_time
        self._linger_size = limits.linger_size
        #: While the connection lingers: the bytes still to drop, and the deadline.
        self._drop = 0
        self._lingering: asyncio.TimerHandle | None = None

    def _body_coming(self) -> bool:
        """Whether the current request's body is still being received."""
        raise NotImplementedError

    def _request_headers(self) -> list[tuple[bytes, bytes]]:
        raise NotImplementedError

    def _linger(self) -> None:
        """What closing the transport does for an answer given while its request's body was still coming."""
        transport = self.transport
        if transport.is_closing():
            return
        if not self._body_coming() or not self._linger_time or _Lingering.lingering_now >= MAX_LINGERING:
            transport.close()
            return
        _Lingering.lingering_now += 1
        self._drop = self._linger_size
        for name, value in self._request_headers():
            if name == b"content-length" and value.isdigit():
                self._drop = min(self._drop, int(value))  # more than is still to come: part of it came already
        self._lingering = self.loop.call_later(self._linger_time, self._linger_end)
        if transport.can_write_eof():  # not under TLS: there the answer's Content-Length says where it ends
            transport.write_eof()  # once what is buffered (the answer) has been sent
        self.flow.resume_reading()
        # uvicorn arms its keep-alive timer once the answer is complete, right after this: ours counts.
        self.loop.call_soon(self._unset_keepalive_if_required)

    def _dropped(self, data: bytes) -> None:
        self._drop -= len(data)
        if self._drop <= 0:
            self._linger_end()

    def _linger_end(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()

    def _linger_lost(self) -> None:
        """From ``connection_lost``."""
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = None
            _Lingering.lingering_now -= 1


class _LingerOnClose:
    """The transport, as the answer to a request whose body is still coming sees it: closing it lingers
    (`_Lingering`). uvicorn's answers write, ask whether it is closing, and close."""

    __slots__ = ("_protocol", "is_closing", "write")

    def __init__(self, protocol: _Lingering) -> None:
        self._protocol = protocol
        self.write = protocol.transport.write
        self.is_closing = protocol.transport.is_closing

    def close(self) -> None:
        self._protocol._linger()

    def __getattr__(self, name: str) -> Any:  # whatever else a later uvicorn may use
        return getattr(self._protocol.transport, name)


class TransportConfig(Config):
    """uvicorn's `Config`, carrying `TransportLimits` to modelserve's protocol, which it serves with.

    ``http`` defaults to `transport_protocol()`: modelserve's protocol when the uvicorn installed offers what it
    relies on, uvicorn's own otherwise (with one warning). Given another ``http``, the limits reach it only if it
    is one of modelserve's protocols. A plain `Config` gives modelserve's protocols the default limits::

        config = TransportConfig(app, limits=TransportLimits(header_timeout=5), host="127.0.0.1", port=8000)
        uvicorn.Server(config).run()
    """

    def __init__(self, app: Any, *, limits: TransportLimits | None = None, **kwargs: Any) -> None:
        self.transport_limits = limits if limits is not None else TransportLimits()
        kwargs.setdefault("h11_max_incomplete_event_size", self.transport_limits.max_header_size)
        http = kwargs.pop("http", None)
        super().__init__(app, **kwargs)
        # Chosen once uvicorn has configured logging (in `Config.__init__`), so that a warning goes where it says.
        self.http = transport_protocol() if http is None else http


def _limits(config: Config) -> TransportLimits:
    return config.transport_limits if isinstance(config, TransportConfig) else _DEFAULT_LIMITS


_DEFAULT_LIMITS = TransportLimits()

#: What serving with uvicorn's own protocol instead of modelserve's loses.
LOST_WITHOUT_HTTPTOOLS = (
    "the header size limit, the header and body deadlines, the refusal pause, the lingering close of refused "
    "uploads, the 400 for two Host headers at the transport, and the disconnect callbacks (a task waits on each "
    "long call's connection instead)"
)
LOST_WITHOUT_H11 = "the lingering close of refused uploads"


@functools.cache
def transport_protocol() -> type[asyncio.Protocol]:
    """The protocol class to serve with: modelserve's httptools protocol (or, without httptools, its h11
    protocol) when the uvicorn installed has what it relies on (`modelserve.http._uvicorn.missing`, checked
    once per process); uvicorn's own protocol otherwise, with one warning that names what is lost."""
    if HttpToolsProtocol is not None:
        mine: type[asyncio.Protocol] = LimitedHttpToolsProtocol
        stock: type[asyncio.Protocol] = HttpToolsProtocol
        lost = LOST_WITHOUT_HTTPTOOLS
    else:  # pragma: no cover - httptools is part of uvicorn[standard]
        mine, stock, lost = LingeringH11Protocol, H11Protocol, LOST_WITHOUT_H11
    absent = missing(stock)
    if not absent:
        return mine
    logger.warning(
        "uvicorn %s lacks what modelserve's HTTP protocol relies on (%s): serving with uvicorn's %s instead, "
        "without %s",
        uvicorn.__version__,
        "; ".join(absent),
        stock.__name__,
        lost,
    )
    return stock


if HttpToolsProtocol is not None:

    class LimitedHttpToolsProtocol(_Lingering, HttpToolsProtocol):
        """uvicorn's httptools protocol, with the `TransportLimits` of its `TransportConfig`."""

        def __init__(self, config: Config, *args: Any, **kwargs: Any) -> None:
            super().__init__(config, *args, **kwargs)
            limits = _limits(config)
            self._max_header_size = limits.max_header_size
            self._header_timeout = limits.header_timeout
            self._body_timeout = limits.body_timeout
            self._refusal_pause = limits.refusal_pause
            self._resume: asyncio.TimerHandle | None = None
            #: The first bytes of a request held back by a refusal pause, and when they came.
            self._held = b""
            self._arrived = 0.0
            self._header_bytes = 0
            #: What the connection waits for: "headers", "body", or None (between requests).
            self._reading: str | None = "headers"
            self._deadline: asyncio.TimerHandle | None = None
            #: Called when the connection is lost (`subscribe`); once it is, `_gone`.
            self._subscribers: dict[Callable[[], None], None] = {}
            self._gone = False
            self._linger_setup(limits)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm(self._header_timeout)  # a connection that never sends a whole request is closed too

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            self._linger_lost()
            if self._resume is not None:
                self._resume.cancel()
                self._resume = None
            super().connection_lost(exc)
            self._gone = True
            subscribers = list(self._subscribers)
            self._subscribers.clear()
            for callback in subscribers:
                callback()

        def subscribe(self, callback: Callable[[], None]) -> Callable[[], None] | None:
            """Call `callback` when the connection is lost; returns what undoes that, or None when it already is."""
            if self._gone:
                return None
            self._subscribers[callback] = None
            return partial(self._subscribers.pop, callback, None)

        def data_received(self, data: bytes) -> None:
            reading = self._reading
            if reading is None:  # between requests, any byte begins the next one
                cycle = self.cycle
                if cycle is not None and REFUSED in cycle.scope and self._hold(cycle.scope, data):
                    return
                self._reading = reading = "headers"
            if reading == "headers":
                self._header_bytes += len(data)  # a rough count (the chunk may hold a body too)
            elif self._lingering is not None:
                self._dropped(data)
                return
            # The base class by name rather than super(): these methods run several times per request.
            HttpToolsProtocol.data_received(self, data)
            if self._reading is None or self.transport.is_closing():
                return
            if self._reading == "headers" and self._header_bytes > self._max_header_size:
                self.transport.close()  # the headers are still coming, and already too large
            elif self._deadline is None:
                if self._reading == "headers":
                    self._arm(self._header_timeout)
                    return
                self._arm(self._body_timeout)
                cycle = self.cycle
                if cycle is not None and not cycle.response_complete:
                    # The body is still coming: if the answer closes the connection before it is read, linger.
                    cycle.transport = _LingerOnClose(self)  # type: ignore[assignment]

        # httptools' parser callbacks

        def on_headers_complete(self) -> None:
            # Counted exactly only when the rough count passed the limit (a large first chunk, or headers
            # that came in many): the usual request pays one comparison.
            if self._header_bytes > self._max_header_size:
                size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
                if size > self._max_header_size:
                    raise HeadersTooLarge(f"request headers larger than {self._max_header_size} bytes")
            self._reading = "body"
            self._header_bytes = 0
            if self._arrived:
                self.scope[ARRIVED] = self._arrived  # type: ignore[literal-required]
                self._arrived = 0.0
            if self._deadline is not None:
                self._disarm()
            self.scope[LOST] = self  # type: ignore[literal-required]
            ARRIVALS.count = order = ARRIVALS.count + 1
            self.scope[ORDER] = order  # type: ignore[literal-required]
            headers = self.headers
            if len(dict(headers)) < len(headers) and host_count(headers) > 1:  # a name came twice: Host?
                # Answered by modelserve's 400 instead of the app: the base class starts the app it reads here.
                app, self.app = self.app, more_than_one_host
                try:
                    HttpToolsProtocol.on_headers_complete(self)
                finally:
                    self.app = app
                return
            HttpToolsProtocol.on_headers_complete(self)

        def on_message_complete(self) -> None:
            self._reading = None
            if self._deadline is not None:
                self._disarm()
            HttpToolsProtocol.on_message_complete(self)

        def _hold(self, refused: Any, data: bytes) -> bool:
            """The first bytes of the request after the refusal of `refused` (a scope): when they came sooner
            than the pause after it, hold them and stop reading until the pause is over (True)."""
            refused_at: float = refused.pop(REFUSED)
            now = time.monotonic()
            wait = refused_at + self._refusal_pause - now
            if wait <= 0 or self.transport.is_closing():
                return False
            self.flow.pause_reading()
            self._held, self._arrived = data, now
            self._resume = self.loop.call_later(wait, self._release)
            return True

        def _release(self) -> None:
            self._resume = None
            data, self._held = self._held, b""
            if self.transport.is_closing():
                return
            self.flow.resume_reading()
            self.data_received(data)

        def _body_coming(self) -> bool:
            return self._reading == "body"

        def _request_headers(self) -> list[tuple[bytes, bytes]]:
            return self.headers

        def _linger(self) -> None:
            _Lingering._linger(self)
            if self._lingering is not None:
                self._disarm()  # the body's deadline: the lingering has its own

        def _arm(self, seconds: float) -> None:
            self._deadline = asyncio.get_running_loop().call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()


try:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol
except ImportError:  # pragma: no cover - h11 is a dependency of uvicorn
    H11Protocol = None  # type: ignore[assignment, misc]

if H11Protocol is not None:

    class LingeringH11Protocol(_Lingering, H11Protocol):
        """uvicorn's h11 protocol with the lingering close (`_Lingering`): the fallback without httptools, or
        for an embedding process to pass as ``uvicorn.Config(http=...)``. No deadlines, no refusal pause."""

        def __init__(self, config: Config, *args: Any, **kwargs: Any) -> None:
            super().__init__(config, *args, **kwargs)
            self._linger_setup(_limits(config))

        def connection_lost(self, exc: Exception | None) -> None:
            self._linger_lost()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._lingering is not None:
                self._dropped(data)
                return
            H11Protocol.data_received(self, data)
            cycle = self.cycle
            if cycle is not None and cycle.transport is self.transport and self._body_coming():
                cycle.transport = _LingerOnClose(self)  # type: ignore[assignment]

        def _body_coming(self) -> bool:
            return self.conn.their_state is h11.SEND_BODY

        def _request_headers(self) -> list[tuple[bytes, bytes]]:
            return list(self.cycle.scope["headers"]) if self.cycle is not None else []
