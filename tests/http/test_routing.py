"""The route table (`modelserve.http.routing`): methods per route, HEAD derived from GET, JSON 404 and 405.

Unit tests of `Route` and `RouteTable` need no HTTP; the rest goes through a real server, and the same
requests through the app with user middleware added (Starlette's stack in front of the table), so that both
ways of dispatching are shown to agree.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import modelserve
from modelserve.http.routing import Route, RouteTable
from tests.conftest import write_project

MODEL = """
import asyncio
from pathlib import Path


def mark(text):
    with Path("calls.log").open("a") as log:
        log.write(text + "\\n")


class Model:
    def predict(self, inputs):
        mark("predict")
        return {"echo": inputs}


class Handler:
    async def handle_async(self, payload, request_id):
        mark("job " + request_id)
        if isinstance(payload, dict) and "sleep" in payload:
            await asyncio.sleep(payload["sleep"])
        return {"payload": payload}
"""

CONFIG = """
apis:
  - name: echo
    handler: {path: model.py, class: Model}
  - name: jobs
    kind: async
    handler: {path: model.py, class: Handler}
"""

REALTIME = "GET, HEAD, POST"
ASYNC_API = "GET, HEAD, POST"
JOB = "GET, HEAD, DELETE"

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def calls(root: Path) -> list[str]:
    path = root / "calls.log"
    return path.read_text().splitlines() if path.exists() else []


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_project(tmp_path_factory.mktemp("routing"), {"model.py": MODEL, "modelserve.yaml": CONFIG})


@pytest.fixture(scope="module")
def server(project: Path, start_server_module: Any) -> Any:
    server = start_server_module(project, "--jobs-store", "memory")
    server.wait_ready()
    return server


def jobs_counted(url: str, status: str) -> float:
    """modelserve_jobs_total for the async API and `status` (0 before the first such job)."""
    prefix = f'modelserve_jobs_total{{api="jobs",status="{status}"}} '
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return 0.0


def wait_status(url: str, job_id: str, statuses: set[str], timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = httpx.get(f"{url}/jobs/{job_id}").json()
        if body["status"] in statuses:
            return body
        assert time.monotonic() < deadline, f"job {job_id} still {body['status']} after {timeout} s"
        time.sleep(0.02)


def assert_like_get(head: httpx.Response, get: httpx.Response) -> None:
    """HEAD answers like GET without a body: same status and content type, GET's length, no body."""
    assert head.status_code == get.status_code
    assert head.headers["content-type"] == get.headers["content-type"]
    assert head.headers["content-length"] == get.headers["content-length"] == str(len(get.content))
    assert int(get.headers["content-length"]) > 0
    assert head.content == b""
    assert head.headers["x-request-id"]


# --------------------------------------------------------------------------------------------------
# HEAD changes nothing, through a real server


def test_head_on_a_realtime_api_does_not_run_predict(server: Any, project: Path) -> None:
    before = calls(project).count("predict")
    assert_like_get(httpx.head(server.url + "/echo"), httpx.get(server.url + "/echo"))
    # a POST after the HEAD is the only predict: the HEAD ran none
    assert httpx.post(server.url + "/echo", json={"x": 1}).json() == {"echo": {"x": 1}}
    assert calls(project).count("predict") == before + 1


def test_head_on_an_async_api_creates_no_job(server: Any, project: Path) -> None:
    queued = jobs_counted(server.url, "in_queue")
    jobs_run = [line for line in calls(project) if line.startswith("job ")]
    head = httpx.head(server.url + "/jobs", headers={"x-request-id": "head-must-not-submit"})
    assert_like_get(head, httpx.get(server.url + "/jobs"))
    assert jobs_counted(server.url, "in_queue") == queued
    assert httpx.get(server.url + "/jobs/head-must-not-submit").status_code == 404
    # a POST is counted where the HEAD was not
    job_id = httpx.post(server.url + "/jobs", json={"n": 1}).json()["id"]
    wait_status(server.url, job_id, {"completed"})
    assert jobs_counted(server.url, "in_queue") == queued + 1
    assert [line for line in calls(project) if line.startswith("job ")] == [*jobs_run, f"job {job_id}"]


