"""Logging: the user's logger, request context on every record, the text and JSON formats, the access line.

``from modelserve import logger`` gives user code a logger whose lines carry the API and request id of the
request being served, from sync and async code alike (the ids come from a context variable)::

    from modelserve import logger

    class Model:
        def predict(self, inputs):
            logger.info("scored", extra={"rows": len(inputs), "model": {"name": "iris", "version": 3}})

With ``--log-format json`` that line is
``{"asctime": ..., "levelname": "INFO", "message": "scored", "process": 4242, "logger": "modelserve.user",
"api": "iris", "request_id": "...", "rows": 3, "model": {"name": "iris", "version": 3}}``: the keys of
``extra`` are flattened one level into the object. An extra key named as a key modelserve writes
(``asctime``, ``levelname``, ``message``, ``process``, ``labels``, ``logger``, ``api``, ``request_id``,
``trace_id``, ``span_id``, ``exc_info``, ``stack_info``) is written as ``extra_<key>`` instead, whether or not
that line has modelserve's key. With tracing on, a line written inside a span also
has ``trace_id`` and ``span_id`` (hex, as trace back-ends show them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, MutableMapping
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import orjson

from modelserve import context

#: Name of the logger of the access lines modelserve writes itself (one per request).
ACCESS_LOGGER = "modelserve.access"
#: True while modelserve sends the start of an answer whose access line it writes itself (`modelserve.http.access`):
#: uvicorn writes its own line during that send, and `OutsideRequestFilter` leaves it out.
writing_access_line: ContextVar[bool] = ContextVar("modelserve_writing_access_line", default=False)
#: Keys of a JSON line that ``extra={...}`` may never set.
RESERVED_KEYS = frozenset({"asctime", "levelname", "message", "labels", "process"})
#: A JSON line larger than this is dropped (with a warning line instead).
MAX_LINE_BYTES = 5 * 1024 * 1024
# The record attribute that carries the ``extra`` of `logger` calls (see UserLogger).
_EXTRA_ATTR = "modelserve_extra"
# Attributes every LogRecord has; anything else on a record came from ``extra={...}`` or our filter.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "color_message",  # uvicorn's colored copy of the message
    "taskName",  # Python 3.12+
}
_CONTEXT_KEYS = ("api", "request_id", "trace_id", "span_id")

if TYPE_CHECKING:
    _Adapter = logging.LoggerAdapter[logging.Logger]
    from starlette.types import Scope

    AccessWriter = Callable[[Scope, int, float, str, str | None], None]
else:
    _Adapter = logging.LoggerAdapter


class UserLogger(_Adapter):
    """The logger of user code (``from modelserve import logger``): a `logging.LoggerAdapter`.

    Unlike a plain `logging.Logger`, it accepts any key in ``extra`` (``name``, ``process``, ``message``...
    make the standard library raise `KeyError`): the keys are carried aside and written by the JSON format,
    renamed ``extra_<key>`` where they would overwrite modelserve's own keys.
    """

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        extra = kwargs.get("extra")
        if extra:
            kwargs["extra"] = {_EXTRA_ATTR: extra}
        return msg, kwargs


#: The logger for user code: ``from modelserve import logger``.
logger = UserLogger(logging.getLogger("modelserve.user"))


class RequestContextFilter(logging.Filter):
    """Adds ``api`` and ``request_id`` to records written while a request is being served, and with tracing on
    (`modelserve.tracing`) ``trace_id`` and ``span_id`` of the span current where the record was written."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = context.current.get()
        if ctx is not None:
            if not hasattr(record, "request_id"):
                record.request_id = ctx.request_id
            if not hasattr(record, "api"):
                record.api = ctx.api
        tracing = context.tracing
        if tracing is not None and not hasattr(record, "trace_id"):
            ids = tracing.log_ids()
            if ids is not None:
                record.trace_id, record.span_id = ids
        return True


# Folders holding user code (the project folder, a Truss folder's packages): records logged from files
# there reach the root logger's handler at any level.
_user_code_dirs: list[str] = []
_LIBRARY_DIRS = ("site-packages", "dist-packages")


def add_user_code_dir(folder: str) -> None:
    """Count the files under `folder` as user code for `LibraryLevelFilter`."""
    prefix = folder.rstrip("/\\") + "/"
    if prefix not in _user_code_dirs:
        _user_code_dirs.append(prefix)
        LibraryLevelFilter.verdicts.clear()


