"""The realtime spec: ``POST /<api>`` runs the API, ``GET``/``HEAD /<api>`` describe it.

Over the exchange (`modelserve.http.exchange`), which reads the body and calls the API: the body is decoded
by its Content-Type (`modelserve.codecs`) only when a stage takes the inputs, and the result is sent as JSON
(a dict straight through `encode_json`), bytes, a stream (`modelserve.http.streaming`, framed by Accept) or
the user's own Starlette Response.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from modelserve.api import Api, Stream, log_user_error
from modelserve.codecs import JSON_TYPE, decode_payload, encode_json, encode_result
from modelserve.context import RequestContext
from modelserve.errors import EncodeError, UserCodeError
from modelserve.http._asgi import request_headers, send_json
from modelserve.http.exchange import Exchange, Head, exchange_route
from modelserve.http.routing import Route
from modelserve.http.streaming import send_stream

if TYPE_CHECKING:
    from modelserve.server import ModelServer


class RealtimeEndpoint(Exchange):
    """The handlers of one realtime API's route, by method."""

    always_decode = False  # an API whose stages take the request alone accepts any body

    async def get(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self.api.describe(), request_headers(scope)[0])

    post = exchange_route()

    def decode(self, body: bytes, head: Head, ctx: RequestContext) -> Any:
        return decode_payload(head[1], body)

    def encode(self, result: Any, value: Any, head: Head, ctx: RequestContext) -> Any:
        try:
            if type(result) is dict:  # the usual result
                return encode_json(result), JSON_TYPE, None
            if isinstance(result, Stream):
                return partial(_send_stream, result, head[3])
            if isinstance(result, Response):
                return partial(_send_response, result, ctx.request_id)
            body, content_type = encode_result(result)
            return body, content_type, None
        except EncodeError as exc:
            # A result that cannot be encoded is the user's failure (a 500), logged once.
            error = UserCodeError("encoding the result", exc)
            log_user_error(self.name, ctx, error)
            raise error from None


async def _send_stream(stream: Stream, accept: str | None, scope: Scope, receive: Receive, send: Send) -> int:
    return await send_stream(send, stream, accept)


async def _send_response(response: Response, request_id: str, scope: Scope, receive: Receive, send: Send) -> int:
    response.headers["x-request-id"] = request_id
    await response(scope, receive, send)
    return response.status_code


def routes(server: ModelServer) -> list[Route]:
    """``/<api>`` of each realtime API (and ``/`` too, when it is the server's only API)."""
    table = []
    for api in server.apis.values():
        if api.config.kind == "realtime":
            endpoint = RealtimeEndpoint(api)
            for path in _paths(server, api):
                table.append(Route(path, {"GET": endpoint.get, "POST": endpoint.post}))
    return table


def _paths(server: ModelServer, api: Api) -> list[str]:
    return [f"/{api.name}", "/"] if len(server.apis) == 1 else [f"/{api.name}"]
