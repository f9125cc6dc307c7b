"""API keys (`modelserve.http.auth`, through `modelserve.http.guard`): through a real server, every route of
the route table, the probes, both headers, wrong keys, /metrics's own key, per-API auth, and the logs."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

import modelserve
from modelserve.errors import ConfigError
from modelserve.http.auth import Access, ApiKeys, KeySet, is_probe
from modelserve.http.routing import Route, RouteTable
from tests.conftest import write_project
from tests.models import LOGGED_ECHO

pytestmark = pytest.mark.slow

KEY = "k-" + "a" * 30
SECOND_KEY = "second-key-from-the-environment"
FILE_KEY = "key-from-the-file-0123456789"
METRICS_KEY = "metrics-only-key-0123456789"
WRONG_SAME_LENGTH = "k-" + "b" * 30
WRONG_OTHER_LENGTH = "short"
ENV = {"TEST_API_KEYS": f"{KEY}, {SECOND_KEY}", "TEST_METRICS_KEY": METRICS_KEY}

MODEL = LOGGED_ECHO

JOBS = """
class Handler:
    def handle_async(self, payload):
        return {"echo": payload}
"""

CONFIG = """
apis:
  - name: echo
    handler: {path: model.py}
  - name: jobs
    kind: async
    handler: {path: jobs.py, class: Handler}
auth:
  api_keys_env: TEST_API_KEYS
  api_keys_file: keys.txt
  metrics_key_env: TEST_METRICS_KEY
cors:
  allow_origins: ["http://app.example"]
"""

KEYS_FILE = f"""
# the API keys of this project, one per line
{FILE_KEY}   # a comment after a key

