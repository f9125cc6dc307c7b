"""Truss's routes over a Truss Model class, as a Truss server answers them.

::

    POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/messages, /v1/responses
                                  the class's method of that name (listed by `modelserve.http.openai`)
    POST /v1/models/<api>:predict  the API's predict (its realtime route under Truss's path)
    POST /v1/models/<api>:predict_binary  the same call, by Truss's other name
    GET  /ping                     SageMaker's readiness: {} once the API has loaded, else 503
    POST /invocations              SageMaker's call: the API's predict
    POST /v1/models/model:predict  (and ``:predict_binary``, ``GET /v1/models/model``) the same, under the name
                                  Truss's clients put in every path, whatever the model's name

A method is called as Truss calls it (`TrussMethod`): the body decoded as JSON (also with no Content-Type or a
form's, what ``curl -d`` sends; one naming text or bytes gives those, as the native route does), then the
method with the inputs, the request, or both, sync in a worker thread or async on the loop. A generator
streams, chunk by chunk; a client that asks for ``Accept: application/json`` gets the chunks gathered into one
JSON value, unless it is an OpenAI client (its User-Agent names OpenAI), which is always streamed to, as Truss
does. Each call goes through `Api.call` with the method's own pipeline (`TrussModelClassBackend.entries`): the
API's line, concurrency slot, timeout, cancellation, metrics and access line, and the guard (API keys, CORS,
the Host check) in front.

``:predict``, ``:predict_binary`` and ``/invocations`` take a body sent as ``application/octet-stream`` as Truss's
msgpack and answer it in msgpack (`modelserve.http._truss_binary`, the ``truss-binary`` extra), as Truss does.

``:predict``, ``:predict_binary``, ``/ping`` and ``/invocations`` are served for APIs that follow a Truss config
(a Truss folder, or ``truss:`` in modelserve.yaml); ``/ping``, ``/invocations`` and the paths under ``model``
when the project has one realtime API. Truss's server ignores the model segment of its paths, and its clients
(``truss predict``, Baseten's ``/production/predict``, Truss's own tests) all send ``/v1/models/model:predict``,
which a Truss with a ``model_name`` of its own must answer too.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from modelserve.api import Api, Stream
from modelserve.codecs import BYTES_TYPE, decode_payload, encode_json
from modelserve.context import RequestContext, new_request_id, sane_request_id
from modelserve.errors import EncodeError
from modelserve.http import _truss_binary
from modelserve.http._asgi import request_headers, send_json
from modelserve.http.errors import send_error
from modelserve.http.exchange import Exchange, Head, exchange_route, replayed_request
from modelserve.http.realtime import RealtimeEndpoint
from modelserve.http.routing import Handler, Route

if TYPE_CHECKING:
    from modelserve.server import ModelServer

logger = logging.getLogger("modelserve")

#: What ``curl -d`` sends when no Content-Type is given, as the curl calls of many truss-examples READMEs do.
_FORM = "application/x-www-form-urlencoded"


def _truss_body_type(content_type: str | None) -> str:
    """The Content-Type a body on Truss's paths is decoded by: JSON when there is none or it is a form's, as
    Truss's server parses every body that is not msgpack as JSON (a form's fields never reach a Truss model);
    any other, as the native route decodes it."""
    if not content_type or content_type.partition(";")[0].strip().lower() == _FORM:
        return "application/json"
    return content_type


def _dict_answer(exchange: Exchange, result: dict[str, Any], ctx: RequestContext) -> bytes:
    """The usual answer, a dict, encoded in line, and refused as the realtime route refuses it: a dict that is
    not JSON (one holding bytes, say) is the 500 of a user-code failure with the API's log line, not an
    internal error of the server."""
    try:
        return encode_json(result)
    except EncodeError as exc:
        raise exchange._not_encoded(ctx, exc) from None


def endpoints_of(api: Api) -> list[str]:
    """The Truss methods an API's class defines besides predict (``chat_completions``...), or none."""
    return sorted(getattr(api.backend, "endpoints", {}))


def _head(scope: Scope) -> Head:
    """(request id, content type, content length, (the Accept streams are framed by, the scope)) in one pass:
    an OpenAI client (by its User-Agent) is streamed to whatever it accepts."""
    request_id = content_type = length = accept = None
    openai_client = False
    for key, value in scope["headers"]:
        if key == b"content-type":
            content_type = value.decode("latin-1")
        elif key == b"content-length":
            length = value.decode("latin-1")
        elif key == b"x-request-id":
            request_id = value.decode("latin-1")
        elif key == b"accept":
            accept = value.decode("latin-1")
        elif key == b"user-agent":
            openai_client = b"openai" in value.lower()
    request_id = sane_request_id(request_id) if request_id is not None else new_request_id()
    return request_id, content_type, length, (None if openai_client else accept, scope)


