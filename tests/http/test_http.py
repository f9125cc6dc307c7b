"""The HTTP contract, through the app itself (httpx.AsyncClient over ASGITransport, no server process).

Each test builds its app with `create_app(handler=...)` or from a project folder written in tmp_path, waits
for it to load, and talks to it over ASGI. Handler classes live at module level: this module uses
``from __future__ import annotations``, so their Request annotations are strings that must be resolved.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount

import modelserve
from modelserve.http import ModelserveApp
from tests.conftest import write_project

pytestmark = pytest.mark.anyio

BASE = "http://testserver:8000"
UUID_HEX = re.compile(r"^[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}$")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """create_app changes the working directory, sys.path and MODELSERVE_URL: undo that after each test."""
    monkeypatch.chdir(os.getcwd())
    monkeypatch.syspath_prepend(os.getcwd())
    # setenv first, so that undo removes what create_app sets even when the variable did not exist.
    monkeypatch.setenv("MODELSERVE_URL", "unset")
    monkeypatch.delenv("MODELSERVE_URL")


@pytest.fixture
async def client_of() -> AsyncIterator[Any]:
    """client_of(app, wait=True) -> httpx.AsyncClient talking to `app`; by default after it has loaded."""
    clients: list[httpx.AsyncClient] = []

    async def make(app: Any, wait: bool = True) -> httpx.AsyncClient:
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE)
        clients.append(client)
        if wait:
            await app.server.wait_loaded()
        return client

    yield make
    for client in clients:
        await client.aclose()


def assert_error(answer: httpx.Response, status: int, contains: str = "") -> dict[str, Any]:
    """An error answer: the status, a JSON body of exactly {error, request_id}, the id in the header too."""
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    body = answer.json()
    assert set(body) == {"error", "request_id"}, body
    assert body["request_id"] == answer.headers["x-request-id"]
    assert contains in body["error"]
    return body


# --------------------------------------------------------------------------------------------------
# stages: every signature, sync and async, the same Request everywhere


class Echo:
    def predict(self, inputs):
        return inputs


class Traced:
    """Each stage appends what it got; sync stages must run off the event loop's thread."""

    loop_thread: int | None = None

    def preprocess(self, inputs, request: Request):
        return {"trace": [("preprocess", inputs, id(request), threading.get_ident())]}

    async def predict(self, value, request: Request):
        body = await request.body()
        value["trace"].append(("predict", body.decode(), id(request), threading.get_ident()))
        return value

    def postprocess(self, value, request: Request):
        value["trace"].append(("postprocess", None, id(request), threading.get_ident()))
        return value["trace"]


async def test_stages_chain_and_share_one_request(client_of: Any) -> None:
    client = await client_of(modelserve.create_app(handler=Traced, name="traced"))
    answer = await client.post("/traced", json={"x": 1})
    assert answer.status_code == 200, answer.text
    pre, predict, post = answer.json()
    assert pre[0] == "preprocess" and pre[1] == {"x": 1}
    assert predict[0] == "predict" and json.loads(predict[1]) == {"x": 1}  # request.body() works after parsing
    assert pre[2] == predict[2] == post[2]  # the same Request object in every stage
    loop_thread = threading.get_ident()
    assert predict[3] == loop_thread  # async stages run on the event loop
    assert pre[3] != loop_thread and post[3] != loop_thread  # sync stages never do


def make_stage(form: str, is_async: bool, tag: str) -> Any:
    """A stage of the given form that returns [tag, what it received]."""

    def describe(value: Any, request: Request | None) -> list[Any]:
        got: dict[str, Any] = {}
        if value is not None:
            got["value"] = value
        if request is not None:
            got["header"] = request.headers.get("x-tag")
        return [tag, got]

    if form == "inputs":
        if is_async:

            async def stage(self, inputs):
                return describe(inputs, None)
        else:

            def stage(self, inputs):  # type: ignore[misc]  # one variant per parametrized case
                return describe(inputs, None)
    elif form == "inputs_request":
        if is_async:

            async def stage(self, inputs, request: Request):  # type: ignore[misc]  # one variant per parametrized case
                return describe(inputs, request)
        else:

            def stage(self, inputs, request: Request):  # type: ignore[misc]  # one variant per parametrized case
                return describe(inputs, request)
    elif is_async:

        async def stage(self, request: Request):  # type: ignore[misc]  # one variant per parametrized case
            return describe(None, request)
    else:

        def stage(self, request: Request):  # type: ignore[misc]  # one variant per parametrized case
            return describe(None, request)

    return stage


