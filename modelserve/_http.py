"""Small raw-ASGI helpers shared by the endpoints: read a body, send an answer, send an error."""

from __future__ import annotations

from typing import Any

from starlette.types import Receive, Scope, Send

from modelserve.codecs import JSON_TYPE
from modelserve.context import sane_request_id
from modelserve.errors import HTTPError, PayloadTooLarge, error_body


class ClientGone(Exception):
    """The client disconnected while its body was being read."""


def header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def request_headers(scope: Scope) -> tuple[str, str | None, str | None, str | None]:
    """(request id, content-type, content-length, accept) from one pass over the headers."""
    request_id = content_type = content_length = accept = None
    for key, value in scope["headers"]:
        if key == b"content-type":
            content_type = value.decode("latin-1")
        elif key == b"content-length":
            content_length = value.decode("latin-1")
        elif key == b"x-request-id":
            request_id = value.decode("latin-1")
        elif key == b"accept":
            accept = value.decode("latin-1")
    return sane_request_id(request_id), content_type, content_length, accept


async def read_body(receive: Receive, limit: int, content_length: str | None) -> bytes:
    """The whole request body, or `PayloadTooLarge` as soon as it is known to exceed `limit` bytes."""
    if content_length is not None and content_length.isdigit() and int(content_length) > limit:
        raise PayloadTooLarge(f"request body of {content_length} bytes is larger than the limit of {limit} bytes")
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise PayloadTooLarge(f"request body is larger than the limit of {limit} bytes")
        return body
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body is larger than the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_body(
    send: Send,
    status: int,
    body: bytes,
    content_type: bytes,
    request_id: str,
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode()),
    ]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, value: Any, request_id: str) -> None:
    from modelserve.codecs import encode_json

    await send_body(send, status, encode_json(value), JSON_TYPE, request_id)


async def send_error(
    send: Send,
    status: int,
    message: str,
    request_id: str,
    headers: dict[str, str] | None = None,
) -> None:
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send_body(send, status, error_body(message, request_id), JSON_TYPE, request_id, extra)


async def send_http_error(send: Send, error: HTTPError, request_id: str) -> None:
    await send_error(send, error.status_code, error.message, request_id, error.headers)
