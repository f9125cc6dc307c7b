"""The access line of every answer: one line per request, with its request id and its duration.

Who writes it, so that the model-call path pays nothing for the others:

- a model call (a realtime ``POST``, the jobs routes, V2 inference) writes its own at the end of the call,
  from what it already holds (`modelserve.logs.access_writer`);
- every other handler of the route table (``/healthz``, ``/readyz``, ``/metrics``, ``GET /<api>``, the docs,
  V2's metadata) is wrapped by `logged` when the table is built;
- an answer made before any handler (the table's 404 and 405, the guard's refusals and CORS preflights)
  goes out through `answering`'s ``send``.

All of them write through the same function, so every line has the same fields, in the text and the JSON
formats. While modelserve writes a request's line, uvicorn's own access line for it is left out
(`modelserve.logs.OutsideRequestFilter`). With access lines off, none of this costs anything: `logged` and
`answering` hand back what they were given.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from starlette.types import Message, Receive, Scope, Send

from modelserve.context import sane_request_id
from modelserve.http._asgi import header
from modelserve.logs import access_writer, writing_access_line

if TYPE_CHECKING:
    from modelserve.logs import AccessWriter

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]


class _Answer:
    """A ``send`` that passes an answer on and writes its access line once the answer has ended (its last
    body message), with the status and the ``X-Request-ID`` it carried."""

    __slots__ = ("scope", "send", "write", "api", "started", "status", "request_id", "done")

    def __init__(self, scope: Scope, send: Send, write: AccessWriter, api: str | None) -> None:
        self.scope = scope
        self.send = send
        self.write = write
        self.api = api
        self.started = time.perf_counter()
        self.status = 500  # what uvicorn answers for a handler that raised before answering
        self.request_id: str | None = None
        self.done = False

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = message["status"]
            for key, value in message.get("headers", ()):
                if key == b"x-request-id":
                    self.request_id = value.decode("latin-1")
            token = writing_access_line.set(True)  # uvicorn writes its line while it sends the start
            try:
                await self.send(message)
            finally:
                writing_access_line.reset(token)
            return
        await self.send(message)
        if kind == "http.response.body" and not message.get("more_body", False):
            self.end()

    def end(self) -> None:
        """Write the line (once)."""
        if not self.done:
            self.done = True
            request_id = self.request_id or sane_request_id(header(self.scope, b"x-request-id"))
            self.write(self.scope, self.status, time.perf_counter() - self.started, request_id, self.api)


def _same(scope: Scope, send: Send) -> Send:
    return send


def answering(api: str | None = None) -> Callable[[Scope, Send], Send]:
    """``answering(scope, send)`` gives the ``send`` of an answer whose access line is written when it ends
    (`send` itself while access lines are off). Call it once, where the answering part is built."""
    write = access_writer()
    if write is None:
        return _same

    def wrap(scope: Scope, send: Send) -> Send:
        return _Answer(scope, send, write, api)

    return wrap


def logged(handler: Handler, api: str | None = None) -> Handler:
    """`handler` writing an access line for each request (`handler` itself while access lines are off); `api`
    is the API the route belongs to, if any (``GET /<api>``)."""
    write = access_writer()
    return handler if write is None else _Logged(handler, api, write)


class _Logged:
    """A route handler that writes the access line of each of its answers.

    It shows the handler's ``__self__`` and ``__func__``: the API keys and the OpenAPI document find the
    endpoint (and its API) of a route through them."""

    __slots__ = ("handler", "api", "write")

    def __init__(self, handler: Handler, api: str | None, write: AccessWriter) -> None:
        self.handler = handler
        self.api = api
        self.write = write

    @property
    def __self__(self) -> object:
        return getattr(self.handler, "__self__", None)

    @property
    def __func__(self) -> object:
        return getattr(self.handler, "__func__", None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = _Answer(scope, send, self.write, self.api)
        try:
            await self.handler(scope, receive, answer)
        finally:
            answer.end()  # a handler that raised, or one that ended without a body, still gets its line