class LibraryLevelFilter(logging.Filter):
    """On the root logger's handler: user code's lines at every level, libraries' from WARNING up.

    ``--log-level`` sets the root logger's level, so that ``logging.info(...)`` in user code is written. A
    library's logger that nobody configured inherits that level too; below WARNING its lines are dropped
    here, so that libraries keep the level they had (WARNING, Python's default) unless the user sets one
    (``logging.getLogger("httpx").setLevel(logging.INFO)``). User code is the root logger itself, the
    modules of the project (and its package folders), and any logger whose file lies in the project.
    """

    #: (logger name, file) -> whether that pair is user code.
    verdicts: dict[tuple[str, str], bool] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING or record.name == "root":
            return True
        if record.name.startswith(("modelserve_project.", "modelserve.")) or _level_set(record.name):
            return True
        key = (record.name, record.pathname)
        verdict = self.verdicts.get(key)
        if verdict is None:
            path = record.pathname.replace("\\", "/")
            verdict = any(path.startswith(folder) for folder in _user_code_dirs) and not any(
                part in path for part in _LIBRARY_DIRS
            )
            if len(self.verdicts) < 4096:
                self.verdicts[key] = verdict
        return verdict


def _level_set(name: str) -> bool:
    """True when the logger `name` or one of its parents (below the root) was given a level."""
    loggers = logging.Logger.manager.loggerDict
    while name:
        logger = loggers.get(name)
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET:
            return True
        name = name.rpartition(".")[0]
    return False


class OutsideRequestFilter(logging.Filter):
    """Lets through only the records of requests modelserve writes no access line for.

    Put on uvicorn's access logger when modelserve writes its own access lines, so that every request is
    logged once, by modelserve (with its duration and request id): a model call (inside its request
    context) and every answer of the route table (`modelserve.http.access`). What modelserve does not answer
    itself (a user's middleware, uvicorn's own 500) keeps uvicorn's line.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return context.current.get() is None and not writing_access_line.get()


class TextFormatter(logging.Formatter):
    """Readable lines for a terminal, with the API and request id when there is one::

    2026-11-22 18:45:53,123 INFO    modelserve.user: scored [api=iris request_id=5f0c...]

    The request context ends the first line (a traceback follows it). A line larger than `MAX_LINE_BYTES`
    is replaced by a warning, as in the JSON format.
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        line = super().formatMessage(record)
        request_id = getattr(record, "request_id", None)
        if request_id:
            api = getattr(record, "api", None)
            line = f"{line} [api={api} request_id={request_id}]" if api else f"{line} [request_id={request_id}]"
        return line

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if len(line) > MAX_LINE_BYTES // 4 and len(line.encode("utf-8", "replace")) > MAX_LINE_BYTES:
            record.exc_text = None
            dropped = logging.makeLogRecord(
                {
                    **vars(record),
                    "msg": f"a log line of {len(line)} characters was dropped (limit {MAX_LINE_BYTES} bytes)",
                    "args": (),
                    "levelname": "WARNING",
                    "exc_info": None,
                    "exc_text": None,
                    "stack_info": None,
                }
            )
            line = super().format(dropped)
        return line


#: Keys modelserve writes into a JSON line, on some lines only: an ``extra`` key of that name is renamed on every
#: line, so that a log pipeline never reads a user's value under one of them (nor loses it to a traceback).
_OWN_KEYS = RESERVED_KEYS | {"logger", *_CONTEXT_KEYS, "exc_info", "stack_info"}


def _put(entry: dict[str, Any], key: Any, value: Any) -> None:
    key = str(key)
    if key in _OWN_KEYS or key in entry:
        key = "extra_" + key
        if key in entry:
            return
    entry[key] = value


