"""The Host check against DNS rebinding (`modelserve.http.guard`): on for a loopback bind, configured by
allowed_hosts, off for 0.0.0.0 and in-process apps; probes exempt; and an app without a guard pays nothing."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

import modelserve
from modelserve.http.guard import Guard, HostCheck, host_name, is_loopback
from tests.conftest import write_project

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


@pytest.mark.slow
def test_a_bind_on_every_address_answers_any_host_and_warns(tmp_path: Path, start_server: Any) -> None:
    root = write_project(tmp_path / "project", {"model.py": MODEL})
    server = start_server(root, "--host", "0.0.0.0")
    server.wait_ready()
    answer = httpx.post(f"{server.url}/model", json=1, headers={"host": "evil.example"})
    assert answer.status_code == 200
    assert "serving on 0.0.0.0 without API keys" in server.log


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
