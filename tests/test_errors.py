"""The error contract (`modelserve.errors`, `modelserve.http.errors`): one map from exceptions to answers.

Through a real server: any `BaseException` from user code is a JSON 500 naming the request id and logged
once, and the server keeps serving; a charset that is no text encoding is a 400; a stream failing in the
middle is logged once. Then `render` itself, without HTTP.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import httpx
import orjson
import pytest
from starlette.exceptions import HTTPException

from modelserve import errors
from modelserve.http import errors as http_errors
from modelserve.http.errors import render, send_error
from tests.conftest import write_project

MODEL = """
import asyncio


def fail(inputs):
    kind = inputs.get("raise") if isinstance(inputs, dict) else None
    if kind == "SystemExit":
        raise SystemExit(3)
    if kind == "KeyboardInterrupt":
        raise KeyboardInterrupt("secret-internals")
    if kind == "ValueError":
        raise ValueError("secret-internals")
    return {"ok": inputs}


class SyncModel:
    def predict(self, inputs):
        return fail(inputs)


class AsyncModel:
    async def predict(self, inputs):
        await asyncio.sleep(0)
        return fail(inputs)


class Streamer:
    async def predict(self, inputs):
        return self.chunks(inputs)

    async def chunks(self, inputs):
        yield "first "
        await asyncio.sleep(0.01)
        fail(inputs)
        yield "last"


class Handler:
    async def handle_async(self, payload):
        return {"payload": payload}
"""

CONFIG = """
apis:
  - name: sync
    handler: {path: model.py, class: SyncModel}
  - name: async
    handler: {path: model.py, class: AsyncModel}
  - name: stream
    handler: {path: model.py, class: Streamer}
  - name: jobs
    kind: async
    handler: {path: model.py, class: Handler}
