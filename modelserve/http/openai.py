"""OpenAI's paths: an API with ``openai:`` (chat, completions or embeddings) in modelserve.yaml, and a Truss
Model class's ``chat_completions``, ``completions``, ``embeddings``, ``messages`` and ``responses``.

::

    POST /v1/chat/completions     an API with openai: chat, or a class with chat_completions
    POST /v1/completions          openai: completions, or completions
    POST /v1/embeddings           openai: embeddings, or embeddings
    POST /v1/messages             a class with messages (Anthropic's path; Truss serves it)
    POST /v1/responses            a class with responses
    GET  /v1/models               the APIs served at these paths, as OpenAI's model list
    GET  /v1/models/<api>         one of them (200 once loaded, else 503: Truss's readiness of a model)

Where several APIs share a path, the body's ``model`` names the API (OpenAI's own routing): the body is read
(bounded by the largest ``max_body_size`` among them; parsed for its ``model`` in a worker thread when longer
than ``codecs.DECODE_INLINE_MAX``, as a body is decoded) and handed to that API's exchange, with its value when
that API is an ``openai:`` one (`PARSED`: parsed once). Where one API has the path, its exchange reads the body
itself, admission first, as every route does.

An ``openai:`` API is a spec of the exchange (`OpenAIEndpoint`): the body is checked against OpenAI's request
schema (`check_request`: wrong types and values a 400 naming the parameter, unknown fields kept, as OpenAI
keeps them), ``model`` must name the API (else 404 ``model_not_found``), predict receives the body as a dict,
and what predict returns or yields becomes OpenAI's envelope (`Envelope`): a ``chat.completion``, a
``text_completion`` or an embeddings ``list``; with ``stream: true``, server-sent ``chat.completion.chunk``
(or ``text_completion``) events ending with ``data: [DONE]``. A result or chunk is text, or a dict with
``text`` (or ``content``), ``finish_reason`` and ``usage`` (``prompt_tokens``, ``completion_tokens``): usage is
sent when the model reports it. Errors are OpenAI's body, ``{"error": {"message", "type", "param", "code"}}``,
with modelserve's statuses (`openai_errors`). A Truss method is Truss's spec (`modelserve.http.truss`): the
body to the method as it is, the result as Truss answers it.
"""

from __future__ import annotations

import base64
import math
import time
from collections.abc import Awaitable, Container
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson
from starlette.types import Message, Receive, Scope, Send

from modelserve import _threads
from modelserve.api import Api, Stream, log_user_error
from modelserve.codecs import DECODE_INLINE_MAX, JSON_TYPE, LARGE_JSON, encode_json, loads
from modelserve.context import RequestContext
from modelserve.errors import BadRequest, ClientDisconnected, NotFound, UserCodeError
from modelserve.http._asgi import check_length, read_body, request_headers, send_json
from modelserve.http.errors import render, send_error
from modelserve.http.exchange import Exchange, Head, writes_access_line
from modelserve.http.routing import Handler, Route
from modelserve.http.streaming import SSE_TYPE
from modelserve.http.truss import TrussMethod, endpoints_of

if TYPE_CHECKING:
    from modelserve.server import ModelServer

#: The path of each kind of ``openai:`` API, and of each Truss method.
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}
TRUSS_PATHS = {
    "chat_completions": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}
#: The roles a chat message may have (OpenAI's, with the older ``function``).
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
#: At most this many inputs in one embeddings request, and stop sequences in one request (OpenAI's limits).
MAX_EMBEDDING_INPUTS = 2048
MAX_STOP = 4
#: The scope key of ``[body, value]``: a request's body and its JSON value, as the path that several APIs share
#: parsed it for its ``model`` (`ByModel`), for the chosen API's `OpenAIEndpoint` to take rather than parse again
#: (it empties the list; what is left in it once the exchange has answered is freed by `ByModel`).
PARSED = "modelserve.openai.parsed"

# ------------------------------------------------------------------------------------------------------------
# OpenAI's error body


#: OpenAI's error ``type`` by status.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}
_ERROR_CODES = {413: "request_too_large", 503: "service_unavailable", 504: "timeout", 500: "internal_error"}