def test_head_on_a_job_does_not_cancel_it(server: Any) -> None:
    job_id = httpx.post(server.url + "/jobs", json={"sleep": 1}).json()["id"]
    wait_status(server.url, job_id, {"in_progress"})
    head = httpx.head(f"{server.url}/jobs/{job_id}")
    assert_like_get(head, httpx.get(f"{server.url}/jobs/{job_id}"))
    assert httpx.get(f"{server.url}/jobs/{job_id}").json()["status"] == "in_progress"
    done = wait_status(server.url, job_id, {"completed", "cancelled", "failed"})
    assert done["status"] == "completed"
    assert done["result"] == {"payload": {"sleep": 1}}
    # HEAD on an ended job is no DELETE either (that would be a 409)
    assert httpx.head(f"{server.url}/jobs/{job_id}").status_code == 200


def test_head_on_an_unknown_job_is_a_404_without_a_body(server: Any) -> None:
    get = httpx.get(server.url + "/jobs/no-such-job", headers={"x-request-id": "rid-1"})
    head = httpx.head(server.url + "/jobs/no-such-job", headers={"x-request-id": "rid-1"})
    assert get.status_code == 404
    assert_like_get(head, get)


def curl_head(url: str) -> tuple[int, dict[str, str]]:
    """``curl -I``: the status and the headers (lower-case names); nothing may follow the headers."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    done = subprocess.run(["curl", "-sS", "-I", "--max-time", "10", url], capture_output=True, check=True)
    head, _, rest = done.stdout.decode("latin-1").partition("\r\n\r\n")
    assert rest == ""
    status_line, *lines = head.split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers


def test_curl_head_changes_nothing(server: Any, project: Path) -> None:
    predicts = calls(project).count("predict")
    status, headers = curl_head(server.url + "/echo")
    get = httpx.get(server.url + "/echo")
    assert (status, headers["content-type"], headers["content-length"]) == (
        200,
        get.headers["content-type"],
        get.headers["content-length"],
    )
    job_id = httpx.post(server.url + "/jobs", json={"sleep": 0.3}).json()["id"]
    wait_status(server.url, job_id, {"in_progress"})
    status, headers = curl_head(f"{server.url}/jobs/{job_id}")
    assert status == 200 and headers["content-type"] == "application/json"
    assert wait_status(server.url, job_id, {"completed", "cancelled"})["status"] == "completed"
    queued = jobs_counted(server.url, "in_queue")
    assert curl_head(server.url + "/jobs")[0] == 200
    assert jobs_counted(server.url, "in_queue") == queued
    assert calls(project).count("predict") == predicts


# --------------------------------------------------------------------------------------------------
# JSON 404 and 405, through the server and through the app with user middleware: the same answers

#: (method, path, the Allow header of the 405, or None for a 404)
WRONG = [
    *[(method, "/echo", REALTIME) for method in ("PUT", "PATCH", "OPTIONS", "DELETE")],
    *[(method, "/jobs", ASYNC_API) for method in ("PUT", "PATCH", "OPTIONS", "DELETE")],
    *[(method, "/jobs/some-job", JOB) for method in ("PUT", "PATCH", "OPTIONS", "POST")],
    ("POST", "/healthz", "GET, HEAD"),
    ("PUT", "/metrics", "GET, HEAD"),
    ("GET", "/nowhere", None),
    ("POST", "/echo/too/deep", None),
    ("HEAD", "/nowhere", None),
]


def expected_answer(method: str, path: str, allow: str | None, request_id: str) -> tuple[int, str | None, bytes]:
    if allow is None:
        error = f"no API at {path}"
        status = 404
    else:
        error = f"method {method} is not allowed on {path}; allowed: {allow}"
        status = 405
    body = b"" if method == "HEAD" else orjson.dumps({"error": error, "request_id": request_id})
    return status, allow, body


def answer_of(response: httpx.Response) -> tuple[int, str | None, bytes]:
    if response.request.method != "HEAD":
        assert response.headers["content-type"] == "application/json"
    assert response.headers["content-length"] == str(len(response.content)) or response.request.method == "HEAD"
    return response.status_code, response.headers.get("allow"), response.content


async def wrong_answers(client: httpx.AsyncClient) -> list[tuple[int, str | None, bytes]]:
    answers = []
    for index, (method, path, _) in enumerate(WRONG):
        response = await client.request(method, path, headers={"x-request-id": f"wrong-{index}"})
        assert response.headers["x-request-id"] == f"wrong-{index}"
        answers.append(answer_of(response))
    return answers


EXPECTED = [expected_answer(method, path, allow, f"wrong-{index}") for index, (method, path, allow) in enumerate(WRONG)]


async def test_wrong_methods_and_paths_through_the_server(server: Any) -> None:
    async with httpx.AsyncClient(base_url=server.url) as client:
        assert await wrong_answers(client) == EXPECTED


class Tagging:
    """User middleware: tags every answer, so that the test knows Starlette's stack was used."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-tagged", b"yes")]
            await send(message)

        await self.app(scope, receive, tagged)


