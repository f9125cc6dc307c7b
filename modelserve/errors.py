"""Every exception modelserve raises, in one tree.

* `ModelserveError`
    * `ConfigError`: the project folder, modelserve.yaml or the command line is wrong (CLI exit code 2).
    * `LoadError`: user code could not be imported, validated, constructed or loaded (CLI exit code 3).
        * `MissingExtraError`: an optional dependency is missing; the message holds the pip command.
    * `HTTPError`: the end of one call that is not a success, with the status code it is answered with.
        * `BadRequest` (400): the request is wrong; the message says what and where (a refused ``Host``,
          a refused CORS preflight too). A body that does not fit a typed stage's inputs adds ``detail``,
          one ``{loc, msg, type}`` per failing field (`modelserve.schema.invalid_body`).
        * `Unauthorized` (401, ``WWW-Authenticate: Bearer``): the route needs an API key and the request
          carries none, or a wrong one.
        * `Forbidden` (403): a WebSocket handshake from an origin or host that may not open one.
        * `NotFound` (404), `MethodNotAllowed` (405), `Conflict` (409), `PayloadTooLarge` (413).
            * `DuplicateJob` (409): a job with this id exists.
        * `BodyTimeout` (408): a body that did not come within ``--body-timeout`` (the granian edge's answer).
        * `MsgpackMissing` (415): a Truss binary body, and msgpack is not installed (the message holds the pip
          command).
        * `ServiceUnavailable` (503, ``Retry-After``): not ready, shutting down, or full.
            * `QueueFull`: too many requests wait for this API.
            * `JobQueueFull`: too many jobs wait for this API.
        * `GatewayTimeout` (504): the call ran past the API's ``timeout``.
        * `UserCodeError` (500): user code raised; `stage` and `error` say which and what, the answer only
          names the request id.
        * `ClientDisconnected` (499, never sent): the client went away; the call was cancelled.
    * `RequestCancelled`: raised between stages of a call that was cancelled (timeout, disconnect, DELETE).
    * `StreamAborted`: a stream failed after it began; the transport ends it without a clean end.
    * `HeadersTooLarge`: a request's headers pass ``--max-header-size`` (raised in the HTTP parser: a 400).
    * `EncodeError` (also a `TypeError`): a result of a type no encoder knows.
    * `StreamWithPostprocess` (also a `TypeError`): predict returned a stream where postprocess wants a value.
    * `SecretNotFound` (also a `KeyError`): user code read a secret that is not declared, or set nowhere.
    * `BatchSizeMismatch` (also a `ValueError`): a batched call returned another number of results.
    * `MetricsError` (also a `ValueError`): user code asked for a metric that cannot exist.
    * `CacheError`: a Truss ``model_cache`` or ``external_data`` entry that cannot be filled
      (``python -m modelserve.compat.truss_cache`` prints it and exits 1).

The HTTP edge turns an exception into an answer in one place (`modelserve.http.errors`); every other
transport (the async jobs worker) reads the same attributes.
"""

from __future__ import annotations

from typing import Any


def shorten(value: Any) -> str:
    """`repr(value)`, cut to 80 characters, for an error message (a name or path of any length the client sent)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class ModelserveError(Exception):
    """Base class of every exception modelserve raises on purpose."""


class ConfigError(ModelserveError):
    """The project folder, modelserve.yaml or the command line is wrong (CLI exit code 2)."""


class LoadError(ModelserveError):
    """User code could not be imported, validated, constructed or loaded (CLI exit code 3)."""


def install_hint(extra: str, *, reinstall: bool = False) -> str:
    """The pip commands that add an extra, in both forms: from a clone (what works while modelserve is not on
    the package index) and from the index. Every message that says what to install is built here::

        install_hint("onnx")
        # 'pip install -e ".[onnx]" in a clone of modelserve (pip install "modelserve[onnx]" once it is published)'
    """
    force = "--force-reinstall " if reinstall else ""
    return (
        f'pip install {force}-e ".[{extra}]" in a clone of modelserve'
        f' (pip install {force}"modelserve[{extra}]" once it is published)'
    )


#: The extra that installs a package user code may import itself, by its top-level module: a project's own
#: ``import pydantic`` that fails says what adds it (`missing_module_hint`).
EXTRA_OF_MODULE: dict[str, str] = {
    "pydantic": "schema",
    "onnxruntime": "onnx",
    "tensorflow": "tensorflow",
    "redis": "redis",
    "msgpack": "truss-binary",
    "huggingface_hub": "truss-cache",
    "opentelemetry": "tracing",
    "grpc": "grpc",
}


def missing_module_hint(exc: BaseException) -> str:
    """What to add to the message of `exc` when it is the failed import of a package one of modelserve's extras
    installs (``"; the schema extra installs pydantic. Install it with: ..."``), else ``""``."""
    name = exc.name if isinstance(exc, ModuleNotFoundError) else None  # not a name missing from a module
    extra = EXTRA_OF_MODULE.get(name or "")  # the package itself: a missing submodule is not the extra's absence
    if extra is None:
        return ""
    return f"; the {extra} extra installs {name}. Install it with: {install_hint(extra)}"


class MissingExtraError(LoadError):
    """An optional dependency is not installed; the message says which pip command adds it (`install_hint`)."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(
            f"{package} is not installed, and this project needs it. Install it with: {install_hint(extra)}"
        )
        self.package = package
        self.extra = extra


