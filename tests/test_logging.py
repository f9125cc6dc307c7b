"""The log lines of a real server run: JSON fields, request ids from sync and async code, extra, access lines."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelserve import logger as user_logger
from modelserve.context import RequestContext, current
from modelserve.logs import MAX_LINE_BYTES, JSONFormatter, RequestContextFilter, TextFormatter, configure_logging
from tests.conftest import write_project

MODEL = """
    import logging

    from modelserve import logger

    library = logging.getLogger("userlib")


    class SyncModel:
        def __init__(self):
            logger.info("constructed")

        def predict(self, inputs):
            if inputs.get("big"):
                logger.info("x" * (6 * 1024 * 1024))
                return "big"
            if inputs.get("fail"):
                raise ValueError("sync failure")
            logger.info(
                "sync line",
                extra={
                    "user": "bob",
                    "model": {"name": "iris", "version": 3},
                    "asctime": "fake",
                    "levelname": "fake",
                    "message": "fake",
                    "labels": {"a": 1},
                    "process": "fake",
                    "name": "not a LogRecord attribute here",
                },
            )
            library.warning("library line")
            return "ok"


    class AsyncModel:
        async def predict(self, inputs):
            logger.warning("async line", extra={"step": 2})
            return "ok"
"""

CONFIG = """
    apis:
      - name: syncapi
        handler: {path: model.py, class: SyncModel}
      - name: asyncapi
        handler: {path: model.py, class: AsyncModel}
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path / "p", {"model.py": MODEL, "modelserve.yaml": CONFIG})


def run(start_server: Any, project: Path, *args: str) -> str:
    """Serve `project`, send the known traffic, stop, and return the server's whole output."""
    server = start_server(project, *args)
    server.wait_ready()
    calls = [("syncapi", {}, "sync-1"), ("asyncapi", {}, "async-1"), ("syncapi", {"fail": True}, "fail-1")]
    calls.append(("syncapi", {"big": True}, "big-1"))
    for api, body, request_id in calls:
        httpx.post(f"{server.url}/{api}", json=body, headers={"x-request-id": request_id})
    assert httpx.get(server.url + "/healthz").status_code == 200
    assert server.stop() == 0
    return server.log


