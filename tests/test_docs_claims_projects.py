"""What docs/projects.md, docs/embedding.md, docs/openapi.md and docs/beyond-loopback.md promise, held to the real
thing: the command line run as a subprocess, real uvicorn servers on free loopback ports, httpx.

Two servers are shared by the module: beyond-loopback.md's own configuration (API keys from a variable and a
file, a metrics key, CORS, allowed_hosts) over a realtime and an async API, and a lone ``model.py`` with a
``.env``. A claim about starting a process (an exit code, a warning, ``serve``, a parent app under uvicorn) starts
its own; what ``create_app`` checks and fills in is asked of it in the test's process.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.routing import Mount
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin, Subprotocol

import modelserve
from modelserve.config import ApiConfig, BatchingConfig, load_project_config
from tests.conftest import Server, free_port, write_project
from tests.test_readme import blocks, page, section

ECHO = """
class Model:
    def predict(self, inputs):
        return inputs


class Job:
    def handle_async(self, payload, request_id):
        return payload
"""
API_KEY, FILE_KEY, METRICS_KEY = "k-from-the-variable", "k-from-the-file", "k-for-metrics"
ALLOWED = "https://app.example.com"


# beyond-loopback.md's configuration, as the page writes it


@pytest.fixture(scope="module")
def guarded(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The page's modelserve.yaml, its `apis:` added: `iris` (the one `auth: apis` protects), `other`, `jobs`."""
    (block,) = blocks(section(page("beyond-loopback.md"), "Configuration"), "yaml")
    config = yaml.safe_load(block)
    config["apis"] = [
        {"name": "iris", "handler": {"path": "model.py", "class": "Model"}},
        {"name": "other", "handler": {"path": "model.py", "class": "Model"}},
        {"name": "jobs", "kind": "async", "handler": {"path": "model.py", "class": "Job"}},
    ]
    root = write_project(
        tmp_path_factory.mktemp("guarded") / "project",
        {"model.py": ECHO, "modelserve.yaml": yaml.safe_dump(config), "keys.txt": f"# the team's key\n{FILE_KEY}\n"},
    )
    env = {config["auth"]["api_keys_env"]: API_KEY, config["auth"]["metrics_key_env"]: METRICS_KEY}
    server: Server = start_server_module(root, env=env)
    server.wait_ready()
    yield server


def test_the_pages_configuration_is_served_as_written(guarded: Server) -> None:
    """Its `expose_headers: []` (the default it shows) stopped the server at start (exit 2)."""
    with httpx.Client(base_url=guarded.url) as client:
        assert client.post("/iris", json=[1]).status_code == 401
        assert client.post("/iris", json=[1], headers={"authorization": f"Bearer {API_KEY}"}).json() == [1]
        assert client.post("/iris", json=[1], headers={"x-api-key": FILE_KEY}).json() == [1]
        assert client.post("/other", json=[2]).json() == [2]  # apis: [iris] leaves the others open
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"x-api-key": METRICS_KEY}).status_code == 200
        assert client.post("/iris", json=[1], headers={"x-api-key": METRICS_KEY}).status_code == 401

        preflight = client.options("/iris", headers={"origin": ALLOWED, "access-control-request-method": "POST"})
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == ALLOWED
        assert preflight.headers["access-control-max-age"] == "600"
        answer = client.post("/other", json=[3], headers={"origin": ALLOWED})
        assert answer.headers["access-control-allow-origin"] == ALLOWED
        assert answer.headers["access-control-expose-headers"] == "X-Request-ID, Inference-Header-Content-Length"

        for host, status in [("api.example.com", 200), ("a.models.example.com", 200), ("evil.example", 400)]:
            assert client.post("/other", json=[4], headers={"host": host}).status_code == status, host


@pytest.mark.parametrize("origin", [ALLOWED, None])
def test_a_refused_host_varies_by_origin_as_every_answer_does(guarded: Server, origin: str | None) -> None:
    """beyond-loopback.md: Vary: Origin on every answer when the origins are listed, and an allowed origin reads
    the error answers; the Host check's 400 went out before CORS had a say. (Two Host headers, which no browser
    sends, are answered by the transport before the app: tests/http/test_guard.py.)"""
    headers = {"host": "evil.example"} if origin is None else {"host": "evil.example", "origin": origin}
    answer = httpx.post(guarded.url + "/other", json=[1], headers=headers)
    assert answer.status_code == 400 and "allowed_hosts" in answer.json()["error"]
    assert "Origin" in answer.headers.get_list("vary")
    assert answer.headers.get("access-control-allow-origin") == origin