class HTTPError(ModelserveError):
    """An answer to one request that is not a success."""

    status_code = 500
    default_message = "internal server error"
    #: Fields added to the error body beside ``error`` and ``request_id`` (readiness adds the APIs' states).
    extra: dict[str, Any] | None = None

    def __init__(self, message: str | None = None, *, headers: dict[str, str] | None = None) -> None:
        self.message = message or self.default_message
        self.headers = headers or {}
        super().__init__(self.message)


class BadRequest(HTTPError):
    status_code = 400
    default_message = "bad request"


class Unauthorized(HTTPError):
    """The route needs an API key (``auth:`` in modelserve.yaml) and the request has none or a wrong one."""

    status_code = 401
    default_message = "this route needs an API key: send Authorization: Bearer <key> or X-API-Key: <key>"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message, headers={"www-authenticate": "Bearer"})


class Forbidden(HTTPError):
    status_code = 403
    default_message = "forbidden"


class NotFound(HTTPError):
    status_code = 404
    default_message = "not found"


class MethodNotAllowed(HTTPError):
    status_code = 405
    default_message = "method not allowed"

    def __init__(self, method: str, path: str, allowed: tuple[str, ...]) -> None:
        super().__init__(
            f"method {method} is not allowed on {path}; allowed: {', '.join(allowed)}",
            headers={"allow": ", ".join(allowed)},
        )


class Conflict(HTTPError):
    status_code = 409
    default_message = "conflict"


class DuplicateJob(Conflict):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"a job with id {job_id!r} already exists; send another X-Request-ID")


class BodyTimeout(HTTPError):
    """The request's body did not come within ``--body-timeout`` (granian's edge; uvicorn's closes at once)."""

    status_code = 408
    default_message = "the request body did not come within the body timeout"


class PayloadTooLarge(HTTPError):
    status_code = 413
    default_message = "request body too large"


class MsgpackMissing(HTTPError):
    """A Truss binary (msgpack) body, and msgpack is not installed."""

    status_code = 415
    default_message = f"this server cannot read msgpack bodies: {install_hint('truss-binary')}"


class ServiceUnavailable(HTTPError):
    """Not ready yet, or the queue is full: the client should retry later."""

    status_code = 503
    default_message = "service unavailable"

    def __init__(self, message: str | None = None, *, retry_after: int = 1) -> None:
        super().__init__(message, headers={"retry-after": str(retry_after)})


class QueueFull(ServiceUnavailable):
    default_message = "too many requests waiting for this API; retry later"


class JobQueueFull(ServiceUnavailable):
    def __init__(self, limit: int) -> None:
        super().__init__(f"the job queue is full ({limit} jobs waiting); retry later")


class GatewayTimeout(HTTPError):
    status_code = 504
    default_message = "request timed out"


class UserCodeError(HTTPError):
    """User code raised in `stage`: the client learns only the request id, the log gets the traceback."""

    status_code = 500
    default_message = "internal server error: user code failed; see the server log for this request id"

    def __init__(self, stage: str = "user code", error: BaseException | None = None) -> None:
        super().__init__()
        self.stage = stage
        self.error = error

    @property
    def detail(self) -> str:
        """``predict raised ValueError: bad`` (for the server log and the job document, never an answer)."""
        if self.error is None:
            return f"{self.stage} failed"
        return f"{self.stage} raised {type(self.error).__name__}: {self.error}"


#: nginx's status for a request whose client closed the connection; logged and counted, never sent.
CLIENT_CLOSED = 499


class ClientDisconnected(HTTPError):
    """The client went away (while its body was read, or while its call ran)."""

    status_code = CLIENT_CLOSED
    default_message = "client closed the connection"


class RequestCancelled(ModelserveError):
    """The call was cancelled (client gone, timeout, DELETE) before its next stage could start."""


class StreamAborted(ModelserveError):
    """Raised to the server after a failed stream, so that it ends the response without a clean end; `status` is
    the status of what ended it (499 the client left, 504 the timeout, 500 user code), for the metrics and the
    access line."""

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


class HeadersTooLarge(ModelserveError):
    """Raised in a parser callback: httptools turns it into a parser error, which uvicorn answers with 400."""


class EncodeError(ModelserveError, TypeError):
    """A result of a type that no encoder knows."""

    def __init__(self, value: Any, type_name: str | None = None) -> None:
        self.type_name = type_name or f"{type(value).__module__}.{type(value).__qualname__}"
        super().__init__(f"cannot encode a result of type {self.type_name}")


class StreamWithPostprocess(ModelserveError, TypeError):
    """Seen only at run time: a predict that returns a generator while a postprocess waits for a value."""

    def __init__(self) -> None:
        super().__init__(
            "predict returned a generator (a stream), but postprocess needs a whole value; "
            "remove postprocess or return a value from predict"
        )


class SecretNotFound(ModelserveError, KeyError):
    """A secret that was not declared, or is declared but set nowhere; the message says how to provide it."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(name)
        self.name = name
        self.message = message

    def __str__(self) -> str:
        return self.message


class BatchSizeMismatch(ModelserveError, ValueError):
    """The batched call returned a list of another length than its input."""


class MetricsError(ModelserveError, ValueError):
    """User code asked for a metric that cannot exist (bad name, reserved name, label keys changed)."""


class CacheError(ModelserveError):
    """A Truss ``model_cache`` or ``external_data`` entry that cannot be filled; the message says why."""
