"""The Host check against DNS rebinding (`modelserve.http.guard`): on for a loopback bind, configured by
allowed_hosts, off for 0.0.0.0 and in-process apps; probes exempt; and an app without a guard pays nothing.
More than one Host header is a 400 everywhere: from the guard, and from the transport where no guard is on."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

import modelserve
from modelserve.http.guard import Guard, HostCheck, host_name, is_loopback
from tests.conftest import read_http_answer, write_project

MODEL = """
class Model:
    def predict(self, inputs):
        return inputs
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> Any:
    root = write_project(tmp_path_factory.mktemp("guard") / "project", {"model.py": MODEL})
    server = start_server_module(root)  # the CLI's default bind: 127.0.0.1
    server.wait_ready()
    return server


@pytest.mark.slow
@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:{port}", "127.0.0.1.evil.example", "localhost.evil.example:{port}", "[::2]"]
)
def test_a_foreign_host_is_a_400_on_a_loopback_server(server: Any, host: str) -> None:
    answer = httpx.post(f"{server.url}/model", json=1, headers={"host": host.format(port=server.port)})
    assert answer.status_code == 400
    assert answer.json()["error"] == "this server does not answer for the Host of this request (see allowed_hosts)"
    assert answer.json()["request_id"] == answer.headers["x-request-id"]


@pytest.mark.slow
@pytest.mark.parametrize("host", ["localhost:{port}", "LOCALHOST", "127.0.0.1:{port}", "127.0.0.1", "[::1]:{port}"])
def test_loopback_hosts_are_answered(server: Any, host: str) -> None:
    answer = httpx.post(f"{server.url}/model", json=1, headers={"host": host.format(port=server.port)})
    assert answer.status_code == 200 and answer.json() == 1


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/v2/health/live"])
def test_the_probes_answer_any_host(server: Any, path: str) -> None:
    assert httpx.get(server.url + path, headers={"host": "10.1.2.3:8888"}).status_code == 200


TWO_HOSTS = "more than one Host header: a request names one host (RFC 9112, section 3.2)"


def raw_post(port: int, path: str, headers: str, body: bytes = b"1") -> tuple[bytes, dict[str, Any]]:
    """POST over a raw socket with `headers` as written (two Host lines are what no client library sends):
    the answer's head, lowercased, and its JSON body."""
    request = f"POST {path} HTTP/1.1\r\n{headers}Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request.encode() + body)
        head, _, content = read_http_answer(sock).partition(b"\r\n\r\n")
    return head.lower(), orjson.loads(content)


def assert_two_hosts_refused(port: int, path: str, headers: str) -> None:
    head, body = raw_post(port, path, headers)
    assert head.startswith(b"http/1.1 400"), head
    assert b"\r\ncontent-type: application/json" in head and b"\r\nconnection: close" in head
    assert body["error"] == TWO_HOSTS
    assert body["request_id"].encode() in head  # the X-Request-ID header


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/model", "/healthz"])
@pytest.mark.parametrize(
    "hosts",
    [
        "Host: evil.example\r\nHost: 127.0.0.1\r\n",
        "Host: 127.0.0.1\r\nHost: evil.example\r\n",
        "Host: a\r\nHOST: a\r\n",
    ],
    ids=["allowed-last", "allowed-first", "the-same-twice"],
)
def test_two_host_headers_are_a_400_on_a_loopback_server(server: Any, hosts: str, path: str) -> None:
    assert_two_hosts_refused(server.port, path, hosts)


@pytest.mark.slow
def test_other_headers_may_come_twice(server: Any) -> None:
    head, body = raw_post(server.port, "/model", "Host: 127.0.0.1\r\nAccept: */*\r\nAccept: application/json\r\n")
    assert head.startswith(b"http/1.1 200") and body == 1