# postprocess(request) alone is refused at load (see test_introspect).
STAGE_FORMS = [
    (stage, form)
    for stage in ("preprocess", "predict", "postprocess")
    for form in ("inputs", "inputs_request", "request")
    if (stage, form) != ("postprocess", "request")
]


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("stage", "form"), STAGE_FORMS)
async def test_each_stage_in_each_form(client_of: Any, stage: str, form: str, is_async: bool) -> None:
    methods: dict[str, Any] = {"predict": Echo.predict}
    methods[stage] = make_stage(form, is_async, stage)
    cls = type("Staged", (), methods)
    client = await client_of(modelserve.create_app(handler=cls, name="staged"))
    answer = await client.post("/staged", json={"n": 1}, headers={"x-tag": "t"})
    assert answer.status_code == 200, answer.text
    expected: dict[str, Any] = {}
    if form != "request":
        expected["value"] = {"n": 1}
    if form != "inputs":
        expected["header"] = "t"
    assert answer.json() == [stage, expected]


class RawRequest:
    async def predict(self, request: Request):
        return {"body": (await request.body()).decode(), "type": request.headers.get("content-type")}


async def test_the_body_is_not_parsed_when_no_stage_takes_inputs(client_of: Any) -> None:
    client = await client_of(modelserve.create_app(handler=RawRequest, name="raw"))
    answer = await client.post("/raw", content=b"{not json", headers={"content-type": "application/json"})
    assert answer.status_code == 200
    assert answer.json() == {"body": "{not json", "type": "application/json"}


# --------------------------------------------------------------------------------------------------
# payloads and results


class Kind:
    def predict(self, inputs):
        return {"type": type(inputs).__name__, "value": inputs if not isinstance(inputs, bytes) else inputs.hex()}