"""


def project(root: Path, config: str = CONFIG) -> Path:
    return write_project(root, {"model.py": MODEL, "jobs.py": JOBS, "modelserve.yaml": config, "keys.txt": KEYS_FILE})


def calls(root: Path) -> int:
    path = root / "calls.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return project(tmp_path_factory.mktemp("auth") / "project")


@pytest.fixture(scope="module")
def server(root: Path, start_server_module: Any) -> Any:
    server = start_server_module(root, "--jobs-store", "memory", env=ENV)
    server.wait_ready()
    return server


def table_of(root: Path) -> RouteTable:
    """The route table a server of `root` serves: the same project, built in this process."""
    saved = {name: os.environ.get(name) for name in [*ENV, "MODELSERVE_URL"]}
    cwd = os.getcwd()
    os.environ.update(ENV)
    try:
        return modelserve.create_app(root, jobs_store="memory").table
    finally:
        os.chdir(cwd)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def table(root: Path) -> RouteTable:
    return table_of(root)


def every_request(table: RouteTable) -> list[tuple[str, str]]:
    """(method, path) of every method of every route of the table, HEAD included; parameters filled in."""
    requests = []
    for route in table.routes:
        path = route.path.replace("{job_id}", "some-job")
        for method in route.allowed:
            requests.append((method, path))
    return requests


def test_the_table_has_every_kind_of_route(table: RouteTable) -> None:
    paths = {route.path for route in table.routes}
    assert {"/echo", "/jobs", "/jobs/{job_id}", "/metrics", "/healthz", "/readyz"} <= paths
    assert any(path.startswith("/v2/models/echo") for path in paths)  # the V2 routes, when the tree has them


def test_no_key_is_401_on_every_route_but_the_probes(server: Any, table: RouteTable, root: Path) -> None:
    before = calls(root)
    refused = 0
    for method, path in every_request(table):
        answer = httpx.request(method, server.url + path, content=b"{}", headers={"content-type": "application/json"})
        if is_probe(path):
            assert answer.status_code != 401, (method, path)
            continue
        assert answer.status_code == 401, (method, path, answer.text)
        assert answer.headers["www-authenticate"] == "Bearer"
        if method != "HEAD":
            body = answer.json()
            assert set(body) == {"error", "request_id"} and "X-API-Key" in body["error"]
        refused += 1
    assert refused > 10
    assert calls(root) == before
    for path in ("/no-such-api", "/openapi.json", "/docs", "/v2", "/v2/models/echo/infer"):
        assert httpx.get(server.url + path).status_code == 401, path


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"])
def test_the_probes_are_open(server: Any, path: str) -> None:
    assert httpx.get(server.url + path).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": f"Bearer {KEY}"},
        {"authorization": f"bearer {SECOND_KEY}"},
        {"x-api-key": KEY},
        {"x-api-key": FILE_KEY},
        {"authorization": "Basic dXNlcjpwdw==", "x-api-key": SECOND_KEY},
    ],
    ids=["bearer", "bearer-second-key", "x-api-key", "key-from-file", "x-api-key-beside-basic"],
)
def test_either_header_opens_every_route_kind(server: Any, headers: dict[str, str]) -> None:
    url = server.url
    assert httpx.post(f"{url}/echo", json={"a": 1}, headers=headers).json() == {"a": 1}
    assert httpx.get(f"{url}/echo", headers=headers).status_code == 200
    assert httpx.head(f"{url}/echo", headers=headers).status_code == 200
    job = httpx.post(f"{url}/jobs", json={"b": 2}, headers=headers)
    assert job.status_code == 200, job.text
    job_id = job.json()["id"]
    assert httpx.get(f"{url}/jobs/{job_id}", headers=headers).status_code == 200
    assert httpx.delete(f"{url}/jobs/{job_id}", headers=headers).status_code in (200, 409)
    assert httpx.get(f"{url}/metrics", headers=headers).status_code == 200
    assert httpx.get(f"{url}/v2", headers=headers).status_code == 200
    infer = {"inputs": [{"name": "x", "shape": [1], "datatype": "INT64", "data": [1]}]}
    assert httpx.post(f"{url}/v2/models/echo/infer", json=infer, headers=headers).status_code != 401


@pytest.mark.parametrize(
    "headers",
    [
        {"x-api-key": WRONG_SAME_LENGTH},
        {"x-api-key": WRONG_OTHER_LENGTH},
        {"authorization": f"Bearer {WRONG_SAME_LENGTH}"},
        {"authorization": f"Bearer {WRONG_OTHER_LENGTH}"},
        {"authorization": f"Bearer {KEY[:-1]}"},
        {"authorization": f"Bearer {KEY}x"},
        {"authorization": KEY},
        {"authorization": f"Basic {KEY}"},
        {"x-api-key": ""},
        {"x-api-key": METRICS_KEY},
    ],
    ids=[
        "same-length",
        "other-length",
        "bearer-same-length",
        "bearer-other-length",
        "prefix",
        "longer",
        "no-scheme",
        "basic",
        "empty",
        "metrics-key",
    ],
)
def test_a_wrong_key_is_401(server: Any, root: Path, headers: dict[str, str]) -> None:
    before = calls(root)
    answer = httpx.post(f"{server.url}/echo", json={"a": 1}, headers=headers)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
    assert KEY not in answer.text and WRONG_SAME_LENGTH not in answer.text
    assert calls(root) == before


def test_the_metrics_key_opens_metrics_only_and_failures_are_counted(server: Any) -> None:
    httpx.get(f"{server.url}/echo")
    httpx.get(f"{server.url}/echo", headers={"x-api-key": WRONG_SAME_LENGTH})
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    assert httpx.get(f"{server.url}/metrics", headers={"x-api-key": WRONG_OTHER_LENGTH}).status_code == 401
    metrics = httpx.get(f"{server.url}/metrics", headers={"authorization": f"Bearer {METRICS_KEY}"})
    assert metrics.status_code == 200
    samples = {line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics.text.splitlines() if line[0] != "#"}
    assert samples['modelserve_auth_failures_total{reason="missing"}'] >= 2
    assert samples['modelserve_auth_failures_total{reason="invalid"}'] >= 2
    assert httpx.get(f"{server.url}/echo", headers={"x-api-key": METRICS_KEY}).status_code == 401


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_keys_never_appear_in_the_logs(tmp_path: Path, start_server: Any, log_format: str) -> None:
    root = project(tmp_path / "project")
    server = start_server(root, "--jobs-store", "memory", "--log-level", "debug", "--log-format", log_format, env=ENV)
    server.wait_ready()
    for headers in ({"x-api-key": KEY}, {"authorization": f"Bearer {KEY}"}, {"x-api-key": WRONG_SAME_LENGTH}):
        httpx.post(f"{server.url}/echo", json={"a": 1}, headers={**headers, "x-request-id": "logged-request"})
        httpx.post(f"{server.url}/jobs", json={"a": 1}, headers=headers)
        httpx.get(f"{server.url}/metrics", headers=headers)
        httpx.get(f"{server.url}/nowhere", headers=headers)
    httpx.get(f"{server.url}/metrics", headers={"x-api-key": METRICS_KEY})
    assert server.stop() == 0
    log = server.log
    assert "logged-request" in log and "401" in log  # the requests were logged, at debug level
    for secret in (KEY, SECOND_KEY, FILE_KEY, METRICS_KEY, WRONG_SAME_LENGTH):
        assert secret not in log


def test_a_key_variable_that_is_not_set_stops_the_server_naming_it(tmp_path: Path, start_server: Any) -> None:
    server = start_server(project(tmp_path / "project"), env={"TEST_METRICS_KEY": METRICS_KEY})
    assert server.wait_exit() == 2
    assert "TEST_API_KEYS" in server.log and "is not set" in server.log


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_command_line_key_variable(tmp_path: Path, start_server: Any, workers: str) -> None:
    root = write_project(tmp_path / "project", {"model.py": MODEL})
    server = start_server(root, "--api-key-env", "CLI_KEYS", "--workers", workers, env={"CLI_KEYS": KEY})
    server.wait_ready(consecutive=10)
    assert httpx.post(f"{server.url}/model", json=1).status_code == 401
    assert httpx.post(f"{server.url}/model", json=1, headers={"x-api-key": KEY}).json() == 1
    assert httpx.get(f"{server.url}/metrics", headers={"x-api-key": KEY}).status_code == 200


# ---------------------------------------------------------------------------------------------------------
# Per-API keys: every route of a protected API, whatever its kind; the others' routes open.

PER_API = """
apis:
  - name: private
    handler: {path: model.py}
  - name: public
    handler: {path: model.py}
  - name: private-jobs
    kind: async
    handler: {path: jobs.py, class: Handler}
  - name: public-jobs
    kind: async
    handler: {path: jobs.py, class: Handler}
