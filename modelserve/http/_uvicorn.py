"""What modelserve's transport relies on in uvicorn's HTTP protocols, checked once at start (`missing`).

`modelserve.http._protocol` subclasses uvicorn's `HttpToolsProtocol` and `H11Protocol` and uses names uvicorn
does not document: methods it overrides or calls by name, attributes of the protocol (``url``, ``headers``,
``scope``, ``cycle``, ``flow``, ``loop``, ``transport``, ``app``, and h11's ``conn``) and of a request's
``cycle`` (``scope``, ``transport``, ``response_complete``). A uvicorn that renamed one would break a
connection at its first request, not at start. `missing(protocol)` finds out first, in two steps:

- **the class**: the methods modelserve overrides or calls by name exist (`HTTPTOOLS_METHODS`, `H11_METHODS`);
- **an instance that served one request**: most of the attributes are set per connection or per request
  (``url`` and ``headers`` when a message begins), so they are neither on the class nor knowable from its
  signature, and reading uvicorn's source would break on any refactoring that keeps them. So a probe, a
  subclass of uvicorn's class whose hooks do what modelserve's do (read ``url`` and ``headers`` when the headers
  are complete, add a key to ``scope``, start another ``app``), is given one request on an in-memory transport,
  its body still coming, and checks what modelserve relies on by its meaning: the target and headers are there
  when the headers complete, the scope with the added key is the one the app receives, the app started is the
  one set on ``app``, the ``cycle`` answers through its ``transport`` (replaced, as the lingering close does,
  and closed through it too), ``flow`` pauses and resumes reading, ``loop`` is the loop the request is started
  on, and (h11) ``conn`` says the body is still coming. The request's task is started on a stand-in loop that
  keeps it and runs it by hand: no event loop runs, no socket is opened, nothing is logged; it takes about
  a millisecond, once per process.

What the probe does not exercise (the parser's own callbacks, which httptools documents) needs no check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

#: The methods of `HttpToolsProtocol` that modelserve's protocol overrides or calls by name.
HTTPTOOLS_METHODS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "on_headers_complete",
    "on_message_complete",
    "_unset_keepalive_if_required",
)
#: The methods of `H11Protocol` that modelserve's protocol overrides or calls by name.
H11_METHODS = ("connection_lost", "data_received", "_unset_keepalive_if_required")

#: One request whose body (4 bytes) is still coming after its first two.
_HEAD = b"POST /probe HTTP/1.1\r\nHost: probe\r\nContent-Length: 4\r\n\r\n"
_MARK = "modelserve.probe"
#: A logger that logs nothing (not in logging's tree: nothing configures it).
_QUIET = logging.Logger("modelserve.http._uvicorn.probe", logging.CRITICAL + 1)


class _Missing(Exception):
    """What the probe found missing."""


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise _Missing(what)


class _Transport(asyncio.Transport):
    """An in-memory transport: what was written to it, and whether it was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _Handle:
    """A task or timer that the stand-in loop never runs on its own."""

    def cancel(self) -> None:
        pass

    def add_done_callback(self, callback: Any, **kwargs: Any) -> None:
        pass


class _Loop:
    """The probe's loop: keeps the coroutine of each task it is asked to start, to run by hand."""

    def __init__(self) -> None:
        self.coroutines: list[Coroutine[Any, Any, Any]] = []

    def create_task(self, coroutine: Coroutine[Any, Any, Any], **kwargs: Any) -> _Handle:
        self.coroutines.append(coroutine)
        return _Handle()

    def call_later(self, delay: float, callback: Any, *args: Any, **kwargs: Any) -> _Handle:
        return _Handle()

    def call_soon(self, callback: Any, *args: Any, **kwargs: Any) -> _Handle:
        return _Handle()

    def run(self) -> None:
        """Run the tasks started so far; each must finish without waiting (the probe's app never does)."""
        coroutines, self.coroutines = self.coroutines, []
        for coroutine in coroutines:
            try:
                coroutine.send(None)
            except StopIteration:
                continue
            coroutine.close()
            raise _Missing("a request's task that answers without waiting on the loop")

    def close(self) -> None:
        """Drop the tasks never run (the probe stopped before it ran them)."""
        for coroutine in self.coroutines:
            coroutine.close()
        self.coroutines = []


class _App:
    """The probe's ASGI app: answers 200 with ``Connection: close``, and keeps the scope it was called with."""

    def __init__(self) -> None:
        self.scope: dict[str, Any] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scope = scope
        headers = [(b"content-length", b"2"), (b"connection", b"close")]  # as a refusal of an upload
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})


async def _unused(scope: Any, receive: Any, send: Any) -> None:  # pragma: no cover - must not be called
    raise AssertionError("the probe's request started the config's app, not the protocol's `app`")


