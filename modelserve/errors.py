"""The exceptions modelserve raises, and the one place that turns them into HTTP answers.

Two families:

* set-up errors (`ConfigError`, `LoadError`) stop a project from being served; the CLI turns them into
  exit codes 2 and 3;
* `HTTPError` and its subclasses are answers to one request, rendered as
  ``{"error": "...", "request_id": "..."}`` with their status code.
"""

from __future__ import annotations

import orjson


class ModelserveError(Exception):
    """Base class of every exception modelserve raises on purpose."""


class ConfigError(ModelserveError):
    """The project folder, modelserve.yaml or the command line is wrong (CLI exit code 2)."""


class LoadError(ModelserveError):
    """User code could not be imported, validated, constructed or loaded (CLI exit code 3)."""


class MissingExtraError(LoadError):
    """An optional dependency is not installed; the message says which pip command adds it."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(
            f'{package} is not installed, and this project needs it. Install it with: pip install "modelserve[{extra}]"'
        )
        self.package = package
        self.extra = extra


class HTTPError(ModelserveError):
    """An answer to one request that is not a success."""

    status_code = 500
    default_message = "internal server error"

    def __init__(self, message: str | None = None, *, headers: dict[str, str] | None = None) -> None:
        self.message = message or self.default_message
        self.headers = headers or {}
        super().__init__(self.message)


class BadRequest(HTTPError):
    status_code = 400
    default_message = "bad request"


class NotFound(HTTPError):
    status_code = 404
    default_message = "not found"


class Conflict(HTTPError):
    status_code = 409
    default_message = "conflict"


class PayloadTooLarge(HTTPError):
    status_code = 413
    default_message = "request body too large"


class ServiceUnavailable(HTTPError):
    """Not ready yet, or the queue is full: the client should retry later."""

    status_code = 503
    default_message = "service unavailable"

    def __init__(self, message: str | None = None, *, retry_after: int = 1) -> None:
        super().__init__(message, headers={"retry-after": str(retry_after)})


class GatewayTimeout(HTTPError):
    status_code = 504
    default_message = "request timed out"


class UserCodeError(HTTPError):
    """User code raised: the client learns only the request id, the log gets the traceback."""

    status_code = 500
    default_message = "internal server error: user code failed; see the server log for this request id"


def error_body(message: str, request_id: str) -> bytes:
    """The JSON body of every error answer."""
    return orjson.dumps({"error": message, "request_id": request_id})