class OpenAIBadRequest(BadRequest):
    """A 400 naming the request parameter at fault (OpenAI's ``param``)."""

    def __init__(self, param: str | None, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.extra = {"param": param, "code": code}


class ModelNotFound(NotFound):
    def __init__(self, model: Any, served: list[str]) -> None:
        shown = repr(model) if isinstance(model, str) else f"a {type(model).__name__}"
        super().__init__(f"the model {shown[:80]} does not exist here; this path serves {', '.join(served)}")
        self.extra = {"param": "model", "code": "model_not_found"}


def openai_body(status: int, body: bytes) -> bytes:
    """modelserve's error body (``{"error": message, "request_id", ...}``) as OpenAI's."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(value, dict) or not isinstance(value.get("error"), str):
        return body
    error = {
        "message": value.pop("error"),
        "type": _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
        "param": value.pop("param", None),
        "code": value.pop("code", None) or _ERROR_CODES.get(status),
    }
    return orjson.dumps({"error": error, **value})


def openai_errors(send: Send) -> Send:
    """A `send` whose whole JSON error answers (status 400 and up) carry OpenAI's error body."""
    held: Message | None = None

    async def send_openai(message: Message) -> None:
        nonlocal held
        if message["type"] == "http.response.start" and message["status"] >= 400:
            if any(key == b"content-type" and value == JSON_TYPE for key, value in message["headers"]):
                held = message
                return
        if held is not None:
            start, held = held, None
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                body = openai_body(start["status"], message.get("body", b""))
                length = str(len(body)).encode()
                headers = [(k, length if k == b"content-length" else v) for k, v in start["headers"]]
                await send({**start, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await send(start)
        await send(message)

    send_openai.raw = send  # type: ignore[attr-defined]
    return send_openai


# ------------------------------------------------------------------------------------------------------------
# The request: OpenAI's schema, the parts modelserve reads


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: A whole float from this on is no 64-bit integer (JSON's integers past 64 bits are read as floats).
_INT64_BOUND = 2.0**63


def _is_whole(value: Any) -> bool:
    """An integer as JSON counts them: ``5.0`` is one (JSON Schema's ``integer``, which OpenAPI documents use),
    whatever the client's encoder wrote for it."""
    return _is_int(value) or (isinstance(value, float) and value.is_integer() and abs(value) < _INT64_BOUND)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _number(body: dict[str, Any], name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is not None and not (_is_number(value) and low <= value <= high):
        raise OpenAIBadRequest(name, f"'{name}' must be a number from {low:g} to {high:g}, got {_kind(value)}")


def _positive(body: dict[str, Any], name: str) -> None:
    value = body.get(name)
    if value is not None and not (_is_whole(value) and value >= 1):
        raise OpenAIBadRequest(name, f"'{name}' must be a positive integer, got {_kind(value)}")
    if isinstance(value, float):
        body[name] = int(value)  # the model reads an int, as OpenAI's type says, whatever the client wrote


def _boolean(body: dict[str, Any], name: str, within: str = "") -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        param = within + name
        raise OpenAIBadRequest(param, f"'{param}' must be a boolean, got {_kind(value)}")
    return bool(value)


def _text_list(body: dict[str, Any], name: str, most: int) -> None:
    """A string, or a non-empty list of at most `most` strings."""
    value = body.get(name)
    if value is None or isinstance(value, str):
        return
    if not isinstance(value, list) or not value or len(value) > most:
        raise OpenAIBadRequest(name, f"'{name}' must be a string or a list of 1 to {most} strings")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise OpenAIBadRequest(f"{name}[{index}]", f"'{name}[{index}]' must be a string, got {_kind(item)}")


def _content(message: dict[str, Any], where: str) -> None:
    content = message.get("content")
    if content is None:
        if message.get("role") in ("assistant", "function"):
            return  # an assistant's tool call has no content
        raise OpenAIBadRequest(f"{where}.content", f"'{where}.content' is required for role {message.get('role')!r}")
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not content:  # OpenAI refuses an empty list of parts too
        got = "an empty list" if content == [] else _kind(content)
        raise OpenAIBadRequest(
            f"{where}.content", f"'{where}.content' must be a string or a non-empty list of parts, got {got}"
        )
    for index, part in enumerate(content):
        at = f"{where}.content[{index}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise OpenAIBadRequest(at, f"'{at}' must be an object with a 'type'")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise OpenAIBadRequest(f"{at}.text", f"'{at}.text' must be a string")


def _messages(body: dict[str, Any]) -> None:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        got = "an empty list" if messages == [] else _kind(messages)
        raise OpenAIBadRequest("messages", f"'messages' must be a non-empty list of messages, got {got}")
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise OpenAIBadRequest(where, f"'{where}' must be an object, got {_kind(message)}")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:  # a list or an object cannot be looked up in a set
            shown = repr(role)[:40] if isinstance(role, str) else _kind(role)
            raise OpenAIBadRequest(
                f"{where}.role", f"'{where}.role' must be one of {', '.join(sorted(ROLES))}, got {shown}"
            )
        _content(message, where)


def _prompt(body: dict[str, Any]) -> None:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return
    raise OpenAIBadRequest("prompt", "'prompt' must be a string (or a list of one string)")


def _embedding_input(body: dict[str, Any]) -> None:
    encoding = body.get("encoding_format")
    if encoding is not None and encoding not in ("float", "base64"):
        raise OpenAIBadRequest("encoding_format", "'encoding_format' must be 'float' or 'base64'")
    _positive(body, "dimensions")
    value = body.get("input")
    if isinstance(value, str):
        if not value:  # nothing to embed: OpenAI refuses it too
            raise OpenAIBadRequest("input", "'input' must not be an empty string")
        return
    if not isinstance(value, list) or not value or len(value) > MAX_EMBEDDING_INPUTS:
        raise OpenAIBadRequest("input", f"'input' must be a string or a list of 1 to {MAX_EMBEDDING_INPUTS} strings")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise OpenAIBadRequest(
                f"input[{index}]", f"'input[{index}]' must be a string (token arrays are not accepted here)"
            )
        if not item:
            raise OpenAIBadRequest(f"input[{index}]", f"'input[{index}]' must not be an empty string")


class OpenAIRequest:
    """A checked request: its body (what predict receives) and what the envelope needs of it."""

    __slots__ = ("body", "stream", "include_usage", "base64")

    def __init__(self, body: dict[str, Any], stream: bool, include_usage: bool, base64: bool) -> None:
        self.body = body
        self.stream = stream
        self.include_usage = include_usage
        self.base64 = base64


def check_request(kind: str, body: Any) -> OpenAIRequest:
    """The request of an ``openai:`` API of `kind`, checked against OpenAI's schema: a 400 naming the
    parameter for a wrong type or value; fields modelserve does not read are kept, unchecked."""
    if not isinstance(body, dict):
        raise OpenAIBadRequest(None, f"the request body must be a JSON object, got {_kind(body)}")
    if not isinstance(body.get("model"), str):
        raise OpenAIBadRequest("model", f"'model' must be a string, got {_kind(body.get('model'))}")
    if kind == "embeddings":
        _embedding_input(body)
        return OpenAIRequest(body, False, False, body.get("encoding_format") == "base64")
    if kind == "chat":
        _messages(body)
    else:
        _prompt(body)
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise OpenAIBadRequest("stream_options", "'stream_options' must be an object")
        include_usage = _boolean(options, "include_usage", "stream_options.")
    n = body.get("n")
    if n is not None and not (_is_whole(n) and n == 1):
        raise OpenAIBadRequest("n", "'n' must be 1: one choice per request is served here")
    if type(n) is float:
        body["n"] = 1  # the model reads an int, as for max_tokens
    for name in ("max_tokens", "max_completion_tokens"):
        _positive(body, name)
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    _number(body, "presence_penalty", -2, 2)
    _number(body, "frequency_penalty", -2, 2)
    _text_list(body, "stop", MAX_STOP)
    return OpenAIRequest(body, stream, include_usage, False)


# ------------------------------------------------------------------------------------------------------------
# The answer: OpenAI's envelope around what predict returned or yielded


class _NotAPiece(TypeError):
    """A result or chunk that is neither text nor a dict with text."""


def piece(value: Any) -> tuple[str, str | None, dict[str, int] | None]:
    """(text, finish_reason, usage) of a result or a chunk: text, or a dict with ``text`` (or ``content``),
    ``finish_reason`` and ``usage``."""
    if isinstance(value, str):
        return value, None, None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace"), None, None
    if isinstance(value, dict):
        text = value.get("text", value.get("content", ""))
        finish = value.get("finish_reason")
        usage = value.get("usage")
        if isinstance(text, str) and (finish is None or isinstance(finish, str)):
            return text, finish, _usage(usage)
    raise _NotAPiece(
        f"an OpenAI API's predict returns or yields text, or a dict with 'text' (and 'finish_reason', "
        f"'usage'); got {type(value).__name__}"
    )


def _usage(usage: Any) -> dict[str, int] | None:
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise _NotAPiece(f"'usage' must be a dict of token counts, got {type(usage).__name__}")
    prompt, completion = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
    if not (_is_int(prompt) and _is_int(completion) and prompt >= 0 and completion >= 0):
        raise _NotAPiece("'usage' holds prompt_tokens and completion_tokens, non-negative integers")
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Envelope:
    """OpenAI's objects for one request of one API: the whole answer, and each event of a stream."""

    def __init__(self, kind: str, model: str, request_id: str) -> None:
        self.chat = kind == "chat"
        self.model = model
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{request_id}"
        self.object = "chat.completion" if self.chat else "text_completion"
        self.created = int(time.time())
        # A content event is its constant head, the text as a JSON string, and its constant tail: one small
        # orjson call per token instead of a dict and a whole dumps (a fifth of a token's cost on the server).
        head, _, tail = self.event("\x00", None).partition(orjson.dumps("\x00"))
        self._head, self._tail = head, tail

    def whole(self, text: str, finish: str | None, usage: dict[str, int] | None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish or "stop", "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text, "refusal": None}
        else:
            choice["text"] = text
        answer = {"id": self.id, "object": self.object, "created": self.created, "model": self.model}
        answer["choices"] = [choice]
        if usage is not None:
            answer["usage"] = usage
        return answer

    def event(self, text: str | None, finish: str | None, role: bool = False) -> bytes:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return self._sse(
            {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": [choice]}
        )

    def content(self, text: str) -> bytes:
        """The event of one chunk of text (the same bytes as ``event(text, None)``)."""
        return self._head + orjson.dumps(text) + self._tail

    def usage_event(self, usage: dict[str, int]) -> bytes:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        answer = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": []}
        return self._sse({**answer, "usage": usage})

    @staticmethod
    def _sse(value: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(value) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def embeddings_answer(result: Any, request: OpenAIRequest, model: str) -> dict[str, Any]:
    """OpenAI's embeddings list from what predict returned: one vector per input (one vector alone for a string
    input), or a dict with ``embeddings`` (or ``data``) and ``usage``."""
    usage = None
    if isinstance(result, dict):
        usage = _usage(result.get("usage"))
        result = result.get("embeddings", result.get("data"))
    if hasattr(result, "tolist"):
        result = result.tolist()
    inputs = request.body["input"]
    if isinstance(inputs, str) and isinstance(result, list) and result and _is_number(result[0]):
        result = [result]
    count = 1 if isinstance(inputs, str) else len(inputs)
    if not isinstance(result, list) or len(result) != count:
        raise _NotAPiece(f"an embeddings API's predict returns one vector per input ({count}); got {_shape(result)}")
    data = []
    for index, vector in enumerate(result):
        if hasattr(vector, "tolist"):
            vector = vector.tolist()
        if not isinstance(vector, list) or not all(_is_number(x) for x in vector):
            raise _NotAPiece(f"embedding {index} is not a list of finite numbers")
        embedding: Any = vector
        if request.base64:
            import numpy as np

            embedding = base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    answer: dict[str, Any] = {"object": "list", "data": data, "model": model}
    answer["usage"] = (
        {"prompt_tokens": usage["prompt_tokens"], "total_tokens": usage["prompt_tokens"]} if usage else None
    )
    if answer["usage"] is None:
        del answer["usage"]
    return answer


def _shape(value: Any) -> str:
    return f"a list of {len(value)}" if isinstance(value, list) else type(value).__name__


class OpenAIEndpoint(Exchange):
    """The OpenAI path of one ``openai:`` API: OpenAI's request checked, OpenAI's envelope built."""

    def __init__(self, api: Api) -> None:
        super().__init__(api)
        assert api.config.openai is not None
        self.kind = api.config.openai
        self.call = self._call

    @staticmethod
    def read_head(scope: Scope) -> Head:
        """The request id and Content-Length, and (``head[3]``) the body as a shared path parsed it (`PARSED`)."""
        request_id, _, length, _ = request_headers(scope)
        return request_id, "application/json", length, scope.get(PARSED)

    def decode(self, body: bytes, head: Head, ctx: RequestContext) -> OpenAIRequest:
        parsed: list[Any] | None = head[3]
        if parsed and parsed[0] is body:  # parsed once, by the path that several APIs share; taken, so that
            value = parsed.pop()  # only the call holds it (and frees it as a value it decoded)
            parsed.clear()
        else:
            try:
                # in pieces above LARGE_JSON as any body (`codecs.loads`); a short one straight to orjson, as before
                value = orjson.loads(body) if len(body) <= LARGE_JSON else loads(body)
            except orjson.JSONDecodeError as exc:
                raise OpenAIBadRequest(None, f"the request body is not valid JSON: {exc}") from None
        request = check_request(self.kind, value)
        if request.body["model"] != self.name:
            raise ModelNotFound(request.body["model"], [self.name])
        return request

    def _call(self, checked: OpenAIRequest, ctx: RequestContext, **call: Any) -> Awaitable[Any]:
        return self.api.call(checked.body, ctx, **call)

    def encode(self, result: Any, value: Any, head: Head, ctx: RequestContext) -> Any:
        request: OpenAIRequest = value
        try:
            if self.kind == "embeddings":
                if isinstance(result, Stream):
                    return partial(_refuse_stream, result)
                return encode_json(embeddings_answer(result, request, self.name))
            envelope = Envelope(self.kind, self.name, ctx.request_id)
            if isinstance(result, Stream):
                return partial(_send_stream if request.stream else _send_collected, result, request, envelope)
            text, finish, usage = piece(result)
        except _NotAPiece as exc:
            error = UserCodeError("encoding the OpenAI answer", exc)
            log_user_error(self.name, ctx, error)
            raise error from None
        if request.stream:
            return partial(_send_events, [(text, finish, usage)], request, envelope, ctx.request_id)
        return encode_json(envelope.whole(text, finish, usage))

    @writes_access_line
    async def post(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.exchange(scope, receive, openai_errors(send))


async def _refuse_stream(stream: Stream, scope: Scope, receive: Receive, send: Send) -> int:
    await stream.aclose()
    error = UserCodeError("encoding the OpenAI answer", _NotAPiece("an embeddings API's predict cannot stream"))
    log_user_error(stream.ctx.api, stream.ctx, error)
    raise error


def _stream_failed(stream: Stream, exc: Exception) -> UserCodeError:
    error = UserCodeError("encoding the OpenAI answer", exc)
    log_user_error(stream.ctx.api, stream.ctx, error)
    return error


async def _next_piece(stream: Stream) -> tuple[str, str | None, dict[str, int] | None] | None:
    chunk = await stream.next()
    if type(chunk) is str:  # the usual chunk
        return chunk, None, None
    if chunk is Stream.END:
        return None
    try:
        return piece(chunk)
    except _NotAPiece as exc:
        raise _stream_failed(stream, exc) from None


async def _send_collected(
    stream: Stream, request: OpenAIRequest, envelope: Envelope, scope: Scope, receive: Receive, send: Send
) -> int:
    """A generating predict answered whole (the client did not ask for a stream)."""
    texts, finish, usage = [], None, None
    try:
        while (found := await _next_piece(stream)) is not None:
            texts.append(found[0])
            finish = found[1] or finish
            usage = found[2] or usage
        if stream.watch.fired:  # as in `_send_stream`: nobody is left to answer
            raise stream.api.cancelled(stream.ctx)
        stream.watch.disarm()
    except Exception as error:
        stream.watch.disarm()
        return await send_error(send, error, stream.ctx.request_id)
    finally:
        await stream.aclose()
    body = encode_json(envelope.whole("".join(texts), finish, usage))
    await send({"type": "http.response.start", "status": 200, "headers": _headers(JSON_TYPE, stream.ctx.request_id)})
    await send({"type": "http.response.body", "body": body})
    return 200


def _headers(content_type: bytes, request_id: str) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", content_type), (b"x-request-id", request_id.encode()), (b"cache-control", b"no-cache")]


async def _send_stream(
    stream: Stream, request: OpenAIRequest, envelope: Envelope, scope: Scope, receive: Receive, send: Send
) -> int:
    """A generating predict as OpenAI's server-sent events: the first chunk before the answer begins (so that a
    failure before it is a whole error answer), then one event per chunk, the finish, the usage, ``[DONE]``."""
    request_id = stream.ctx.request_id
    started = False
    try:
        first = await _next_piece(stream)
        await send({"type": "http.response.start", "status": 200, "headers": _headers(SSE_TYPE, request_id)})
        started = True
        send = getattr(send, "raw", send)  # the answer has begun: no error body to reshape any more
        opening = envelope.event(None, None, role=True)
        finish, usage = None, None
        found = first
        content = envelope.content
        while found is not None:
            text, finish_here, usage_here = found
            if finish_here is not None or usage_here is not None:
                finish, usage = finish_here or finish, usage_here or usage
            if text:
                body = content(text)
                if opening:  # the role's event goes with the first text
                    body, opening = opening + body, b""
                await send({"type": "http.response.body", "body": body, "more_body": True})
            found = await _next_piece(stream)
        if stream.watch.fired:  # on_disconnect: notify: the client left, and the generator then stopped by itself
            raise stream.api.cancelled(stream.ctx)
        stream.watch.disarm()
        tail = opening + envelope.event(None, finish or "stop")
        if request.include_usage and usage is not None:
            tail += envelope.usage_event(usage)
        await send({"type": "http.response.body", "body": tail + DONE, "more_body": False})
        return 200
    except Exception as error:
        stream.watch.disarm()
        if not started:
            return await send_error(send, error, request_id)
        if isinstance(error, ClientDisconnected):
            return error.status_code
        status, body, _ = render(error, request_id)
        event = b"data: " + openai_body(status, body) + b"\n\n"
        await send({"type": "http.response.body", "body": event, "more_body": False})
        return status
    finally:
        await stream.aclose()


async def _send_events(
    pieces: list[tuple[str, str | None, dict[str, int] | None]],
    request: OpenAIRequest,
    envelope: Envelope,
    request_id: str,
    scope: Scope,
    receive: Receive,
    send: Send,
) -> int:
    """A whole result sent as the stream the client asked for."""
    text, finish, usage = pieces[0]
    body = envelope.event(None, None, role=True)
    if text:
        body += envelope.event(text, None)
    body += envelope.event(None, finish or "stop")
    if request.include_usage and usage is not None:
        body += envelope.usage_event(usage)
    await send({"type": "http.response.start", "status": 200, "headers": _headers(SSE_TYPE, request_id)})
    await send({"type": "http.response.body", "body": body + DONE})
    return 200


# ------------------------------------------------------------------------------------------------------------
# The routes


class Models:
    """``GET /v1/models`` and ``GET /v1/models/<api>``: the APIs served at OpenAI's paths."""

    def __init__(self, apis: list[Api]) -> None:
        self.apis = {api.name: api for api in apis}
        self.created = int(time.time())

    def model(self, api: Api) -> dict[str, Any]:
        return {"id": api.name, "object": "model", "created": self.created, "owned_by": "modelserve"}

    async def list(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = {"object": "list", "data": [self.model(api) for api in self.apis.values()]}
        await send_json(send, 200, answer, request_headers(scope)[0])

    async def one(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = request_headers(scope)[0]
        api = self.apis.get(scope["path_params"]["name"])
        send = openai_errors(send)
        if api is None:
            await send_error(send, ModelNotFound(scope["path_params"]["name"], list(self.apis)), request_id)
        elif not api.ready:
            await send_error(send, api.not_ready(), request_id)
        else:
            await send_json(send, 200, self.model(api), request_id)


class ByModel:
    """One OpenAI path that several APIs share: the body's ``model`` names the API whose route answers."""

    def __init__(self, path: str, handlers: dict[str, Handler]) -> None:
        self.path = path
        self.handlers = handlers
        #: The APIs whose handler here is an `OpenAIEndpoint`, which takes the body's value as parsed here
        #: (`PARSED`); a Truss method decodes the body by its Content-Type, as its own route does.
        self.take_parsed: frozenset[str] = frozenset()
        #: The APIs sharing the path, by name (read by the OpenAPI document).
        self.apis: dict[str, Api] = {}
        self.limit = 0

    @writes_access_line
    async def post(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id, _, length, _ = request_headers(scope)
        try:
            check_length(self.limit, length)
            body = await read_body(receive, self.limit, None)
            keep = self.take_parsed
            if len(body) > DECODE_INLINE_MAX:  # as the API's own route decodes a body: in a worker thread
                model, value = await _threads.run_sync(_threads.freed_on_failure, _model_of, body, keep)
            else:
                model, value = _model_of(body, keep)
            handler = self.handlers.get(model)
            if handler is None:
                raise ModelNotFound(model, list(self.handlers))
        except Exception as exc:
            await send_error(openai_errors(send), exc, request_id)
            return
        if value is None:
            await handler(scope, _replay(body, receive), send)
            return
        parsed = scope[PARSED] = [body, value]
        del value  # held by `parsed` until the API's exchange takes it (`OpenAIEndpoint.decode`)
        try:
            await handler(scope, _replay(body, receive), send)
        finally:
            if parsed:  # refused before its decode (a 503, a 413): freed as the value would have been
                if len(body) > DECODE_INLINE_MAX:
                    _threads.submit(parsed.clear)
                else:
                    parsed.clear()


def _model_of(body: bytes, keep: Container[str]) -> tuple[str, dict[str, Any] | None]:
    """The ``model`` a request body names (a 400 for a body that cannot name one), and the body's value when that
    model is one of `keep` (else None: the value is freed where it was parsed, in a worker thread for a long one)."""
    try:
        value = loads(body)
    except orjson.JSONDecodeError as exc:
        raise OpenAIBadRequest(None, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise OpenAIBadRequest(None, f"the request body must be a JSON object, got {_kind(value)}")
    model = value.get("model")
    if not isinstance(model, str):
        raise OpenAIBadRequest("model", f"'model' must be a string, got {_kind(model)}")
    return model, value if model in keep else None


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the body already read, then the client's own messages (its disconnect)."""
    given = False

    async def replay() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def routes(server: ModelServer) -> list[Route]:
    """OpenAI's paths for the ``openai:`` APIs and the Truss methods of the server's realtime APIs."""
    by_path: dict[str, dict[str, tuple[Api, Handler]]] = {}
    served: list[Api] = []
    for api in server.apis.values():
        if api.config.kind != "realtime":
            continue
        handlers: dict[str, Handler] = {}
        if api.config.openai is not None:
            handlers[PATHS[api.config.openai]] = OpenAIEndpoint(api).post
        for method in endpoints_of(api):
            if method in TRUSS_PATHS:
                handlers.setdefault(TRUSS_PATHS[method], TrussMethod(api, method).post)
        for path, handler in handlers.items():
            by_path.setdefault(path, {})[api.name] = (api, handler)
        if handlers or api.config.truss is not None:
            served.append(api)
    if not served:
        return []
    models = Models(served)
    table = [Route("/v1/models", {"GET": models.list}), Route("/v1/models/{name}", {"GET": models.one})]
    for path, owners in by_path.items():
        if len(owners) == 1:
            (handler,) = (handler for _, handler in owners.values())
            table.append(Route(path, {"POST": handler}))
            continue
        shared = ByModel(path, {name: handler for name, (_, handler) in owners.items()})
        shared.apis = {name: api for name, (api, _) in owners.items()}
        shared.take_parsed = frozenset(
            name for name, (api, _) in owners.items() if api.config.openai and PATHS[api.config.openai] == path
        )
        shared.limit = max(api.config.max_body_size for api in shared.apis.values())
        table.append(Route(path, {"POST": shared.post}))
    return table