"""

GENERIC_500 = "internal server error: user code failed; see the server log for this request id"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> Any:
    root = write_project(tmp_path_factory.mktemp("errors"), {"model.py": MODEL, "modelserve.yaml": CONFIG})
    server = start_server_module(root, "--jobs-store", "memory")
    server.wait_ready()
    return server


def error_lines(server: Any, request_id: str) -> list[str]:
    return [line for line in server.log.splitlines() if " ERROR " in line and f"request_id={request_id}]" in line]


def wait_error_lines(server: Any, request_id: str, timeout: float = 5) -> list[str]:
    """The ERROR lines naming `request_id`, once there is at least one (bounded wait: the log is a file)."""
    deadline = time.monotonic() + timeout
    while not (lines := error_lines(server, request_id)):
        assert time.monotonic() < deadline, f"no ERROR line for {request_id}:\n{server.log}"
        time.sleep(0.02)
    return lines


def assert_json_error(answer: httpx.Response, status: int, request_id: str) -> str:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["x-request-id"] == request_id
    body = answer.json()
    assert set(body) == {"error", "request_id"}
    assert body["request_id"] == request_id
    message: str = body["error"]
    return message


# --------------------------------------------------------------------------------------------------
# user code raising what is not an Exception


@pytest.mark.parametrize("api", ["sync", "async"])
@pytest.mark.parametrize("raised", ["SystemExit", "KeyboardInterrupt", "ValueError"])
def test_any_base_exception_from_user_code_is_a_json_500_logged_once(server: Any, api: str, raised: str) -> None:
    request_id = f"{api}-{raised[:3].lower()}"
    answer = httpx.post(f"{server.url}/{api}", json={"raise": raised}, headers={"x-request-id": request_id})
    assert assert_json_error(answer, 500, request_id) == GENERIC_500
    assert "secret-internals" not in answer.text and raised not in answer.text
    # the server keeps serving, on the same API
    assert httpx.post(f"{server.url}/{api}", json={"n": 1}).json() == {"ok": {"n": 1}}
    (line,) = wait_error_lines(server, request_id)
    assert f"predict raised {raised}" in line
    log = server.log
    after = log[log.index(line) :]
    assert "Traceback (most recent call last)" in after  # with its traceback
    assert "Exception in ASGI application" not in after
    assert server.process.poll() is None


# --------------------------------------------------------------------------------------------------
# charsets that are no text encoding


@pytest.mark.parametrize("charset", ["rot13", "base64", "undefined", "zlib", "hex"])
@pytest.mark.parametrize("api", ["sync", "jobs"])
def test_a_charset_that_is_no_text_encoding_is_a_400_naming_it(server: Any, api: str, charset: str) -> None:
    request_id = f"charset-{api}-{charset}"
    answer = httpx.post(
        f"{server.url}/{api}",
        content=b"hello",
        headers={"content-type": f"text/plain; charset={charset}", "x-request-id": request_id},
    )
    assert charset in assert_json_error(answer, 400, request_id)
    assert error_lines(server, request_id) == []  # a client's mistake, no traceback
    if api == "jobs":
        assert httpx.get(f"{server.url}/jobs/{request_id}").status_code == 404  # no job was created
    good = httpx.post(f"{server.url}/{api}", content=b"hello", headers={"content-type": "text/plain; charset=utf-8"})
    assert good.status_code == 200


# --------------------------------------------------------------------------------------------------
# a stream failing in the middle


@pytest.mark.parametrize("raised", ["ValueError", "SystemExit"])
def test_an_sse_stream_failing_in_the_middle_ends_with_an_error_event_logged_once(server: Any, raised: str) -> None:
    request_id = f"sse-{raised[:3].lower()}"
    answer = httpx.post(
        f"{server.url}/stream",
        json={"raise": raised},
        headers={"x-request-id": request_id, "accept": "text/event-stream"},
    )
    assert answer.text.startswith("data: first \n\nevent: error\ndata: ")
    error = orjson.loads(answer.text.split("event: error\ndata: ", 1)[1])
    assert error == {"error": GENERIC_500, "request_id": request_id}
    assert httpx.post(f"{server.url}/stream", json={}).text == "first last"  # still serving
    assert_logged_once(server, request_id, f"the stream raised {raised}: ")


@pytest.mark.parametrize("raised", ["ValueError", "SystemExit"])
def test_a_plain_stream_failing_in_the_middle_is_aborted_and_logged_once(server: Any, raised: str) -> None:
    request_id = f"stream-{raised[:3].lower()}"
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(f"{server.url}/stream", json={"raise": raised}, headers={"x-request-id": request_id})
    assert httpx.post(f"{server.url}/stream", json={}).text == "first last"  # still serving
    assert_logged_once(server, request_id, f"the stream raised {raised}: ")


def assert_logged_once(server: Any, request_id: str, text: str) -> None:
    """One ERROR line for the request, and neither our abort nor uvicorn's line for it after that."""
    (line,) = wait_error_lines(server, request_id)
    assert text in line
    # give a second line (ours, or uvicorn's, which has no request id) the time the next request took
    log = server.log
    after = log[log.index(line) + len(line) :]
    assert error_lines(server, request_id) == [line]
    assert f"stream of request {request_id} failed" not in log
    assert "unexpected error" not in log
    assert "Exception in ASGI application" not in after


# --------------------------------------------------------------------------------------------------
# render, no HTTP


class Teapot(errors.HTTPError):
    status_code = 418
    default_message = "I'm a teapot"


class ShortTeapot(Teapot):
    pass


class ValueAndHTTP(errors.BadRequest, ValueError):
    pass


class Refused(HTTPException):
    pass


def rendered(exc: BaseException, request_id: str = "rid") -> tuple[int, dict[str, Any], dict[str, str]]:
    status, body, headers = render(exc, request_id)
    decoded = {key.decode("latin-1"): value.decode("latin-1") for key, value in headers}
    assert len(decoded) == len(headers)
    assert decoded["x-request-id"] == request_id
    return status, orjson.loads(body), decoded