def test_a_browser_websocket_sends_its_key_as_a_subprotocol_from_an_allowed_origin(guarded: Server) -> None:
    """beyond-loopback.md: a browser's WebSocket carries its key as ``bearer.<key>``, and its handshake is
    checked against allow_origins, which browsers do not do for WebSockets."""
    url = guarded.url.replace("http://", "ws://") + "/iris/ws"
    with connect(url, origin=Origin(ALLOWED), subprotocols=[Subprotocol(f"bearer.{API_KEY}")]) as socket:
        socket.send("[1, 2]")
        assert json.loads(socket.recv(timeout=30)) == [1, 2]
    for origin, status in [("https://evil.example", 403), (ALLOWED, 401)]:  # 401: no key
        with pytest.raises(InvalidStatus) as refused:
            connect(url, origin=Origin(origin)).close()
        assert refused.value.response.status_code == status


def test_an_async_submit_that_cannot_be_decoded_is_a_400_the_document_lists(guarded: Server) -> None:
    """openapi.md: each operation lists what it can answer; POST /<api> of an async API left out its 400."""
    key = {"x-api-key": API_KEY}
    with httpx.Client(base_url=guarded.url, headers=key) as client:
        answer = client.post("/jobs", content=b"{not json", headers={"content-type": "application/json"})
        assert answer.status_code == 400 and "not valid JSON" in answer.json()["error"]
        document = client.get("/openapi.json").json()
    assert set(document["paths"]["/jobs"]["post"]["responses"]) >= {"400", "409", "413"}


# projects.md: a lone model.py, and what its code finds before it runs


LONE = """
import os
import sys
import threading

from helper import VALUE


class Model:
    def predict(self, inputs):
        return {
            "cwd": os.getcwd(),
            "first_on_path": sys.path[0],
            "url": os.environ.get("MODELSERVE_URL"),
            "from_file": os.environ.get("TEST_FROM_FILE"),
            "overridden": os.environ.get("TEST_OVERRIDDEN"),
            "helper": VALUE,
            "main_thread": threading.current_thread() is threading.main_thread(),
        }
"""


@pytest.fixture(scope="module")
def lone(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    files = {
        "model.py": LONE,
        "helper.py": "VALUE = 42\n",
        ".env": "TEST_FROM_FILE=file\nTEST_OVERRIDDEN=file\n",
    }
    root = write_project(tmp_path_factory.mktemp("lone") / "project", files).resolve()
    server: Server = start_server_module(root, env={"TEST_OVERRIDDEN": "environment"})
    server.wait_ready()
    yield server, root


def test_a_lone_model_py_is_the_api_model_run_as_the_page_says(lone: tuple[Server, Path]) -> None:
    server, root = lone
    answer = httpx.post(server.url + "/model", json={})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "cwd": str(root),  # the project folder is the working directory
        "first_on_path": str(root),  # and first on sys.path: user files import each other
        "url": server.url,
        "from_file": "file",  # .env is loaded
        "overridden": "environment",  # variables already set win over the file
        "helper": 42,
        "main_thread": False,  # a sync stage runs in a worker thread
    }


# projects.md: which folder is which project, and the exits of one that is none


PREDICT = "\n    def predict(self, inputs):\n        return inputs\n"


def run_cli(project: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelserve", str(project), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("files", "code", "message"),
    [
        ({}, 2, "has neither modelserve.yaml nor a model.py with a class Model"),
        ({"model.py": "class Foo:\n    pass\n"}, 3, "model.py: no class 'Model' (classes found: Foo)"),
        (
            {"model.py": "class Model:\n    def __init__(self):\n        raise ValueError('boom')\n" + PREDICT},
            3,
            "model.py:Model: Model() raised ValueError: boom (model.py, line 3)",
        ),
        # A Truss without its model file, and no model.py beside: told what it lacks.
        (
            {"config.yaml": "model_name: sentiment\n", "model/weights.txt": "0.5\n"},
            2,
            "the model class file 'model/model.py' was not found",
        ),
    ],
    ids=["empty", "no-class-Model", "init-raises", "truss-without-its-model"],
)
def test_a_folder_that_cannot_be_served_exits_with_the_pages_code(
    tmp_path: Path, files: dict[str, str], code: int, message: str
) -> None:
    done = run_cli(write_project(tmp_path / "project", files))
    assert done.returncode == code, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("own", [{}, {"modelserve.yaml": "apis: [{name: model, handler: {path: model.py}}]\n"}])
def test_a_lone_model_py_beside_a_model_folder_and_a_config_yaml_is_served(tmp_path: Path, own: dict[str, str]) -> None:
    """projects.md: a config.yaml of the project's own settings and a model/ folder of weights made the folder a
    Truss, and its model.py was not served (exit 2: 'model/model.py' not found)."""
    files = {"config.yaml": "learning_rate: 0.1\n", "model/weights.txt": "0.5\n", "model.py": ECHO, **own}
    (api,) = load_project_config(write_project(tmp_path / "project", files)).apis
    assert (api.name, api.handler and api.handler.path, api.truss) == ("model", "model.py", None)