class TrussMethod(Exchange):
    """One of a Truss class's methods (`modelserve.compat.truss_backend.ENDPOINT_METHODS`) of one API."""

    def __init__(self, api: Api, method: str) -> None:
        super().__init__(api)
        self.method = method
        self.call = self._call

    read_head = staticmethod(_head)

    def decode(self, body: bytes, head: Head, ctx: RequestContext) -> tuple[Any, Any]:
        """(inputs, request), as the method takes them: Truss parses the body as JSON unless told otherwise."""
        entry = self.api.backend.entries[self.method]  # type: ignore[attr-defined]
        inputs = decode_payload(_truss_body_type(head[1]), body) if entry.needs_inputs else None
        request = replayed_request(head[3][1], body, ctx) if entry.needs_request else None
        return inputs, request

    def _call(self, decoded: tuple[Any, Any], ctx: RequestContext, *, request: Any, **call: Any) -> Awaitable[Any]:
        inputs, own_request = decoded
        entry = self.api.backend.entries[self.method]  # type: ignore[attr-defined]
        return self.api.call(inputs, ctx, request=own_request, pipeline=entry, **call)

    def encode(self, result: Any, value: Any, head: Head, ctx: RequestContext) -> Any:
        if type(result) is dict:
            return _dict_answer(self, result, ctx)
        if isinstance(result, Stream):
            return self._answer(result, (head[0], head[1], head[2], head[3][0]), ctx)
        return self._answer(result, head, ctx)

    post = exchange_route()


class _TrussBinary(RealtimeEndpoint):
    """The realtime route as Truss's predict answers: a body sent as ``application/octet-stream`` is Truss's
    msgpack (`modelserve.http._truss_binary`), and so is the answer to it (a stream excepted); a body with no
    Content-Type (``requests.post(url, data=json.dumps(...))`` sends none) or a form's (``curl -d``) is JSON,
    as Truss reads every body; any other body is decoded as the native route decodes it."""

    def decode(self, body: bytes, head: Head, ctx: RequestContext) -> Any:
        if _truss_binary.is_binary(head[1]):
            return _truss_binary.loads(body)
        return decode_payload(_truss_body_type(head[1]), body)

    def encode(self, result: Any, value: Any, head: Head, ctx: RequestContext) -> Any:
        if _truss_binary.is_binary(head[1]) and not isinstance(result, (Stream, Response)):
            try:
                return _truss_binary.dumps(result), BYTES_TYPE, None
            except EncodeError as exc:
                raise self._not_encoded(ctx, exc) from None
        if type(result) is dict:
            return _dict_answer(self, result, ctx)
        return self._answer(result, head, ctx)


class TrussPredict(_TrussBinary):
    """``POST /v1/models/<api>:predict``: the realtime route under Truss's path (a function of its own, so that
    the OpenAPI document lists it apart from ``POST /<api>``)."""

    post = exchange_route()


class TrussPredictBinary(_TrussBinary):
    """``POST /v1/models/<api>:predict_binary``: Truss's name for the same call, for clients that send msgpack."""

    post = exchange_route()


class Invocations(_TrussBinary):
    """``POST /invocations``: the realtime route under SageMaker's path."""

    post = exchange_route()


class TrussModelPredict(_TrussBinary):
    """``POST /v1/models/model:predict`` and ``:predict_binary`` of a project's one API, named otherwise: the
    path Truss's clients call whatever the model's name (the OpenAPI document lists the API's own path only)."""

    post = exchange_route()


#: The model segment that Truss's clients put in its paths; Truss's server ignores it.
TRUSS_MODEL = "model"


class SageMaker:
    """``GET /ping`` and ``POST /invocations`` of a project's one API, and Truss's ``GET /v1/models/model``."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.invocations = Invocations(api).post

    async def ping(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = request_headers(scope)[0]
        if self.api.ready:
            await send_json(send, 200, {}, request_id)
        else:
            await send_error(send, self.api.not_ready(), request_id)

    async def model_ready(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Truss's readiness under the name its clients use (``GET /v1/models/model``), answered as ``/ping``
        (Truss answers both ``{}``); a function of its own, so that the OpenAPI document lists ``/ping`` once."""
        await self.ping(scope, receive, send)


def routes(server: ModelServer) -> list[Route]:
    """``/v1/models/<api>:predict`` of each Truss API; SageMaker's routes and the paths under ``model`` of a lone
    one."""
    realtime = [api for api in server.apis.values() if api.config.kind == "realtime"]
    truss = [api for api in realtime if api.config.truss is not None]
    table = []
    for api in truss:
        table.append(Route(f"/v1/models/{api.name}:predict", {"POST": TrussPredict(api).post}))
        table.append(Route(f"/v1/models/{api.name}:predict_binary", {"POST": TrussPredictBinary(api).post}))
    if len(realtime) == 1 and truss:
        sagemaker = SageMaker(truss[0])
        own: list[tuple[str, dict[str, Handler]]] = [
            ("/ping", {"GET": sagemaker.ping}),
            ("/invocations", {"POST": sagemaker.invocations}),
        ]
        if truss[0].name != TRUSS_MODEL:
            alias = TrussModelPredict(truss[0]).post
            table.append(Route(f"/v1/models/{TRUSS_MODEL}", {"GET": sagemaker.model_ready}))
            table.append(Route(f"/v1/models/{TRUSS_MODEL}:predict", {"POST": alias}))
            table.append(Route(f"/v1/models/{TRUSS_MODEL}:predict_binary", {"POST": alias}))
        for path, handlers in own:
            if path[1:] in server.apis:
                logger.warning("an API named '%s' hides SageMaker's %s route", path[1:], path)
            else:
                table.append(Route(path, handlers))
    return table
