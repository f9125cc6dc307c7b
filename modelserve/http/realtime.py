"""The realtime spec: ``POST /<api>`` runs the API, ``GET``/``HEAD /<api>`` describe it.

The exchange's own codecs are the native wire format (`modelserve.http.exchange`): the body is decoded by
its Content-Type (`modelserve.codecs`), here only when a stage takes the inputs, and the result is sent as
JSON (a dict straight through `encode_json`), bytes, a stream (`modelserve.http.streaming`, framed by the
Accept header) or the user's own Starlette Response. So the spec is its routes and one choice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.types import Receive, Scope, Send

from modelserve.http._asgi import request_headers, send_json
from modelserve.http.exchange import Exchange, exchange_route
from modelserve.http.routing import Route

if TYPE_CHECKING:
    from modelserve.server import ModelServer


class RealtimeEndpoint(Exchange):
    """The handlers of one realtime API's route, by method."""

    always_decode = False  # an API whose stages take the request alone accepts any body

    async def get(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self.api.describe(), request_headers(scope)[0])

    post = exchange_route()


def routes(server: ModelServer) -> list[Route]:
    """``/<api>`` of each realtime API (and ``/`` too, when it is the server's only API); those of an API with
    numbered versions are `modelserve.http.versions`'s, which follow its versions."""
    table = []
    for api in server.apis.values():
        if api.config.kind == "realtime" and api.name not in server.versions:
            endpoint = RealtimeEndpoint(api)
            paths = [f"/{api.name}", "/"] if len(server.apis) == 1 else [f"/{api.name}"]
            for path in paths:
                table.append(Route(path, {"GET": endpoint.get, "POST": endpoint.post}))
    return table