@pytest.mark.parametrize(
    ("headers", "content", "expected"),
    [
        ({"content-type": "application/json"}, b'{"a": 1}', {"type": "dict", "value": {"a": 1}}),
        ({"content-type": "application/merge-patch+json"}, b"[1]", {"type": "list", "value": [1]}),
        ({"content-type": "text/plain"}, "é".encode(), {"type": "str", "value": "é"}),
        ({"content-type": "text/plain; charset=latin-1"}, "é".encode("latin-1"), {"type": "str", "value": "é"}),
        ({"content-type": "image/png"}, b"\x89P", {"type": "bytes", "value": "8950"}),
        ({}, b"\x00\x01", {"type": "bytes", "value": "0001"}),
    ],
)
async def test_payload_by_content_type(
    client_of: Any, headers: dict[str, str], content: bytes, expected: dict[str, Any]
) -> None:
    client = await client_of(modelserve.create_app(handler=Kind, name="kind"))
    answer = await client.post("/kind", content=content, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.json() == expected


class Results:
    def predict(self, inputs):
        kind = inputs["kind"]
        if kind == "str":
            return "héllo"
        if kind == "bytes":
            return b"\x00\x01"
        if kind == "numpy":
            return {"scores": np.array([0.5, 0.25], dtype=np.float32), "label": np.int64(2)}
        if kind == "response":
            return PlainTextResponse("made by hand", status_code=201, headers={"x-custom": "yes"})
        if kind == "none":
            return None
        if kind == "object":
            return object()
        return [1, 2.5, True]


@pytest.mark.parametrize(
    ("kind", "status", "content_type", "body"),
    [
        ("str", 200, "application/json", '"héllo"'.encode()),  # JSON, as Truss and Cortex answer
        ("bytes", 200, "application/octet-stream", b"\x00\x01"),
        ("json", 200, "application/json", b"[1,2.5,true]"),
        ("none", 200, "application/json", b"null"),
        ("numpy", 200, "application/json", b'{"scores":[0.5,0.25],"label":2}'),
        ("response", 201, "text/plain; charset=utf-8", b"made by hand"),
    ],
)
async def test_results_by_type(client_of: Any, kind: str, status: int, content_type: str, body: bytes) -> None:
    client = await client_of(modelserve.create_app(handler=Results, name="results"))
    answer = await client.post("/results", json={"kind": kind}, headers={"x-request-id": "abc"})
    assert (answer.status_code, answer.headers["content-type"], answer.content) == (status, content_type, body)
    assert answer.headers["x-request-id"] == "abc"
    if kind == "response":
        assert answer.headers["x-custom"] == "yes"  # a Response is sent as is


async def test_an_unencodable_result_is_a_500_naming_the_type(client_of: Any, caplog: Any) -> None:
    client = await client_of(modelserve.create_app(handler=Results, name="results"))
    with caplog.at_level(logging.ERROR, logger="modelserve"):
        answer = await client.post("/results", json={"kind": "object"})
    body = assert_error(answer, 500)
    assert "object" not in body["error"]  # the client learns nothing about the code
    assert any("cannot encode a result of type builtins.object" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------------------------------
# errors: each code, always {"error", "request_id"} with X-Request-ID


async def test_400_for_an_undecodable_payload(client_of: Any) -> None:
    client = await client_of(modelserve.create_app(handler=Echo, name="echo"))
    assert_error(await client.post("/echo", content=b"{x", headers={"content-type": "application/json"}), 400, "JSON")
    answer = await client.post("/echo", content=b"abc", headers={"content-type": "text/plain; charset=nope"})
    assert_error(answer, 400, "unknown charset 'nope'")
    answer = await client.post("/echo", content=b"\xff", headers={"content-type": "text/plain"})
    assert_error(answer, 400, "not valid utf-8")


async def test_404_for_an_unknown_api(client_of: Any) -> None:
    client = await client_of(modelserve.create_app(handler=Echo, name="echo"))
    assert_error(await client.post("/nope", json={}), 404, "/nope")
    assert_error(await client.get("/nope/deeper"), 404)


async def test_405_for_a_wrong_method(client_of: Any) -> None:
    client = await client_of(modelserve.create_app(handler=Echo, name="echo"))
    assert_error(await client.put("/echo", json={}), 405, "PUT")
    assert_error(await client.delete("/echo"), 405)
    assert_error(await client.post("/healthz"), 405)


async def test_413_for_a_body_over_the_limit(client_of: Any) -> None:
    client = await client_of(modelserve.create_app(handler=Echo, name="echo", max_body_size=10))
    assert (await client.post("/echo", content=b"[1,2,3,44]", headers={"content-type": "application/json"})).json()
    assert_error(await client.post("/echo", content=b"x" * 11), 413, "limit of 10 bytes")

    async def chunks() -> AsyncIterator[bytes]:  # no content-length: the limit applies while reading
        for _ in range(4):
            yield b"xxxx"

    assert_error(await client.post("/echo", content=chunks()), 413, "limit of 10 bytes")


class Failing:
    def predict(self, inputs):
        raise ValueError("secret detail of the model")


async def test_500_for_user_code_raising_hides_the_error_and_logs_it(client_of: Any, caplog: Any) -> None:
    client = await client_of(modelserve.create_app(handler=Failing, name="failing"))
    with caplog.at_level(logging.ERROR, logger="modelserve"):
        answer = await client.post("/failing", json={}, headers={"x-request-id": "req-500"})
    body = assert_error(answer, 500)
    assert body["request_id"] == "req-500"
    assert "secret detail" not in answer.text and "Traceback" not in answer.text
    (record,) = [r for r in caplog.records if "ValueError" in r.getMessage()]
    assert "secret detail of the model" in record.getMessage()
    assert record.exc_info is not None  # the traceback goes to the log


async def test_an_error_of_ours_is_a_json_500_with_the_request_id(
    client_of: Any, caplog: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = modelserve.create_app(handler=Echo, name="echo")
    client = await client_of(app)
    pipeline = app.server.apis["echo"].backend.pipeline

    async def broken(*args: Any) -> Any:
        raise RuntimeError("a bug in modelserve")

    monkeypatch.setattr(pipeline, "run", broken)
    with caplog.at_level(logging.ERROR, logger="modelserve"):
        answer = await client.post("/echo", json={}, headers={"x-request-id": "req-bug"})
    assert assert_error(answer, 500, "internal server error")["request_id"] == "req-bug"
    assert "a bug in modelserve" not in answer.text
    assert any("a bug in modelserve" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_middleware_added_to_the_app_sees_the_api_requests(client_of: Any) -> None:
    seen: list[str] = []

    class Spy:
        def __init__(self, app: Any) -> None:
            self.app = app

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                seen.append(f"{scope['method']} {scope['path']}")
            await self.app(scope, receive, send)

    app = modelserve.create_app(handler=Echo, name="echo")
    app.add_middleware(Spy)
    client = await client_of(app)
    assert (await client.post("/echo", json={"a": 1})).json() == {"a": 1}
    assert (await client.get("/")).status_code == 200
    assert seen == ["POST /echo", "GET /"]


class Refusing:
    def predict(self, inputs):
        if inputs.get("teapot"):
            raise HTTPException(418, "I'm a teapot", headers={"x-why": "tea"})
        raise HTTPException(422, "text too long")


class FastApiRefusing:
    async def predict(self, inputs):
        from fastapi import HTTPException as FastAPIHTTPException

        raise FastAPIHTTPException(409, "already there")


async def test_http_exceptions_from_user_code_keep_status_and_detail(client_of: Any) -> None:
    client = await client_of(modelserve.create_app(handler=Refusing, name="refusing"))
    assert assert_error(await client.post("/refusing", json={}), 422)["error"] == "text too long"
    answer = await client.post("/refusing", json={"teapot": True})
    assert assert_error(answer, 418)["error"] == "I'm a teapot"
    assert answer.headers["x-why"] == "tea"


async def test_fastapi_http_exceptions_keep_status_and_detail(client_of: Any) -> None:
    pytest.importorskip("fastapi")
    client = await client_of(modelserve.create_app(handler=FastApiRefusing, name="refusing"))
    assert assert_error(await client.post("/refusing", json={}), 409)["error"] == "already there"


class SlowLoad:
    gate: asyncio.Event

    async def load(self):
        await SlowLoad.gate.wait()

    def predict(self, inputs):
        return "ready"


async def test_503_while_loading_then_ready(client_of: Any) -> None:
    SlowLoad.gate = asyncio.Event()
    app = modelserve.create_app(handler=SlowLoad, name="slow")
    client = await client_of(app, wait=False)
    assert (await client.get("/healthz")).status_code == 200
    answer = await client.get("/readyz")
    assert answer.status_code == 503 and answer.headers["retry-after"]
    assert answer.json()["apis"] == {"slow": "loading"}
    answer = await client.post("/slow", json={})
    assert_error(answer, 503, "loading")
    assert answer.headers["retry-after"]
    SlowLoad.gate.set()
    await app.server.wait_loaded()
    assert (await client.get("/readyz")).status_code == 200
    assert (await client.post("/slow", json={})).json() == "ready"


class BrokenLoad:
    def load(self):
        raise RuntimeError("weights missing")

    def predict(self, inputs):
        return inputs


async def test_503_after_a_failed_load(client_of: Any) -> None:
    errors: list[Exception] = []
    client = await client_of(modelserve.create_app(handler=BrokenLoad, name="broken", on_load_error=errors.append))
    assert len(errors) == 1 and "BrokenLoad.load() raised RuntimeError: weights missing" in str(errors[0])
    answer = await client.get("/readyz")
    assert answer.status_code == 503 and answer.json()["apis"] == {"broken": "failed"}
    assert_error(await client.post("/broken", json={}), 503, "failed to load")


class Gated:
    """predict waits for the test to open the gate, so that requests pile up."""

    started: asyncio.Queue[int]
    gate: asyncio.Event

    async def predict(self, inputs):
        Gated.started.put_nowait(inputs)
        await Gated.gate.wait()
        return inputs


async def test_503_with_retry_after_when_the_queue_is_full(client_of: Any) -> None:
    Gated.started, Gated.gate = asyncio.Queue(), asyncio.Event()
    app = modelserve.create_app(handler=Gated, name="gated", max_concurrency=1, max_queue_length=1)
    client = await client_of(app)
    running = asyncio.create_task(client.post("/gated", json=1))
    assert await Gated.started.get() == 1
    waiting = asyncio.create_task(client.post("/gated", json=2))
    limiter = app.server.apis["gated"].limiter
    while limiter.waiting == 0:  # the second request reaches the queue within a few loop turns
        await asyncio.sleep(0)
    refused = await client.post("/gated", json=3)
    assert_error(refused, 503, "retry later")
    assert refused.headers["retry-after"] == "1"
    Gated.gate.set()
    assert [(await running).json(), (await waiting).json()] == [1, 2]
    assert await Gated.started.get() == 2 and Gated.started.empty()  # the refused one never ran


class Sleepy:
    async def predict(self, inputs):
        await asyncio.sleep(inputs)
        return "done"


async def test_504_after_the_timeout(client_of: Any) -> None:
    client = await client_of(modelserve.create_app(handler=Sleepy, name="sleepy", timeout=0.05))
    # The call would sleep an hour: only the timeout can answer it before the test's own time limit.
    assert_error(await client.post("/sleepy", json=3600), 504, "timeout of 0.05 s")
    assert (await client.post("/sleepy", json=0)).json() == "done"


class BlockingSync:
    release: threading.Event

    def predict(self, inputs):
        BlockingSync.release.wait(10)
        return "late"


async def test_a_sync_stage_that_timed_out_keeps_its_slot_until_it_returns(client_of: Any) -> None:
    BlockingSync.release = threading.Event()
    app = modelserve.create_app(handler=BlockingSync, name="blocking", timeout=0.05, max_queue_length=0)
    client = await client_of(app)
    assert_error(await client.post("/blocking", json={}), 504)
    assert app.server.apis["blocking"].limiter.running == 1  # the thread still runs user code
    assert_error(await client.post("/blocking", json={}), 503)  # so max_concurrency=1 still holds
    BlockingSync.release.set()
    deadline = time.monotonic() + 5
    while app.server.apis["blocking"].limiter.running and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert (await client.post("/blocking", json={})).json() == "late"


# --------------------------------------------------------------------------------------------------
# request ids


@pytest.mark.parametrize("given", ["abc", "req-1_2.3:4", "x" * 128])
async def test_a_sane_request_id_is_kept(client_of: Any, given: str) -> None:
    client = await client_of(modelserve.create_app(handler=Echo, name="echo"))
    assert (await client.post("/echo", json={}, headers={"x-request-id": given})).headers["x-request-id"] == given
    body = assert_error(await client.post("/nope", headers={"x-request-id": given}), 404)
    assert body["request_id"] == given


@pytest.mark.parametrize("given", [None, "", "has space", "semi;colon", "x" * 129, "é"])
async def test_an_insane_request_id_is_replaced_by_a_uuid4(client_of: Any, given: str | None) -> None:
    client = await client_of(modelserve.create_app(handler=Echo, name="echo"))
    headers: dict[str, bytes] = {"x-request-id": given.encode()} if given is not None else {}
    answers = [
        await client.post("/echo", json={}, headers=headers),
        await client.post("/echo", content=b"{", headers={**headers, "content-type": "application/json"}),
        await client.get("/readyz", headers=headers),
    ]
    ids = {answer.headers["x-request-id"] for answer in answers}
    assert len(ids) == 3 and all(UUID_HEX.match(request_id) for request_id in ids)
    assert assert_error(answers[1], 400)["request_id"] in ids


# --------------------------------------------------------------------------------------------------
# routes


class Described:
    def __init__(self, config):
        self.config = config

    def preprocess(self, inputs):
        return inputs

    async def predict(self, inputs, request: Request):
        return inputs


async def test_get_describes_the_api_and_one_api_is_also_served_at_root(client_of: Any) -> None:
    app = modelserve.create_app(handler=Described, name="described", config={"b": 1, "a": 2}, timeout=3)
    client = await client_of(app)
    for path in ("/described", "/"):
        description = (await client.get(path)).json()
        assert description["name"] == "described" and description["kind"] == "realtime"
        assert description["state"] == "ready"
        assert description["config_keys"] == ["a", "b"]
        assert description["timeout"] == 3 and description["max_concurrency"] == 1
        assert description["stages"]["preprocess"] == {
            "takes_inputs": True,
            "takes_request": False,
            "async": False,
            "streams": False,
        }
        assert description["stages"]["predict"]["takes_request"] is True
        assert "postprocess" not in description["stages"]
    assert (await client.post("/", json=[7])).json() == [7]


async def test_two_apis_are_not_served_at_root(tmp_path: Path, client_of: Any) -> None:
    root = write_project(
        tmp_path / "two",
        {
            "model.py": "class Model:\n    def predict(self, inputs):\n        return inputs\n",
            "modelserve.yaml": "- {name: a, handler: {path: model.py}}\n- {name: b, handler: {path: model.py}}\n",
        },
    )
    client = await client_of(modelserve.create_app(root))
    assert (await client.post("/a", json=1)).json() == 1
    assert (await client.post("/b", json=2)).json() == 2
    assert_error(await client.post("/", json=3), 404)


# --------------------------------------------------------------------------------------------------
# the Model contract: constructor arguments, metrics_client


class Metered:
    def __init__(self, config, metrics_client):
        self.greeting = config["greeting"]
        self.metrics = metrics_client

    def predict(self, inputs):
        self.metrics.increment("greetings", tags={"lang": "en"})
        self.metrics.increment("greetings", 2, tags={"lang": "en"})
        self.metrics.gauge("queue_size", 7)
        self.metrics.histogram("name_length", len(inputs))
        return f"{self.greeting} {inputs}"


async def test_config_and_metrics_client_reach_the_constructor_and_record(client_of: Any) -> None:
    app = modelserve.create_app(handler=Metered, name="metered", config={"greeting": "hi"})
    client = await client_of(app)
    assert (await client.post("/metered", json="bob")).json() == "hi bob"
    exposition = (await client.get("/metrics")).text
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line and not line.startswith("#")
    }
    assert samples['greetings_total{lang="en"}'] == 3
    assert samples["queue_size"] == 7
    assert samples["name_length_count"] == 1 and samples["name_length_sum"] == 3
    assert samples['modelserve_requests_total{api="metered",code="200"}'] == 1


class KwargsOnly:
    def __init__(self, **kwargs):
        self.names = sorted(kwargs)

    def predict(self, inputs):
        return self.names


async def test_a_kwargs_constructor_gets_everything(client_of: Any) -> None:
    client = await client_of(modelserve.create_app(handler=KwargsOnly, name="kw"))
    names = ["config", "data_dir", "device", "environment", "lazy_data_resolver", "metrics_client", "secrets"]
    assert (await client.post("/kw", json={})).json() == names  # Truss's arguments and modelserve's


# --------------------------------------------------------------------------------------------------
# project folders: .env, working directory, MODELSERVE_URL


ENV_MODEL = """
import os

IMPORTED_WITH = {name: os.environ.get(name) for name in ("MS_TEST_FROM_FILE", "MS_TEST_BOTH")}


class Model:
    def load(self):
        with open("values.json") as f:  # relative to the project folder
            self.values = f.read()

    def predict(self, inputs):
        return {"imported_with": IMPORTED_WITH, "values": self.values, "url": os.environ.get("MODELSERVE_URL")}
"""


def env_project(tmp_path: Path) -> Path:
    return write_project(
        tmp_path / "envproject",
        {
            "model.py": ENV_MODEL,
            ".env": "MS_TEST_FROM_FILE=from-file\nMS_TEST_BOTH=from-file\n",
            "values.json": '{"w": [1, 2]}',
        },
    )


async def test_dotenv_is_loaded_without_overriding_and_files_open_by_relative_path(
    tmp_path: Path, client_of: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MS_TEST_FROM_FILE", "unset")  # then undo removes what the .env file sets
    monkeypatch.delenv("MS_TEST_FROM_FILE")
    monkeypatch.setenv("MS_TEST_BOTH", "from-environment")
    root = env_project(tmp_path)
    monkeypatch.chdir(tmp_path)  # anywhere but the project
    client = await client_of(modelserve.create_app(root, base_url="http://127.0.0.1:9999/ml/"))
    answer = (await client.post("/model", json={})).json()
    assert answer["imported_with"] == {"MS_TEST_FROM_FILE": "from-file", "MS_TEST_BOTH": "from-environment"}
    assert answer["values"] == '{"w": [1, 2]}'
    assert answer["url"] == "http://127.0.0.1:9999/ml"


async def test_mounted_under_a_prefix(tmp_path: Path, client_of: Any) -> None:
    child = modelserve.create_app(env_project(tmp_path))
    parent = Starlette(routes=[Mount("/ml", app=child)])
    client = await client_of(parent, wait=False)
    assert (await client.get("/ml/healthz")).status_code == 200  # the first request starts loading
    await child.server.wait_loaded()
    assert (await client.get("/ml/readyz")).status_code == 200
    answer = await client.post("/ml/model", json={})
    assert answer.status_code == 200
    assert answer.json()["url"] == BASE + "/ml"  # MODELSERVE_URL learnt from the first request
    assert (await client.post("/ml/", json={})).status_code == 200
    assert_error(await client.post("/ml/nope", json={}), 404)
    assert (await client.get("/ml/model")).json()["name"] == "model"


try:
    from fastapi import Request as FastApiRequest
except ImportError:  # pragma: no cover - fastapi is a dev dependency of nobody; the test is skipped then
    FastApiRequest = Request  # type: ignore[misc,assignment]


async def test_modelserve_url_without_a_port() -> None:
    child = modelserve.create_app(handler=Echo, name="echo")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=Starlette(routes=[Mount("/ml", app=child)])), base_url="http://models"
    ) as client:
        await client.get("/ml/healthz")
        await child.server.wait_loaded()
    assert os.environ["MODELSERVE_URL"] == "http://models/ml"


class FastApiModel:
    async def predict(self, inputs, request: FastApiRequest):
        return {"inputs": inputs, "path": request.url.path, "root_path": request.scope.get("root_path")}


async def test_mounted_in_fastapi_with_a_fastapi_request(client_of: Any) -> None:
    fastapi = pytest.importorskip("fastapi")
    child = modelserve.create_app(handler=FastApiModel, name="fa")
    parent = fastapi.FastAPI()
    parent.mount("/ml", child)
    client = await client_of(parent, wait=False)
    await client.get("/ml/healthz")
    await child.server.wait_loaded()
    answer = await client.post("/ml/fa", json=[1])
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"inputs": [1], "path": "/ml/fa", "root_path": "/ml"}


def test_create_app_needs_exactly_one_source() -> None:
    with pytest.raises(modelserve.ConfigError):
        modelserve.create_app()
    with pytest.raises(modelserve.ConfigError, match="unknown API option 'timout'"):
        modelserve.create_app(handler=Echo, timout=3)


def test_bad_signatures_fail_at_create_app() -> None:
    class Bad:
        def predict(self, request: Request, inputs):
            return inputs

    with pytest.raises(modelserve.LoadError, match="the request must come second"):
        modelserve.create_app(handler=Bad)


def test_create_app_returns_a_starlette_app() -> None:
    app = modelserve.create_app(handler=Echo)
    assert isinstance(app, Starlette) and isinstance(app, ModelserveApp)