@pytest.fixture
async def app_client(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[httpx.AsyncClient, Path, bool]]:
    """(client, project root, middleware?) of the app in-process, with and without user middleware."""
    monkeypatch.chdir(os.getcwd())  # create_app moves into the project folder and sets MODELSERVE_URL
    monkeypatch.syspath_prepend(os.getcwd())
    monkeypatch.setenv("MODELSERVE_URL", "unset")
    monkeypatch.delenv("MODELSERVE_URL")
    root = write_project(tmp_path / "app", {"model.py": MODEL, "modelserve.yaml": CONFIG})
    app = modelserve.create_app(root, jobs_store="memory")
    middleware = getattr(request, "param", True)
    if middleware:
        app.add_middleware(Tagging)
    await app.server.wait_loaded()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as client:
            yield client, root, middleware
    finally:
        await app.server.close()


@pytest.mark.parametrize("app_client", [True, False], ids=["middleware", "direct"], indirect=True)
async def test_wrong_methods_and_paths_through_the_app(app_client: Any) -> None:
    client, _, middleware = app_client
    assert await wrong_answers(client) == EXPECTED
    tagged = (await client.put("/echo")).headers.get("x-tagged")
    assert tagged == ("yes" if middleware else None)


async def test_head_changes_nothing_behind_user_middleware(app_client: Any) -> None:
    client, root, _ = app_client
    head = await client.head("/echo")
    assert head.headers["x-tagged"] == "yes"
    assert_like_get(head, await client.get("/echo"))
    assert_like_get(await client.head("/jobs"), await client.get("/jobs"))
    assert calls(root) == []  # neither predict nor a job ran
    job_id = (await client.post("/jobs", json={"n": 2})).json()["id"]
    deadline = time.monotonic() + 30  # bounds a failing test (200 polls, ~2 s, did; a busy machine may need more)
    while (shown := (await client.get(f"/jobs/{job_id}")).json())["status"] != "completed":
        assert time.monotonic() < deadline, shown
        await client.head(f"/jobs/{job_id}")
        await asyncio.sleep(0.01)
    assert_like_get(await client.head(f"/jobs/{job_id}"), await client.get(f"/jobs/{job_id}"))
    assert calls(root) == [f"job {job_id}"]


# --------------------------------------------------------------------------------------------------
# Route and RouteTable, no HTTP


async def get_handler(scope: Scope, receive: Receive, send: Send) -> None:
    body = f"GET {scope['path']} {scope.get('path_params', {})}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


async def post_handler(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 201, "headers": []})
    await send({"type": "http.response.body", "body": b"POSTED"})


async def delete_handler(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"DELETED"})


@pytest.mark.parametrize(
    ("methods", "allowed"),
    [
        ({"GET": get_handler}, ("GET", "HEAD")),
        ({"POST": post_handler}, ("POST",)),
        ({"POST": post_handler, "GET": get_handler}, ("GET", "HEAD", "POST")),
        ({"DELETE": delete_handler, "GET": get_handler}, ("GET", "HEAD", "DELETE")),
        ({"DELETE": delete_handler, "POST": post_handler, "GET": get_handler}, ("GET", "HEAD", "POST", "DELETE")),
    ],
)
def test_allowed_methods_come_from_the_handlers_and_head_from_get(methods: dict[str, Any], allowed: tuple) -> None:
    assert Route("/x", methods).allowed == allowed


