"""Logging: the user's logger, request context on every record, and the text and JSON formats.

``from modelserve import logger`` gives user code a logger whose lines carry the API and request id of the
request being served, from sync and async code alike (the ids come from a context variable).
"""

from __future__ import annotations

import logging

from modelserve import context

#: The logger for user code: ``from modelserve import logger``.
logger = logging.getLogger("modelserve.user")


class RequestContextFilter(logging.Filter):
    """Adds ``api`` and ``request_id`` to records written while a request is being served."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = context.current.get()
        if ctx is not None:
            if not hasattr(record, "request_id"):
                record.request_id = ctx.request_id
            if not hasattr(record, "api"):
                record.api = ctx.api
        return True


class TextFormatter(logging.Formatter):
    """Readable lines for a terminal, with the request id when there is one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None)
        if request_id:
            line = f"{line} [api={getattr(record, 'api', '-')} request_id={request_id}]"
        return line


# Attributes every LogRecord has; anything else on a record came from ``extra={...}`` or our filter.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "color_message"}
#: Keys of a JSON line that ``extra={...}`` may not overwrite.
RESERVED_KEYS = frozenset({"asctime", "levelname", "message", "labels", "process"})
#: A JSON line larger than this is dropped (with a warning line instead).
MAX_LINE_BYTES = 5 * 1024 * 1024


class JSONFormatter(logging.Formatter):
    """One JSON object per line: asctime, levelname, message, process, api and request_id when serving a
    request, and the keys of ``extra={...}`` flattened one level (never over the reserved keys)."""

    def format(self, record: logging.LogRecord) -> str:
        import orjson

        entry: dict[str, object] = {
            "asctime": self.formatTime(record),
            "levelname": record.levelname,
            "message": record.getMessage(),
            "process": record.process,
            "logger": record.name,
        }
        for key, value in vars(record).items():
            if key in _RECORD_ATTRS or key in RESERVED_KEYS:
                continue
            if isinstance(value, dict) and key not in ("api", "request_id"):
                for inner_key, inner_value in value.items():
                    if str(inner_key) not in RESERVED_KEYS:
                        entry.setdefault(str(inner_key), inner_value)
            else:
                entry.setdefault(key, value)
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        line = orjson.dumps(entry, default=repr, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
        if len(line) > MAX_LINE_BYTES:
            warning = {
                "asctime": entry["asctime"],
                "levelname": "WARNING",
                "message": f"a log line of {len(line)} bytes was dropped (limit {MAX_LINE_BYTES} bytes)",
                "process": record.process,
                "logger": record.name,
            }
            line = orjson.dumps(warning)
        return line.decode("utf-8")


class JSONAccessFormatter(JSONFormatter):
    """uvicorn's access lines as JSON: method, path, status, plus the request id when known."""

    def format(self, record: logging.LogRecord) -> str:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5:
            client, method, path, _version, status = args
            record.client = client
            record.method = method
            record.path = path
            record.status = status
        return super().format(record)
