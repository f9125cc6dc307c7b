"""The one place where an exception becomes an HTTP answer.

`render(exc, request_id)` gives ``(status, body, headers)`` for any exception, looked up along the
exception's MRO in `HANDLERS`: modelserve's `HTTPError`s answer their own status, message and headers;
Starlette's (and FastAPI's) `HTTPException` raised by user code answers its status and detail; anything else
is a bug of ours, logged once with its traceback and answered as a generic 500. Every error body has the
same shape, ``{"error": "...", "request_id": "..."}``, and every error answer carries ``X-Request-ID``.
The realtime and jobs endpoints, the server routes, streams (the SSE ``event: error``) and the 404/405 of
the route table all answer through here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.types import Send

from modelserve._frames import release_frames
from modelserve.codecs import JSON_TYPE
from modelserve.errors import ClientDisconnected, HTTPError

logger = logging.getLogger("modelserve")

#: (status, message, headers, extra body fields)
Rendered = tuple[int, str, dict[str, str], dict[str, Any] | None]


def _http_error(exc: BaseException) -> Rendered:
    assert isinstance(exc, HTTPError)
    return exc.status_code, exc.message, exc.headers, exc.extra


def _starlette_http_exception(exc: BaseException) -> Rendered:
    assert isinstance(exc, HTTPException)
    return exc.status_code, str(exc.detail), dict(exc.headers or {}), None


def _unexpected(exc: BaseException) -> Rendered:
    logger.error("internal error: %s: %s", type(exc).__name__, exc, exc_info=exc)
    release_frames(exc)  # logged: its frames' locals can go (modelserve._frames)
    return 500, "internal server error", {}, None


HANDLERS: dict[type[BaseException], Callable[[BaseException], Rendered]] = {
    HTTPError: _http_error,
    HTTPException: _starlette_http_exception,
    BaseException: _unexpected,
}


def error_body(message: str, request_id: str, extra: dict[str, Any] | None = None) -> bytes:
    """The JSON body of every error answer."""
    body: dict[str, Any] = {"error": message, "request_id": request_id}
    if extra:
        body.update(extra)
    return orjson.dumps(body)


def render(exc: BaseException, request_id: str) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    """The answer to `exc`: status, JSON body and headers (``X-Request-ID`` included)."""
    for cls in type(exc).__mro__:
        handler = HANDLERS.get(cls)
        if handler is not None:
            break
    else:  # pragma: no cover - BaseException is in every MRO
        handler = _unexpected
    status, message, headers, extra = handler(exc)
    encoded = [(key.lower().encode("latin-1"), value.encode("latin-1")) for key, value in headers.items()]
    encoded.append((b"x-request-id", request_id.encode()))
    return status, error_body(message, request_id, extra), encoded


async def send_error(send: Send, exc: BaseException, request_id: str) -> int:
    """Answer `exc` as a whole response; returns the status (for the access log and metrics).

    A client that went away gets nothing: its status (499) is only logged and counted."""
    if isinstance(exc, ClientDisconnected):
        return exc.status_code
    status, body, headers = render(exc, request_id)
    headers[:0] = [(b"content-type", JSON_TYPE), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return status