@pytest.mark.slow
def test_a_bind_on_every_address_answers_any_host_and_warns(tmp_path: Path, start_server: Any) -> None:
    root = write_project(tmp_path / "project", {"model.py": MODEL})
    server = start_server(root, "--host", "0.0.0.0")
    server.wait_ready()
    answer = httpx.post(f"{server.url}/model", json=1, headers={"host": "evil.example"})
    assert answer.status_code == 200
    assert "serving on 0.0.0.0 without API keys" in server.log
    # No Host check, no guard: two Host headers are still a 400 (said by modelserve's transport).
    assert_two_hosts_refused(server.port, "/model", "Host: evil.example\r\nHost: api.example.com\r\n")


@pytest.mark.slow
def test_allowed_hosts_for_another_bind(tmp_path: Path, start_server: Any) -> None:
    config = """
        apis: [{name: model, handler: {path: model.py}}]
        allowed_hosts: [api.example.com, "*.models.example.com"]
    """
    root = write_project(tmp_path / "project", {"model.py": MODEL, "modelserve.yaml": config})
    server = start_server(root, "--host", "0.0.0.0")
    server.wait_ready()
    for host, status in [
        ("api.example.com", 200),
        ("API.example.com:443", 200),
        ("a.models.example.com", 200),
        ("models.example.com", 400),
        ("evil.example", 400),
        ("127.0.0.1", 200),  # loopback names and the bind address always reach the server
        ("0.0.0.0:8888", 200),
    ]:
        assert httpx.post(f"{server.url}/model", json=1, headers={"host": host}).status_code == status, host


def in_process(app: Any, host: str) -> int:
    async def scenario() -> int:
        await app.server.wait_loaded()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=f"http://{host}") as client:
            status = (await client.post("/model", json=1)).status_code
        await app.server.close()
        return status

    return asyncio.run(scenario())


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(os.getcwd())
    monkeypatch.setenv("MODELSERVE_URL", "unset")
    monkeypatch.delenv("MODELSERVE_URL")


@pytest.mark.usefixtures("isolated")
def test_an_app_created_in_process_answers_any_host_unless_told(tmp_path: Path) -> None:
    root = write_project(tmp_path / "project", {"model.py": MODEL})
    app = modelserve.create_app(root)
    assert app._edge is app.table  # nothing configured: the table itself, no guard in the way
    assert in_process(app, "testserver") == 200
    assert in_process(modelserve.create_app(root, host="127.0.0.1"), "testserver") == 400
    assert in_process(modelserve.create_app(root, host="127.0.0.1"), "localhost:8000") == 200
    assert in_process(modelserve.create_app(root, host="0.0.0.0"), "testserver") == 200
    assert isinstance(modelserve.create_app(root, host="127.0.0.1")._edge, Guard)


@pytest.mark.usefixtures("isolated")
def test_the_guard_refuses_two_host_headers_under_any_server(tmp_path: Path) -> None:
    """In process (no modelserve transport), the guard itself answers."""
    root = write_project(tmp_path / "project", {"model.py": MODEL})

    async def scenario() -> httpx.Response:
        app = modelserve.create_app(root, host="127.0.0.1")
        await app.server.wait_loaded()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as client:
            answer = await client.post("/model", json=1, headers=[("host", "evil.example"), ("host", "localhost")])
        await app.server.close()
        return answer

    answer = asyncio.run(scenario())
    assert answer.status_code == 400 and answer.json()["error"] == TWO_HOSTS
    assert answer.headers["connection"] == "close"


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("localhost:8888", "localhost"),
        ("Example.COM", "example.com"),
        ("[::1]:8888", "[::1]"),
        ("[::1]", "[::1]"),
        ("::1", None),
        ("[::1]x", None),
        ("host:port", None),
        ("", None),
        (":80", None),
    ],
)
def test_host_name(value: str, name: str | None) -> None:
    assert host_name(value) == name


def test_host_check_for_a_bind() -> None:
    assert HostCheck.for_bind(None, None) is None
    assert HostCheck.for_bind(None, "0.0.0.0") is None
    assert HostCheck.for_bind(["*"], "127.0.0.1") is None
    check = HostCheck.for_bind(None, "::1")
    assert (
        check is not None and check.allows(b"[::1]:80") and not check.allows(b"evil.example") and not check.allows(None)
    )
    assert is_loopback("127.0.0.2") and is_loopback("[::1]") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.com")