def missing(protocol: type[asyncio.Protocol]) -> list[str]:
    """What uvicorn's `protocol` (its `HttpToolsProtocol` or `H11Protocol`) lacks of what modelserve's
    subclass of it relies on; empty when nothing. Never raises: a probe that fails says why in the list."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    h11 = issubclass(protocol, H11Protocol)
    methods = H11_METHODS if h11 else HTTPTOOLS_METHODS
    absent = [f"{protocol.__name__}.{name}" for name in methods if not callable(getattr(protocol, name, None))]
    if absent:
        return absent
    loop = _Loop()
    try:
        _probe_h11(protocol, loop) if h11 else _probe_httptools(protocol, loop)
    except _Missing as exc:
        return [f"{protocol.__name__}: {exc}"]
    except Exception as exc:  # noqa: BLE001 - any failure of the probe is a reason to fall back
        return [f"{protocol.__name__}: one request served in memory ({type(exc).__name__}: {exc})"]
    finally:
        loop.close()
    return []


def _instance(protocol: type[Any], app: Any, loop: _Loop) -> Any:
    """An instance of `protocol` (of uvicorn's signature) for the probe, connected to an in-memory transport."""
    from uvicorn.config import Config
    from uvicorn.server import ServerState

    config = Config(
        app, http=protocol, ws="none", lifespan="off", interface="asgi3", proxy_headers=False, log_config=None
    )
    instance = protocol(config=config, server_state=ServerState(), app_state={}, _loop=loop)
    instance.access_log = False  # no access line, and no log line, for the probe's request
    instance.logger = _QUIET
    return instance


def _check_connection(instance: Any, transport: _Transport, loop: _Loop) -> None:
    _need(getattr(instance, "transport", None) is transport, "transport: the connection's transport")
    _need(getattr(instance, "loop", None) is loop, "loop: the loop the connection's requests are started on")
    flow = getattr(instance, "flow", None)
    _need(
        callable(getattr(flow, "pause_reading", None)) and callable(getattr(flow, "resume_reading", None)),
        "flow: the read flow control (pause_reading, resume_reading)",
    )


def _check_answer(instance: Any, transport: _Transport, loop: _Loop, app: _App) -> None:
    """The request's cycle, its body still coming: the answer goes through its ``transport``, closing it too."""
    cycle: Any = getattr(instance, "cycle", None)
    _need(cycle is not None, "cycle: the current request's cycle")
    _need(getattr(cycle, "response_complete", None) is False, "cycle.response_complete: whether it was answered")
    _need(getattr(cycle, "transport", None) is transport, "cycle.transport: what the answer is written through")
    lingering = _Transport()
    cycle.transport = lingering  # as `_LingerOnClose` does
    loop.run()
    _need(app.scope is not None, "app: the app a request starts, read when its headers are complete")
    _need(getattr(cycle, "scope", None) is app.scope, "cycle.scope: the scope the app receives")
    answered = bytes(lingering.written).startswith(b"HTTP/1.1 200") and not transport.written
    _need(answered and lingering.closed, "cycle.transport: the answer written and closed through it")


def _probe_httptools(protocol: type[Any], loop: _Loop) -> None:
    app = _App()
    seen: dict[str, Any] = {}

    class Probe(protocol):  # type: ignore[misc]
        """Does in its hooks what `LimitedHttpToolsProtocol` does in its own."""

        def on_headers_complete(self) -> None:
            seen["url"] = getattr(self, "url", None)
            seen["headers"] = list(getattr(self, "headers", None) or ())
            scope = getattr(self, "scope", None)
            if isinstance(scope, dict):
                scope[_MARK] = True
            config_app: Any = getattr(self, "app", None)
            self.app = app
            try:
                protocol.on_headers_complete(self)
            finally:
                self.app = config_app

        def on_message_complete(self) -> None:
            seen["complete"] = True
            protocol.on_message_complete(self)

    transport = _Transport()
    instance = _instance(Probe, _unused, loop)
    instance.connection_made(transport)
    _check_connection(instance, transport, loop)
    instance.data_received(_HEAD + b"ab")
    _need(seen.get("url") == b"/probe", "url: the request's target, when its headers are complete")
    _need((b"host", b"probe") in seen.get("headers", ()), "headers: the request's headers, when they are complete")
    _check_answer(instance, transport, loop, app)
    _need(bool(app.scope and app.scope.get(_MARK)), "scope: the request's scope, as the app receives it")
    instance.data_received(b"cd")
    _need(seen.get("complete", False), "on_message_complete: called when the request's body is complete")
    instance.connection_lost(None)


def _probe_h11(protocol: type[Any], loop: _Loop) -> None:
    import h11

    app = _App()
    transport = _Transport()
    instance = _instance(protocol, app, loop)
    instance.connection_made(transport)
    _check_connection(instance, transport, loop)
    instance.data_received(_HEAD + b"ab")
    conn = getattr(instance, "conn", None)
    _need(getattr(conn, "their_state", None) is h11.SEND_BODY, "conn: the h11 connection, its body still coming")
    _check_answer(instance, transport, loop, app)
    _need((b"host", b"probe") in (app.scope or {}).get("headers", ()), "cycle.scope: the request's headers")
    instance.connection_lost(None)
