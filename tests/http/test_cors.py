"""CORS (`modelserve.http.cors`): preflights answered without running anything, the headers on every answer
(errors included), refused origins, methods and headers, the request id and a V2 binary answer's header length
exposed by default, credentials with the origin ``*`` refused from modelserve.yaml and the command line alike;
through a real server, and in-process for a 503."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

import modelserve
from modelserve.config import CorsConfig
from modelserve.http.cors import Cors
from tests.conftest import REPO, write_project
from tests.models import LOGGED_ECHO

ALLOWED = "http://app.example"
OTHER = "http://evil.example"
KEY = "cors-test-key-0123456789"

MODEL = LOGGED_ECHO

CONFIG = """
apis:
  - name: echo
    handler: {path: model.py}
auth: {api_keys_env: CORS_TEST_KEYS}
cors:
  allow_origins: ["http://app.example", "http://other.app.example:8080"]
  expose_headers: [X-Request-ID, Retry-After]
  max_age: 120
"""


def calls(root: Path) -> int:
    path = root / "calls.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_project(tmp_path_factory.mktemp("cors") / "project", {"model.py": MODEL, "modelserve.yaml": CONFIG})


@pytest.fixture(scope="module")
def server(root: Path, start_server_module: Any) -> Any:
    server = start_server_module(root, "--cors-origin", "http://cli.example", env={"CORS_TEST_KEYS": KEY})
    server.wait_ready()
    return server


def preflight(url: str, origin: str, method: str = "POST", headers: str | None = None) -> httpx.Response:
    request = {"origin": origin, "access-control-request-method": method}
    if headers is not None:
        request["access-control-request-headers"] = headers
    return httpx.options(url, headers=request)


@pytest.mark.slow
@pytest.mark.parametrize("origin", [ALLOWED, "http://other.app.example:8080", "http://cli.example"])
def test_a_preflight_from_an_allowed_origin_is_answered_without_running_anything(
    server: Any, root: Path, origin: str
) -> None:
    before = calls(root)
    answer = preflight(f"{server.url}/echo", origin, headers="content-type, x-api-key, Authorization")
    assert answer.status_code == 204, answer.text
    assert answer.headers["access-control-allow-origin"] == origin
    assert "POST" in answer.headers["access-control-allow-methods"]
    allowed = answer.headers["access-control-allow-headers"].lower()
    assert {"content-type", "x-api-key", "authorization"} <= {name.strip() for name in allowed.split(",")}
    assert answer.headers["access-control-max-age"] == "120"
    assert "Origin" in answer.headers["vary"]
    assert "access-control-allow-credentials" not in answer.headers
    assert answer.content == b""
    assert calls(root) == before


@pytest.mark.slow
@pytest.mark.parametrize(
    ("origin", "method", "headers", "refused"),
    [
        (OTHER, "POST", None, "origin"),
        ("http://app.example:80", "POST", None, "origin"),
        (ALLOWED, "PUT", None, "method"),
        (ALLOWED, "POST", "x-custom", "headers"),
    ],
)
def test_a_preflight_that_asks_too_much_is_refused(
    server: Any, root: Path, origin: str, method: str, headers: str | None, refused: str
) -> None:
    before = calls(root)
    answer = preflight(f"{server.url}/echo", origin, method, headers)
    assert answer.status_code == 400
    assert answer.json()["error"] == f"CORS preflight refused: {refused} not allowed"
    if refused == "origin":
        assert "access-control-allow-origin" not in answer.headers
    assert calls(root) == before


@pytest.mark.slow
def test_answers_carry_the_headers_for_an_allowed_origin_only(server: Any) -> None:
    allowed = httpx.post(f"{server.url}/echo", json=1, headers={"origin": ALLOWED, "x-api-key": KEY})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ALLOWED
    # modelserve's own headers first, then the project's (X-Request-ID is not repeated)
    assert (
        allowed.headers["access-control-expose-headers"] == "X-Request-ID, Inference-Header-Content-Length, Retry-After"
    )
    assert allowed.headers["vary"] == "Origin"
    other = httpx.post(f"{server.url}/echo", json=1, headers={"origin": OTHER, "x-api-key": KEY})
    assert other.status_code == 200  # a browser would not let the page read it
    assert "access-control-allow-origin" not in other.headers
    assert other.headers["vary"] == "Origin"
    without = httpx.post(f"{server.url}/echo", json=1, headers={"x-api-key": KEY})
    assert "access-control-allow-origin" not in without.headers and without.headers["vary"] == "Origin"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "path", "body", "key", "status"),
    [
        ("POST", "/echo", b"{}", None, 401),
        ("POST", "/echo", b"{not json", KEY, 400),
        ("GET", "/nowhere", b"", KEY, 404),
        ("PUT", "/echo", b"", KEY, 405),
        ("GET", "/metrics", b"", None, 401),
    ],
)
def test_error_answers_carry_the_headers(
    server: Any, method: str, path: str, body: bytes, key: str | None, status: int
) -> None:
    headers = {"origin": ALLOWED, "content-type": "application/json"}
    if key is not None:
        headers["x-api-key"] = key
    answer = httpx.request(method, server.url + path, content=body, headers=headers)
    assert answer.status_code == status
    assert answer.headers["access-control-allow-origin"] == ALLOWED
    assert answer.headers["vary"] == "Origin"


class SlowToLoad:
    """Loads until the test opens its gate (a 0.5 s sleep could end before a busy machine sent the request)."""

    gate = threading.Event()

    def load(self) -> None:
        assert SlowToLoad.gate.wait(30)

    def predict(self, inputs: Any) -> Any:
        return inputs


def test_a_503_while_loading_carries_the_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(os.getcwd())
    monkeypatch.setenv("MODELSERVE_URL", "unset")
    monkeypatch.delenv("MODELSERVE_URL")
    SlowToLoad.gate = threading.Event()
    app = modelserve.create_app(handler=SlowToLoad, name="slow", cors_origins=[ALLOWED])

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            loading = await client.post("/slow", json=1, headers={"origin": ALLOWED})
            SlowToLoad.gate.set()
            await app.server.wait_loaded()
            loaded = await client.post("/slow", json=1, headers={"origin": ALLOWED})
            await app.server.close()
            return loading, loaded

    loading, loaded = asyncio.run(scenario())
    assert loading.status_code == 503 and loading.headers["access-control-allow-origin"] == ALLOWED
    assert loaded.status_code == 200 and loaded.headers["access-control-allow-origin"] == ALLOWED


# ---------------------------------------------------------------------------------------------------------
# The policy itself, against Starlette's rules.


def test_any_origin_answers_a_star_unless_credentials_are_allowed() -> None:
    anyone = Cors(CorsConfig(allow_origins=["*"]))
    assert dict(anyone.headers_for(b"http://x.example"))[b"access-control-allow-origin"] == b"*"
    assert anyone.headers_for(None) == []
    exposed = dict(anyone.headers_for(b"http://x.example"))[b"access-control-expose-headers"]
    assert exposed == b"X-Request-ID, Inference-Header-Content-Length"  # by default (Starlette: none)
    assert dict(anyone.preflight(b"http://x.example", b"POST", None, False))[b"access-control-allow-origin"] == b"*"
    listed = Cors(CorsConfig(allow_origins=[ALLOWED], allow_credentials=True))
    headers = dict(listed.headers_for(ALLOWED.encode()))
    assert headers[b"access-control-allow-origin"] == ALLOWED.encode()
    assert headers[b"access-control-allow-credentials"] == b"true"
    assert listed.headers_for(None) == [(b"vary", b"Origin")]


def test_star_headers_and_methods_echo_what_is_asked() -> None:
    cors = Cors(CorsConfig(allow_origins=[ALLOWED], allow_methods=["*"], allow_headers=["*"]))
    headers = dict(cors.preflight(ALLOWED.encode(), b"PATCH", b"x-anything, x-more", False))
    assert headers[b"access-control-allow-headers"] == b"x-anything, x-more"
    assert b"PATCH" in headers[b"access-control-allow-methods"]


def test_private_network_preflights_need_their_own_setting() -> None:
    refused = Cors(CorsConfig(allow_origins=[ALLOWED]))
    with pytest.raises(modelserve.BadRequest, match="private network"):
        refused.preflight(ALLOWED.encode(), b"POST", None, True)
    allowed = Cors(CorsConfig(allow_origins=[ALLOWED], allow_private_network=True))
    assert (b"access-control-allow-private-network", b"true") in allowed.preflight(
        ALLOWED.encode(), b"POST", None, True
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cors-origin", "app.example"], "--cors-origin: expected an origin like 'https://app.example.com'"),
        (["--cors-origin", "https://app.example/"], "no path"),
        (["--api-key-env", "not a name"], "--api-key-env: expected the name of an environment variable"),
    ],
)
def test_command_line_mistakes_exit_2(tmp_path: Path, start_server: Any, args: list[str], message: str) -> None:
    server = start_server(write_project(tmp_path / "project", {"model.py": MODEL}), *args)
    assert server.wait_exit() == 2
    assert message in server.log


V2_MODEL = """
class Model:
    def predict(self, inputs):
        return inputs["x"] * 2
