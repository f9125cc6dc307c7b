"""The one HTTP exchange (modelserve.http.exchange) and its spec registry (modelserve.http.specs): every spec's
requests get the same admission, error answers, metrics and shutdown answer, and a new transport is one
Exchange subclass with its routes."""

from __future__ import annotations

import asyncio
import importlib
import json
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import modelserve
from modelserve.codecs import TEXT_TYPE
from modelserve.config import PROTOCOLS as CONFIG_PROTOCOLS
from modelserve.context import RequestContext
from modelserve.errors import BadRequest
from modelserve.http import specs
from modelserve.http.exchange import SHUTTING_DOWN, Exchange, Head, exchange_route
from modelserve.http.routing import Route, RouteTable
from tests.conftest import read_http_answer, write_project


class Echo:
    def predict(self, inputs: Any) -> Any:
        return inputs


class Shout(Exchange):
    """A transport of a few lines: a text body in, the API's answer upper-cased out."""

    def decode(self, body: bytes, head: Head, ctx: RequestContext) -> Any:
        if not body:
            raise BadRequest("say something")
        return {"text": body.decode()}

    def encode(self, result: Any, value: Any, head: Head, ctx: RequestContext) -> Any:
        return result["text"].upper().encode(), TEXT_TYPE, [(b"x-shout", b"yes")]

    post = exchange_route()


async def shout(**options: Any) -> tuple[list[httpx.Response], Any]:
    app = modelserve.create_app(handler=Echo, name="echo", **options)
    server = app.server
    server.start()
    await server.wait_loaded()
    api = server.apis["echo"]
    table = RouteTable([Route("/shout", {"POST": Shout(api).post})])
    answers = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(table), base_url="http://test") as client:
        answers.append(await client.post("/shout", content=b"hello", headers={"x-request-id": "r-1"}))
        answers.append(await client.post("/shout", content=b""))
        answers.append(await client.post("/shout", content=b"x" * 200))
    await server.close()
    return answers, api.metrics.totals()


def test_a_spec_of_a_few_lines_gets_the_exchange_steps() -> None:
    (ok, empty, large), totals = asyncio.run(shout(max_body_size=100))
    assert (ok.status_code, ok.text, ok.headers["x-shout"], ok.headers["x-request-id"]) == (200, "HELLO", "yes", "r-1")
    # The spec's 400 and the exchange's 413 (declared length over max_body_size) answer through the error map.
    assert empty.status_code == 400
    assert empty.json() == {"error": "say something", "request_id": empty.headers["x-request-id"]}
    assert large.status_code == 413 and large.headers["connection"] == "close"
    assert totals.codes == {200: 1, 400: 1, 413: 1}  # the API's metrics count every answer


def test_every_module_the_registry_names_offers_routes() -> None:
    for modules in CONFIG_PROTOCOLS.values():
        for module in modules:
            assert callable(importlib.import_module(module).routes)


def test_the_exchange_routes_write_their_own_access_line_and_the_others_are_wrapped() -> None:
    app = modelserve.create_app(handler=Echo, name="echo")
    handlers = {
        (route.path, method): handler for route in app.table.routes for method, handler in route.handlers.items()
    }
    own = {key for key, handler in handlers.items() if getattr(handler, "writes_access_line", False)}
    assert own == {
        ("/echo", "POST"),
        ("/", "POST"),
        ("/v2/models/echo/infer", "POST"),
        ("/v2/models/echo/versions/1/infer", "POST"),
    }


# ------------------------------------------------------------------------------------------------
# the shutdown answer, the same on every spec's route, through a real server

SLOW = """
class Model:
    def predict(self, inputs):
        return inputs

class Handler:
    def handle_async(self, payload, request_id):
        return payload
"""

CONFIG = """
apis:
  - name: echo
    handler: {path: model.py}
    max_concurrency: 1
    max_queue_length: 1
  - name: jobs
    kind: async
    handler: {path: model.py}
"""


def test_a_request_stopped_by_the_shutdown_gets_one_answer_on_every_route(tmp_path: Path, start_server: Any) -> None:
    root = write_project(tmp_path, {"model.py": SLOW, "modelserve.yaml": CONFIG})
    server = start_server(root, "--graceful-timeout", "1")
    server.wait_ready()
    paths = {"jobs": "/jobs", "realtime": "/echo", "v2": "/v2/models/echo/infer"}
    sockets = {}
    for name, path in paths.items():
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        # Half a body: the request is admitted and its exchange waits for the rest when the server stops.
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Request-ID: stopped-{name}\r\nContent-Length: 20\r\n"
        sock.sendall(head.encode() + b"Content-Type: application/json\r\n\r\n" + b'{"x": ')
        sockets[name] = sock
    # The realtime and V2 requests hold the echo API's whole line (one running, one waiting) once both are in
    # their exchanges: a third is refused. The job's request came first, on a connection of its own.
    deadline = time.monotonic() + 30
    while httpx.post(f"{server.url}/echo", json={}).status_code != 503:
        assert time.monotonic() < deadline
    assert server.stop() == 0
    for name, sock in sockets.items():
        answer = read_http_answer(sock)
        sock.close()
        status_line, body = answer.split(b"\r\n\r\n", 1)
        assert status_line.startswith(b"HTTP/1.1 503 "), (name, answer)
        assert json.loads(body) == {"error": SHUTTING_DOWN, "request_id": f"stopped-{name}"}
    assert server.log.count("stopped by the server's shutdown (503)") == 3
    assert "Traceback" not in server.log


@pytest.mark.parametrize("protocols", [["native"], ["v2"], ["native", "v2"]])
def test_only_the_served_protocols_have_routes(protocols: list[str]) -> None:
    app = modelserve.create_app(handler=Echo, name="echo")
    app.server.project.protocols = protocols
    paths = {route.path for route in specs.routes(app.server)}
    assert ("/echo" in paths) == ("native" in protocols)
    assert ("/v2/models/echo/infer" in paths) == ("v2" in protocols)