@pytest.mark.parametrize("method", ["PUT", "PATCH", "OPTIONS", "HEAD", "get"])
def test_a_route_with_another_method_is_refused(method: str) -> None:
    with pytest.raises(ValueError, match=method):
        Route("/x", {"GET": get_handler, method: get_handler})


@pytest.mark.parametrize(
    "paths",
    [["/a", "/a"], ["/a/{id}", "/a/{other}"], ["/", "/b", "/"]],
)
def test_two_routes_for_one_path_are_refused(paths: list[str]) -> None:
    with pytest.raises(ValueError, match="two routes"):
        RouteTable(Route(path, {"GET": get_handler}) for path in paths)


def test_match_exact_paths_and_one_trailing_parameter() -> None:
    api = Route("/api", {"GET": get_handler, "POST": post_handler})
    job = Route("/api/{job_id}", {"GET": get_handler, "DELETE": delete_handler})
    root = Route("/", {"GET": get_handler})
    table = RouteTable([api, job, root])
    assert table.match("/api") == (api, {})
    assert table.match("/") == (root, {})
    assert table.match("/api/abc-123") == (job, {"job_id": "abc-123"})
    assert job.parameter == ("/api/", "job_id") and api.parameter is None
    for path in ("/api/", "/api/a/b", "/other", "/other/x", "/apix", ""):
        assert table.match(path) is None, path


async def call(app: Any, method: str, path: str, root_path: str = "") -> tuple[int, dict[str, str], bytes]:
    scope = {
        "type": "http",
        "method": method,
        "path": root_path + path,
        "root_path": root_path,
        "headers": [(b"x-request-id", b"unit")],
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start, *bodies = sent
    assert all(not body.get("more_body", False) for body in bodies[-1:])
    headers = {key.decode(): value.decode() for key, value in start["headers"]}
    return start["status"], headers, b"".join(body.get("body", b"") for body in bodies)


async def test_table_dispatch_by_method() -> None:
    table = RouteTable(
        [
            Route("/api", {"GET": get_handler, "POST": post_handler}),
            Route("/api/{job_id}", {"GET": get_handler, "DELETE": delete_handler}),
            Route("/submit", {"POST": post_handler}),
        ]
    )
    assert await call(table, "GET", "/api") == (200, {"content-length": "11"}, b"GET /api {}")
    assert (await call(table, "POST", "/api"))[::2] == (201, b"POSTED")
    assert (await call(table, "DELETE", "/api/j1"))[::2] == (200, b"DELETED")
    status, headers, body = await call(table, "GET", "/api/j1")
    assert (status, body) == (200, b"GET /api/j1 {'job_id': 'j1'}")
    # HEAD: GET's status and headers, no body
    assert await call(table, "HEAD", "/api") == (200, {"content-length": "11"}, b"")
    # no GET, no HEAD (the server drops the error's body, as for every answer to a HEAD)
    status, headers, _ = await call(table, "HEAD", "/submit")
    assert (status, headers["allow"]) == (405, "POST")
    status, headers, body = await call(table, "PUT", "/api/j1")
    assert (status, headers["allow"], headers["x-request-id"]) == (405, "GET, HEAD, DELETE", "unit")
    assert orjson.loads(body) == {
        "error": "method PUT is not allowed on /api/j1; allowed: GET, HEAD, DELETE",
        "request_id": "unit",
    }
    status, headers, body = await call(table, "GET", "/missing")
    assert (status, headers["content-type"]) == (404, "application/json")
    assert orjson.loads(body) == {"error": "no API at /missing", "request_id": "unit"}


async def test_table_dispatch_below_a_mount_point() -> None:
    table = RouteTable([Route("/api/{job_id}", {"GET": get_handler})])
    status, _, body = await call(table, "GET", "/api/j2", root_path="/ml")
    assert (status, body) == (200, b"GET /ml/api/j2 {'job_id': 'j2'}")
    status, _, body = await call(table, "DELETE", "/api/j2", root_path="/ml")
    assert status == 405 and b"on /api/j2" in body