@pytest.mark.parametrize(
    ("exc", "status", "message", "headers"),
    [
        (Teapot(), 418, "I'm a teapot", {}),
        (ShortTeapot("short and stout", headers={"X-Spout": "yes"}), 418, "short and stout", {"x-spout": "yes"}),
        (ValueAndHTTP("bad row 3"), 400, "bad row 3", {}),
        (errors.QueueFull(), 503, errors.QueueFull.default_message, {"retry-after": "1"}),
        (errors.ServiceUnavailable("loading", retry_after=30), 503, "loading", {"retry-after": "30"}),
        (
            errors.MethodNotAllowed("PUT", "/x", ("GET", "HEAD")),
            405,
            "method PUT is not allowed on /x; allowed: GET, HEAD",
            {"allow": "GET, HEAD"},
        ),
        (errors.GatewayTimeout("slow"), 504, "slow", {}),
        (errors.PayloadTooLarge(), 413, "request body too large", {}),
        (errors.UserCodeError("predict", ValueError("secret-internals")), 500, GENERIC_500, {}),
        (HTTPException(409, "already there"), 409, "already there", {}),
        (Refused(403, "no", headers={"WWW-Authenticate": "Bearer"}), 403, "no", {"www-authenticate": "Bearer"}),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else None,
)
def test_render_answers_the_status_message_and_headers(
    exc: BaseException, status: int, message: str, headers: dict[str, str]
) -> None:
    got_status, body, got_headers = rendered(exc, "rid-7")
    assert got_status == status
    assert body == {"error": message, "request_id": "rid-7"}
    assert got_headers == {**headers, "x-request-id": "rid-7"}


def test_readiness_extra_fields_join_the_body() -> None:
    not_ready = errors.ServiceUnavailable("loading")
    not_ready.extra = {"apis": {"m": "loading"}}
    assert rendered(not_ready)[1] == {"error": "loading", "request_id": "rid", "apis": {"m": "loading"}}


@pytest.mark.parametrize("exc", [RuntimeError("secret-internals"), KeyError("secret-internals"), SystemExit(2)])
def test_an_unexpected_exception_is_a_generic_500_logged_with_its_traceback(
    exc: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    try:
        raise exc
    except BaseException as raised:  # noqa: B036 - the test raises it to give it a traceback
        with caplog.at_level(logging.ERROR, logger="modelserve"):
            status, body, headers = rendered(raised)
    assert (status, body, headers) == (
        500,
        {"error": "internal server error", "request_id": "rid"},
        {"x-request-id": "rid"},
    )
    (record,) = [record for record in caplog.records if record.name == "modelserve"]
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None and record.exc_info[1] is exc


def test_the_handler_is_looked_up_along_the_mro(monkeypatch: pytest.MonkeyPatch) -> None:
    class Odd(ValueError):
        pass

    monkeypatch.setitem(http_errors.HANDLERS, ValueError, lambda exc: (422, f"odd: {exc}", {"x-odd": "1"}, None))
    assert rendered(Odd("this"))[:2] == (422, {"error": "odd: this", "request_id": "rid"})
    # a modelserve error that is also a ValueError: HTTPError comes first in its MRO
    assert rendered(ValueAndHTTP("bad"))[0] == 400
    # other exceptions still end at BaseException's handler
    assert rendered(LookupError("x"))[0] == 500


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_client_that_went_away_gets_nothing(anyio_backend: str) -> None:
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    assert await send_error(send, errors.ClientDisconnected(), "rid") == 499
    assert sent == []
    assert await send_error(send, Teapot(), "rid") == 418
    assert sent[0]["status"] == 418
    assert (b"content-type", b"application/json") in sent[0]["headers"]
    assert orjson.loads(sent[1]["body"]) == {"error": "I'm a teapot", "request_id": "rid"}


def test_every_exception_lives_in_the_errors_module() -> None:
    tree = errors.__doc__ or ""
    classes = [
        value
        for value in vars(errors).values()
        if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == errors.__name__
    ]
    assert len(classes) >= 20
    for cls in classes:
        assert issubclass(cls, errors.ModelserveError), cls
        assert re.search(rf"`{cls.__name__}`", tree), f"{cls.__name__} is missing from the tree in the docstring"


# --------------------------------------------------------------------------------------------------
# one exceptions module


def _exceptions_outside_errors_py() -> list[str]:
    """Public exception classes defined anywhere in the package but `modelserve.errors`."""
    import ast
    from pathlib import Path

    import modelserve

    package = Path(modelserve.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "errors.py" and path.parent == package or "_shims" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = {ast.unparse(base).rpartition(".")[2] for base in node.bases}
            if any(base.endswith(("Error", "Exception")) or base == "KeyError" for base in bases):
                found.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name}")
    return found


def test_every_public_exception_is_defined_in_the_errors_module() -> None:
    assert _exceptions_outside_errors_py() == []


def test_an_unknown_result_type_raises_the_documented_encode_error() -> None:
    from modelserve.codecs import encode_result

    with pytest.raises(errors.EncodeError, match=r"cannot encode a result of type builtins\.object"):
        encode_result(object())