def the(lines: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    """The one line holding `fields`."""
    found = [line for line in lines if all(line.get(key) == value for key, value in fields.items())]
    assert len(found) == 1, (fields, found)
    return found[0]


def test_json_lines_carry_fields_request_ids_and_flattened_extra(start_server: Any, project: Path) -> None:
    output = run(start_server, project, "--log-format", "json")
    raw = [line for line in output.splitlines() if line.strip()]
    assert all(len(line) <= MAX_LINE_BYTES for line in raw)
    lines = [json.loads(line) for line in raw]  # every line of the output is JSON
    for line in lines:
        assert isinstance(line, dict)
        assert {"asctime", "levelname", "message", "process"} <= set(line), line
        assert isinstance(line["process"], int)

    sync = the(lines, message="sync line")
    assert sync["levelname"] == "INFO"
    assert (sync["api"], sync["request_id"], sync["logger"]) == ("syncapi", "sync-1", "modelserve.user")
    assert sync["user"] == "bob"
    assert sync["model"] == {"name": "iris", "version": 3}  # one level: nested values stay nested
    assert "labels" not in sync
    assert sync["asctime"] != "fake" and sync["process"] != "fake"
    renamed = {key: sync[key] for key in sync if key.startswith("extra_")}
    assert renamed == {
        "extra_asctime": "fake",
        "extra_levelname": "fake",
        "extra_message": "fake",
        "extra_labels": {"a": 1},
        "extra_process": "fake",
    }
    assert sync["name"] == "not a LogRecord attribute here"

    library = the(lines, message="library line")
    assert (library["logger"], library["request_id"], library["levelname"]) == ("userlib", "sync-1", "WARNING")
    asynchronous = the(lines, message="async line")
    assert (asynchronous["api"], asynchronous["request_id"], asynchronous["step"]) == ("asyncapi", "async-1", 2)
    assert "request_id" not in the(lines, message="constructed")

    failure = the(lines, request_id="fail-1", levelname="ERROR")
    assert "ValueError: sync failure" in failure["exc_info"]
    dropped = the(lines, request_id="big-1", levelname="WARNING")
    assert "was dropped" in dropped["message"]
    assert the(lines, logger="uvicorn.error", message="Application startup complete.")


def test_json_access_lines_one_per_request(start_server: Any, project: Path) -> None:
    lines = [json.loads(line) for line in run(start_server, project, "--log-format", "json").splitlines() if line]
    expected = [("sync-1", "syncapi", 200), ("async-1", "asyncapi", 200), ("fail-1", "syncapi", 500)]
    for request_id, api, status in expected:
        access = the(lines, logger="modelserve.access", request_id=request_id)
        assert (access["method"], access["path"], access["status"], access["api"]) == ("POST", f"/{api}", status, api)
        assert 0 < access["duration"] < 10
        assert access["client"].startswith("127.0.0.1:")
    assert not [line for line in lines if line["logger"] == "uvicorn.access"]
    health = [line for line in lines if line.get("path") == "/healthz"]
    assert health and all(line["logger"] == "modelserve.access" and line["status"] == 200 for line in health)


def test_no_access_log_writes_no_access_line(start_server: Any, project: Path) -> None:
    output = run(start_server, project, "--log-format", "json", "--no-access-log")
    lines = [json.loads(line) for line in output.splitlines() if line]
    assert not [line for line in lines if line["logger"] in ("modelserve.access", "uvicorn.access")]
    assert the(lines, message="sync line")["request_id"] == "sync-1"


def test_text_lines_stay_readable(start_server: Any, project: Path) -> None:
    output = run(start_server, project)
    assert "INFO    modelserve.user: sync line [api=syncapi request_id=sync-1]" in output
    assert "WARNING userlib: library line [api=syncapi request_id=sync-1]" in output
    access = [line for line in output.splitlines() if '"POST /asyncapi HTTP/1.1" 200' in line]
    assert len(access) == 1 and access[0].endswith("[api=asyncapi request_id=async-1]")
    assert not any(line.startswith("{") for line in output.splitlines())
    assert "predict raised ValueError: sync failure [api=syncapi request_id=fail-1]\nTraceback" in output
    assert "was dropped (limit 5242880 bytes) [api=syncapi request_id=big-1]" in output
    assert all(len(line) <= MAX_LINE_BYTES for line in output.splitlines())


def test_configure_logging_turns_modelserve_access_lines_on_in_both_formats() -> None:
    def access_level(fmt: str, access_log: bool) -> str:
        return str(configure_logging("info", fmt, access_log)["loggers"]["modelserve.access"]["level"])

    assert access_level("json", True) == "INFO"
    assert access_level("text", True) == "INFO"
    assert access_level("json", False) == "WARNING"
    assert access_level("text", False) == "WARNING"


# Every answer's access line: the model calls' and every other route's, the table's 404 and 405 included.
ROUTES: list[tuple[Any, ...]] = [
    ("GET", "/healthz", None),
    ("GET", "/readyz", None),
    ("GET", "/metrics", None),
    ("GET", "/syncapi", "syncapi"),
    ("HEAD", "/syncapi", "syncapi"),
    ("GET", "/openapi.json", None),
    ("GET", "/docs", None),
    ("GET", "/v2/models/syncapi", "syncapi"),
    ("GET", "/v2/health/ready", None),
    ("GET", "/nowhere", None),
    ("PUT", "/syncapi", None),
    ("GET", "/metrics", None, {"host": "rebinding.example"}),  # refused by the guard's Host check
    ("POST", "/syncapi", "syncapi"),
    ("POST", "/v2/models/syncapi/infer", "syncapi"),
]


def every_route(
    start_server: Any, project: Path, *args: str
) -> tuple[str, list[tuple[str, str, str | None, httpx.Response]]]:
    """Serve `project`, ask each of `ROUTES` once (the last without an X-Request-ID), stop; the output and
    (method, path, api, answer) of each request."""
    server = start_server(project, *args)
    server.wait_ready()
    asked = []
    for number, (method, path, api, *more) in enumerate(ROUTES):
        headers = {"x-request-id": f"route-{number}"} if number < len(ROUTES) - 1 else {}
        headers.update(*more)
        answer = httpx.request(method, server.url + path, json={} if method == "POST" else None, headers=headers)
        asked.append((method, path, api, answer))
    assert server.stop() == 0
    return server.log, asked


def test_every_route_has_a_json_access_line_with_its_request_id_and_duration(start_server: Any, project: Path) -> None:
    output, asked = every_route(start_server, project, "--log-format", "json")
    lines = [json.loads(line) for line in output.splitlines() if line]
    assert not [line for line in lines if line["logger"] == "uvicorn.access"]
    for method, path, api, answer in asked:
        request_id = answer.headers["x-request-id"]
        access = the(lines, logger="modelserve.access", request_id=request_id)
        assert (access["method"], access["path"], access["status"]) == (method, path, answer.status_code)
        assert access.get("api") == api
        assert isinstance(access["duration"], float) and access["duration"] >= 0
    assert {answer.status_code for _, path, _, answer in asked if path == "/nowhere"} == {404}
    assert {answer.status_code for method, _, _, answer in asked if method == "PUT"} == {405}
    assert 400 in {answer.status_code for _, path, _, answer in asked if path == "/metrics"}


def test_every_route_has_a_text_access_line_with_its_request_id_and_duration(start_server: Any, project: Path) -> None:
    output, asked = every_route(start_server, project)
    access = [line for line in output.splitlines() if " modelserve.access: " in line]
    assert not [line for line in output.splitlines() if " uvicorn.access: " in line]
    for method, path, api, answer in asked:
        context = f"[api={api} request_id=" if api else "[request_id="
        (line,) = [line for line in access if line.endswith(f"{context}{answer.headers['x-request-id']}]")]
        assert f' - "{method} {path} HTTP/1.1" {answer.status_code} ' in line
        assert re.search(r"\d \d+\.\d{3} ms \[", line), line


def format_user_line(formatter: logging.Formatter, *args: Any, **kwargs: Any) -> str:
    """Log through `modelserve.logger` inside a request context and return the formatted line."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    handler.addFilter(RequestContextFilter())
    base = user_logger.logger
    old_level, old_propagate = base.level, base.propagate
    base.addHandler(handler)
    base.setLevel(logging.INFO)
    base.propagate = False
    token = current.set(RequestContext("iris", "req-7"))
    try:
        user_logger.info(*args, **kwargs)
    finally:
        current.reset(token)
        base.removeHandler(handler)
        base.setLevel(old_level)
        base.propagate = old_propagate
    (record,) = records
    return formatter.format(record)


def test_user_logger_accepts_keys_the_standard_library_refuses() -> None:
    line = json.loads(format_user_line(JSONFormatter(), "hello %s", "you", extra={"module": "m", "api": "mine"}))
    assert line["message"] == "hello you"
    assert (line["module"], line["api"], line["extra_api"], line["request_id"]) == ("m", "iris", "mine", "req-7")


def test_text_formatter_adds_the_request_context() -> None:
    line = format_user_line(TextFormatter(), "scored")
    assert line.endswith("INFO    modelserve.user: scored [api=iris request_id=req-7]")