"""


@pytest.mark.slow
def test_a_v2_binary_answer_can_be_split_by_a_page_by_default(tmp_path: Path, start_server: Any) -> None:
    """Without expose_headers, a cross-origin page may read X-Request-ID and Inference-Header-Content-Length."""
    root = write_project(tmp_path / "project", {"model.py": V2_MODEL})
    server = start_server(root, "--cors-origin", ALLOWED)
    server.wait_ready()
    request = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1, 2, 3]}],
        "parameters": {"binary_data_output": True},
    }
    answer = httpx.post(f"{server.url}/v2/models/model/infer", json=request, headers={"origin": ALLOWED})
    assert answer.status_code == 200, answer.text
    assert answer.headers["access-control-allow-origin"] == ALLOWED
    exposed = {name.strip().lower() for name in answer.headers["access-control-expose-headers"].split(",")}
    assert {"x-request-id", "inference-header-content-length"} <= exposed
    length = int(answer.headers["inference-header-content-length"])
    header = json.loads(answer.content[:length])
    assert header["outputs"][0]["parameters"]["binary_data_size"] == 12
    assert struct.unpack("<3f", answer.content[length:]) == (2.0, 4.0, 6.0)
    # A preflight of the page's POST is allowed without configuring anything else.
    preflight_answer = preflight(f"{server.url}/v2/models/model/infer", ALLOWED, headers="content-type")
    assert preflight_answer.status_code == 204


CREDENTIALS = """
apis: [{name: echo, handler: {path: model.py}}]
cors: {allow_origins: [%s], allow_credentials: true}
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("origins", "args", "message"),
    [
        ('"*"', [], "allow_credentials with the origin '*' would let every web site"),
        ('"http://app.example"', ["--cors-origin", "*"], "allow_credentials with --cors-origin '*' would let every"),
        (
            '"http://app.example"',
            ["--cors-origin", "http://b.example", "--cors-origin", "*"],
            "allow_credentials with --cors-origin '*'",
        ),
    ],
)
def test_credentials_with_any_origin_are_refused_from_yaml_and_command_line_alike(
    tmp_path: Path, origins: str, args: list[str], message: str
) -> None:
    root = write_project(tmp_path / "project", {"model.py": MODEL, "modelserve.yaml": CREDENTIALS % origins})
    result = subprocess.run(
        [sys.executable, "-m", "modelserve", str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 2, result.stderr
    assert f"modelserve: error: modelserve.yaml: cors: {message}" in result.stderr
    assert not (root / "calls.log").exists()  # refused before anything ran


def test_credentials_with_any_origin_are_refused_by_create_app_too(tmp_path: Path) -> None:
    root = write_project(
        tmp_path / "project", {"model.py": MODEL, "modelserve.yaml": CREDENTIALS % '"http://app.example"'}
    )
    with pytest.raises(modelserve.ConfigError, match="allow_credentials with --cors-origin '\\*'"):
        modelserve.create_app(root, cors_origins=["*"])