# embedding.md: create_app(handler=...)'s options are modelserve.yaml's keys, checked the same way


class Echo:
    def predict(self, inputs: Any) -> Any:
        return inputs


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        # Each was taken as given: 0 left every request waiting, strings were 500s on the first request.
        ({"max_concurrency": 0}, "key 'max_concurrency': expected a positive integer, got 0"),
        ({"max_concurrency": "4"}, "key 'max_concurrency': expected a positive integer, got '4'"),
        ({"timeout": "10"}, "key 'timeout': expected a number > 0, got '10'"),
        ({"max_body_size": "1MB"}, "key 'max_body_size'"),
        ({"batching": {"max_batch_size": 4, "batch_wait": 5}}, "unknown key 'batch_wait'"),  # an AttributeError
        ({"name": "docs"}, "'docs' is reserved for the server's own routes"),  # a ValueError
        ({"name": "two words"}, "key 'name': expected a URL segment"),
        ({"model": {"path": "m.onnx"}}, "'model' is a key of modelserve.yaml"),
        ({"timout": 3}, "unknown API option 'timout'"),
    ],
)
def test_create_app_checks_its_options_as_modelserve_yaml_does(options: dict[str, Any], fragment: str) -> None:
    with pytest.raises(modelserve.ConfigError) as raised:
        modelserve.create_app(handler=Echo, **{"name": "echo", **options})
    assert fragment in str(raised.value)


@pytest.mark.parametrize("options", [{"max_concurrency": 4}, {"name": "echo"}, {"config": {"a": 1}}, {"timout": 3}])
def test_create_app_of_a_folder_refuses_the_options_of_a_class(tmp_path: Path, options: dict[str, Any]) -> None:
    """They were dropped without a word: create_app("folder", timeout=5) served the folder's own timeout."""
    root = write_project(tmp_path / "project", {"model.py": ECHO})
    with pytest.raises(modelserve.ConfigError, match=f"create_app: '{next(iter(options))}' is for a class"):
        modelserve.create_app(root, **options)


@pytest.mark.anyio
async def test_create_app_takes_the_yaml_forms_of_its_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELSERVE_URL", "http://test")  # gone after the test: the first request would set it
    app = modelserve.create_app(
        handler=Echo,
        name="echo",
        batching={"max_batch_size": 4},  # a mapping, as in modelserve.yaml (was an AttributeError at load)
        secrets=["token"],  # a list of names (was a failed load)
        timeout=None,
        max_queue_wait=None,
    )
    api: ApiConfig = app.server.project.apis[0]
    assert api.batching == BatchingConfig(max_batch_size=4)
    assert (api.secrets, api.timeout, api.max_queue_wait) == ({"token": None}, None, None)
    app.server.start()
    try:
        await app.server.wait_loaded()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://test") as client:
            answer = await client.post("/echo", json=[1, 2])
        assert answer.status_code == 200 and answer.json() == [1, 2]
    finally:
        await app.server.close()


# embedding.md: serve's keywords, and the one MODELSERVE_URL of a process


class ScriptServer(Server):
    """conftest's `Server` (its waits, its log, its stop) over a Python script of the test's, given `args` and then
    ``--port N``."""

    def __init__(self, script: Path, *args: str, log_dir: Path) -> None:
        self._command = [sys.executable, str(script), *args]
        self._env = {key: value for key, value in os.environ.items() if key != "MODELSERVE_URL"}
        self._env["PYTHONUNBUFFERED"] = "1"
        self._log_dir = log_dir
        self._launch()


SERVE = """
import sys

import modelserve

origins = ["https://a.example.com", "https://b.example.com"]
port = int(sys.argv[-1])
sys.exit(modelserve.serve(sys.argv[1], port=port, docs=False, access_log=False, cors_origin=origins))
"""


def test_serve_takes_false_for_what_is_on_by_default_and_lists(tmp_path: Path) -> None:
    """docs=False and access_log=False were dropped without a word (docs served, every request logged), and a
    list for --cors-origin was one origin, "['https://a...', ...]" (exit 2)."""
    root = write_project(tmp_path / "project", {"model.py": ECHO})
    script = tmp_path / "serve_it.py"
    script.write_text(SERVE)
    server = ScriptServer(script, str(root), log_dir=tmp_path)
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url) as client:
            assert client.get("/docs").status_code == 404
            assert client.get("/openapi.json").status_code == 200  # the document stays
            for origin in ("https://a.example.com", "https://b.example.com"):
                answer = client.post("/model", json=[1], headers={"origin": origin})
                assert answer.headers["access-control-allow-origin"] == origin
    finally:
        assert server.stop() == 0, server.log
    assert "POST /model" not in server.log  # no access lines