auth:
  api_keys_env: TEST_API_KEYS
  apis: [private, private-jobs]
"""


def test_per_api_keys_leave_no_route_of_a_protected_api_open(tmp_path: Path, start_server: Any) -> None:
    root = project(tmp_path / "project", PER_API)
    table = table_of(root)
    server = start_server(root, "--jobs-store", "memory", env=ENV)
    server.wait_ready()
    seen = {"private": 0, "public": 0}
    for route in table.routes:
        segments = set(route.path.split("/"))  # the oracle: which API a route serves, by its path
        path = route.path.replace("{job_id}", "some-job")
        for method in route.allowed:
            status = httpx.request(method, server.url + path, content=b"1").status_code
            if is_probe(path):
                assert status != 401
            elif segments & {"public", "public-jobs"}:
                assert status != 401, (method, path)
                seen["public"] += 1
            else:  # a protected API's route, or the server's own (/metrics, /v2)
                assert status == 401, (method, path)
                seen["private"] += 1
    assert seen["private"] > 8 and seen["public"] > 8
    assert httpx.post(f"{server.url}/private", json=3, headers={"x-api-key": KEY}).json() == 3


def test_a_route_of_a_protected_api_that_nobody_classified_needs_a_key() -> None:
    async def handler(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError

    keys = ApiKeys(KeySet([KEY]), KeySet([]), protected_apis=["private"])
    # A plain function (no endpoint of an API) is never taken for a public API's route...
    assert keys.access_of(Route("/public/extra", {"GET": handler}), "/public/extra") is Access.API_KEY
    # ...and a path naming a protected API needs a key whatever its handler's owner says.
    owner = type("Endpoint", (), {"api": type("Api", (), {"name": "public"})(), "get": handler})()
    assert keys.access_of(Route("/private/x", {"GET": owner.get}), "/private/x") is Access.API_KEY
    assert keys.access_of(Route("/public/x", {"GET": owner.get}), "/public/x") is Access.OPEN
    assert keys.access_of(None, "/anything") is Access.API_KEY
    assert keys.access_of(None, "/v2/health/live") is Access.OPEN
    assert keys.access_of(None, "/metrics") is Access.METRICS


def test_user_middleware_does_not_bypass_the_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from starlette.middleware.gzip import GZipMiddleware

    monkeypatch.chdir(os.getcwd())
    monkeypatch.setenv("MODELSERVE_URL", "unset")
    monkeypatch.delenv("MODELSERVE_URL")
    monkeypatch.setenv("SOME_KEYS", KEY)
    app = modelserve.create_app(write_project(tmp_path, {"model.py": MODEL}), api_key_env="SOME_KEYS")
    app.add_middleware(GZipMiddleware)

    async def scenario() -> list[int]:
        await app.server.wait_loaded()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            statuses = [
                (await client.post("/model", json=1, headers=headers)).status_code
                for headers in ({}, {"x-api-key": KEY})
            ]
        await app.server.close()
        return statuses

    assert asyncio.run(scenario()) == [401, 200]


def test_key_sets_compare_every_key() -> None:
    keys = KeySet([KEY, SECOND_KEY, KEY])
    assert len(keys) == 2
    assert keys.matches(KEY.encode()) and keys.matches(SECOND_KEY.encode())
    assert not keys.matches(WRONG_SAME_LENGTH.encode()) and not keys.matches(b"")


# ---------------------------------------------------------------------------------------------------------
# Configuration: every problem at once; keys read when the app is created, never shown.


def test_auth_and_cors_problems_are_reported_together(tmp_path: Path) -> None:
    root = write_project(
        tmp_path,
        {
            "model.py": MODEL,
            "modelserve.yaml": """
                apis:
                  - name: echo
                    handler: {path: model.py}
                auth:
                  api_keys_env: "not a name"
                  api_keys_file: missing.txt
                  apis: [echo, nope]
                  keys: [plain-text-key]
                cors:
                  allow_origins: ["*", "http://app.example/"]
                  allow_credentials: true
                  allow_methods: [GET, FETCH]
                allowed_hosts: ["api.example.com:8000", "*example.com"]
            """,
        },
    )
    with pytest.raises(ConfigError) as error:
        modelserve.create_app(root)
    message = str(error.value)
    for expected in (
        "auth: key 'api_keys_env': expected the name of an environment variable",
        "auth: key 'api_keys_file': file 'missing.txt' not found",
        "auth: key 'apis': no API is named 'nope'",
        "auth: unknown key 'keys'",
        "cors: key 'allow_origins': expected an origin like 'https://app.example.com'",
        "cors: key 'allow_methods'",
        "top level: key 'allowed_hosts'",
    ):
        assert expected in message, expected
    assert "plain-text-key" not in message


def test_credentials_with_any_origin_is_refused(tmp_path: Path) -> None:
    root = write_project(
        tmp_path,
        {
            "model.py": MODEL,
            "modelserve.yaml": """
                apis: [{name: echo, handler: {path: model.py}}]
                cors: {allow_origins: ["*"], allow_credentials: true}
            """,
        },
    )
    with pytest.raises(ConfigError, match="allow_credentials with the origin"):
        modelserve.create_app(root)


@pytest.mark.parametrize(
    ("value", "message"),
    [(None, "is not set"), (" , ", "holds no key"), ("good-key bad\x01key", "key #2 of the environment variable")],
)
def test_keys_are_read_when_the_app_is_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str | None, message: str
) -> None:
    monkeypatch.chdir(os.getcwd())
    monkeypatch.setenv("MODELSERVE_URL", "unset")
    monkeypatch.delenv("MODELSERVE_URL")
    root = write_project(tmp_path, {"model.py": MODEL})
    if value is None:
        monkeypatch.delenv("SOME_KEYS", raising=False)
    else:
        monkeypatch.setenv("SOME_KEYS", value)
    with pytest.raises(ConfigError, match=message) as error:
        modelserve.create_app(root, api_key_env="SOME_KEYS")
    assert "good-key" not in str(error.value)


def test_the_json_error_shape_of_a_401(server: Any) -> None:
    answer = httpx.get(f"{server.url}/echo", headers={"x-request-id": "req-401"})
    assert answer.status_code == 401
    assert answer.headers["x-request-id"] == "req-401"
    assert json.loads(answer.text) == {
        "error": "this route needs an API key: send Authorization: Bearer <key> or X-API-Key: <key>",
        "request_id": "req-401",
    }