class JSONFormatter(logging.Formatter):
    """One JSON object per line: asctime, levelname, message, process, logger, api and request_id when
    serving a request, and the keys of ``extra={...}`` flattened one level (never over modelserve's keys).
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "asctime": self.formatTime(record, self.datefmt),
            "levelname": record.levelname,
            "message": record.getMessage(),
            "process": record.process,
            "logger": record.name,
        }
        attributes = vars(record)
        for key in _CONTEXT_KEYS:
            value = attributes.get(key)
            if value is not None:
                entry[key] = value
        for key, value in attributes.items():
            if key in _RECORD_ATTRS or key in _CONTEXT_KEYS:
                continue
            if key == _EXTRA_ATTR and isinstance(value, dict):
                for inner_key, inner_value in value.items():
                    _put(entry, inner_key, inner_value)
            else:
                _put(entry, key, value)
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        line = orjson.dumps(entry, default=repr, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
        if len(line) > MAX_LINE_BYTES:
            line = self._dropped(entry, len(line))
        return line.decode("utf-8")

    @staticmethod
    def _dropped(entry: dict[str, Any], size: int) -> bytes:
        warning = {
            "asctime": entry["asctime"],
            "levelname": "WARNING",
            "message": (
                f"a log line of {size} bytes was dropped (limit {MAX_LINE_BYTES} bytes); "
                f"it was a {entry['levelname']} line of logger {entry['logger']!r}"
            ),
            "process": entry["process"],
            "logger": "modelserve",
        }
        for key in _CONTEXT_KEYS:
            if key in entry:
                warning[key] = entry[key]
        return orjson.dumps(warning)


class JSONAccessFormatter(JSONFormatter):
    """Access lines as JSON: uvicorn's (method, path, status, client) and modelserve's own (those and
    duration, request_id, api)."""

    def format(self, record: logging.LogRecord) -> str:
        args = record.args
        if record.name == "uvicorn.access" and isinstance(args, tuple) and len(args) == 5:
            client, method, path, _version, status = args
            record.method = method
            record.path = path
            record.status = status
            record.client = client
        return super().format(record)


def access_writer() -> AccessWriter | None:
    """The function that writes an access line, or None.

    None (and no cost at all per request) unless the ``modelserve.access`` logger is enabled for INFO when
    the endpoint is created: the CLI enables it unless ``--no-access-log``. The line is
    ``127.0.0.1:52226 - "POST /iris HTTP/1.1" 200 1.234 ms`` with the fields method, path, status, duration
    (seconds), request_id, api (when the route is an API's) and client. Model calls call it after each
    answer; the other routes through `modelserve.http.access`.
    """
    access = logging.getLogger(ACCESS_LOGGER)
    if not access.isEnabledFor(logging.INFO):
        return None

    def write(scope: Scope, status: int, seconds: float, request_id: str, api: str | None) -> None:
        client = scope.get("client")
        address = f"{client[0]}:{client[1]}" if client else None
        method, path = scope["method"], scope["path"]
        fields = {
            "method": method,
            "path": path,
            "status": status,
            "duration": round(seconds, 6),
            "request_id": request_id,
            "api": api,
            "client": address,
        }
        version = scope.get("http_version", "1.1")
        line = '%s - "%s %s HTTP/%s" %d %.3f ms'
        access.info(line, address or "-", method, path, version, status, seconds * 1000, extra=fields)

    return write


def configure_logging(level: str, fmt: str, access_log: bool = True) -> dict[str, Any]:
    """The logging setup of the server (ours, the user's and uvicorn's loggers), as a dictConfig.

    ``text`` (the default) is for a person at a terminal; ``json`` makes every log line one JSON object
    (see `modelserve.logs`). Errors and warnings go to stderr, access lines to stdout. modelserve writes
    the access line of every request it answers itself, in both formats (with its duration and request id,
    `modelserve.http.access`); uvicorn's access logger keeps only what modelserve did not answer. The root
    logger gets `level` too, so that ``logging.info(...)`` in user code is written (with the request id and
    API in both formats); libraries' loggers that nobody configured stay at WARNING
    (`modelserve.logs.LibraryLevelFilter`).
    """
    level = level.upper()
    json_mode = fmt == "json"
    formatter = "modelserve.logs.JSONFormatter" if json_mode else "modelserve.logs.TextFormatter"
    access_formatter = "modelserve.logs.JSONAccessFormatter" if json_mode else "modelserve.logs.TextFormatter"
    handler = {
        "class": "logging.StreamHandler",
        "formatter": "default",
        "filters": ["request"],
        "stream": "ext://sys.stderr",
    }
    own_access = access_log
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "request": {"()": "modelserve.logs.RequestContextFilter"},
            "outside_request": {"()": "modelserve.logs.OutsideRequestFilter"},
            "libraries": {"()": "modelserve.logs.LibraryLevelFilter"},
        },
        "formatters": {"default": {"()": formatter}, "access": {"()": access_formatter}},
        "handlers": {
            "default": handler,
            "access": {**handler, "formatter": "access", "stream": "ext://sys.stdout"},
            "user": {**handler, "filters": ["request", "libraries"]},
        },
        "loggers": {
            "modelserve": {"handlers": ["default"], "level": level, "propagate": False},
            "modelserve.access": {
                "handlers": ["access"],
                # Enabled for INFO only when modelserve writes the access lines (see modelserve.logs.access_writer).
                "level": level if own_access else "WARNING",
                "propagate": False,
            },
            "uvicorn": {"handlers": ["default"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {
                "handlers": ["access"],
                "level": level,
                "propagate": False,
                "filters": ["outside_request"] if own_access else [],
            },
        },
        "root": {"handlers": ["user"], "level": level},
    }