LIFESPAN_RUN = """
import sys

import modelserve
import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

{snippet}

uvicorn.run(parent, host="127.0.0.1", port=int(sys.argv[-1]), log_level="info")
"""


def test_a_parent_lifespan_loads_the_mounted_app_before_the_first_request(tmp_path: Path) -> None:
    """embedding.md's lifespan, run as written under uvicorn: the first request to the mounted app is answered by
    the loaded model (without it, the first request starts the loading and is a 503)."""
    text = section(page("embedding.md"), "create_app")
    (snippet,) = re.findall(r"^  ```python\n(.*?)^  ```", text, re.DOTALL | re.MULTILINE)
    script = tmp_path / "parent.py"
    script.write_text(LIFESPAN_RUN.format(snippet=textwrap.dedent(snippet)))
    server = ScriptServer(script, log_dir=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while True:  # uvicorn listens once the lifespan has started: no HTTP request before that
            assert server.process.poll() is None, server.log
            try:
                socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, server.log
                time.sleep(0.05)
        row = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
        answer = httpx.post(server.url + "/ml/iris", json=row)
        assert answer.status_code == 200, answer.text
        assert answer.json()["label"] == "setosa"
    finally:
        server.stop()
    assert "Traceback" not in server.log


MOUNTED = """
import sys

import uvicorn
from starlette.applications import Starlette
from starlette.routing import Mount

import modelserve

mounts = [Mount("/a", app=modelserve.create_app(sys.argv[1])), Mount("/b", app=modelserve.create_app(sys.argv[2]))]
uvicorn.run(Starlette(routes=mounts), host="127.0.0.1", port=int(sys.argv[-1]), log_level="warning")
"""
URL_MODEL = """
import os


class Model:
    def predict(self, inputs):
        return os.environ["MODELSERVE_URL"]
"""


def test_mounted_projects_share_one_modelserve_url(tmp_path: Path) -> None:
    """embedding.md: one variable per process, filled from the first request's mount, for every project's code."""
    first = write_project(tmp_path / "a", {"model.py": URL_MODEL})
    second = write_project(tmp_path / "b", {"model.py": URL_MODEL})
    script = tmp_path / "mounted.py"
    script.write_text(MOUNTED)
    server = ScriptServer(script, str(first), str(second), log_dir=tmp_path)
    base = server.url
    try:
        server.url = base + "/b"  # b gets the first request (its /healthz): a mounted app loads on its first
        server.wait_ready()
        assert httpx.post(base + "/b/model", json=1).json() == f"{base}/b"
        server.url = base + "/a"
        server.wait_ready()
        assert httpx.post(base + "/a/model", json=1).json() == f"{base}/b"  # a's code reads b's URL
    finally:
        server.stop()  # uvicorn.run raises the SIGTERM again once it has shut down


@pytest.mark.anyio
async def test_a_modelserve_url_the_environment_sets_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """embedding.md: without base_url the first request fills MODELSERVE_URL in, unless the environment set it."""

    class Url:
        def predict(self, inputs: Any) -> Any:
            return os.environ["MODELSERVE_URL"]

    for preset, seen in [(None, "http://first.example:81/ml"), ("https://models.example.com", None)]:
        monkeypatch.setenv("MODELSERVE_URL", "-")  # restored after the test, whatever the app sets
        if preset is None:
            monkeypatch.delenv("MODELSERVE_URL")
        else:
            monkeypatch.setenv("MODELSERVE_URL", preset)
        app = modelserve.create_app(handler=Url, name="url")
        parent = Starlette(routes=[Mount("/ml", app=app)])
        await app.server.wait_loaded()
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(parent), base_url="http://first.example:81"
        ) as client:
            assert (await client.post("/ml/url", json=1)).json() == (seen or preset)
        await app.server.close()


# beyond-loopback.md: the warning of a bind beyond loopback


def test_a_metrics_key_alone_warns_that_the_apis_are_open(tmp_path: Path, start_server: Any) -> None:
    """A metrics key alone opens /metrics only; the warning "without API keys" was not written for it."""
    config = "auth: {metrics_key_env: TEST_METRICS_KEY}\napis: [{name: model, handler: {path: model.py}}]\n"
    root = write_project(tmp_path / "project", {"model.py": ECHO, "modelserve.yaml": config})
    server = start_server(root, "--host", "0.0.0.0", env={"TEST_METRICS_KEY": METRICS_KEY})
    server.wait_ready()
    with httpx.Client(base_url=server.url) as client:
        assert client.post("/model", json=[1]).json() == [1]
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"authorization": f"Bearer {METRICS_KEY}"}).status_code == 200
    assert "serving on 0.0.0.0 without API keys" in server.log
    assert "API keys cross the network in clear text" not in server.log
