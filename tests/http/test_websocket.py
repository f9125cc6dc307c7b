"""The WebSocket routes (modelserve/http/websocket.py) with the ``websockets`` client: Truss's websocket test
models as published (truss/tests/test_model_inference.py), and ``/<api>/ws`` of modelserve APIs."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, InvalidStatus

from tests.conftest import write_project

TRUSS = Path(__file__).resolve().parents[1] / "data" / "truss"
KEY = "ws-test-key"

PROJECT = {
    "modelserve.yaml": """
        auth: {api_keys_env: WS_TEST_KEYS}
        cors: {allow_origins: ["http://allowed.example"]}
        apis:
          - name: words
            handler: {path: model.py, class: Words}
          - name: small
            handler: {path: model.py, class: Words}
            max_body_size: 64
          - name: held
            handler: {path: model.py, class: Held}
            max_concurrency: 1
            max_queue_length: 0
          - name: idle
            handler: {path: model.py, class: Words}
            max_queue_length: 20
    """,
    "model.py": """
        import asyncio
        from pathlib import Path


        class Words:
            def predict(self, inputs):
                if inputs == "fail":
                    raise RuntimeError("secret internals")
                if isinstance(inputs, dict):
                    return {"echo": inputs}
                return self.words(inputs)

            def words(self, text):
                for word in text.split():
                    yield word


        class Held:
            async def predict(self, inputs):
                return self.hold()

            async def hold(self):
                yield "first"
                release = Path(__file__).with_name("release")
                for _ in range(500):
                    if release.exists():
                        break
                    await asyncio.sleep(0.02)
                yield "last"
    """,
}


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def messages(url: str, sent: str | bytes, **options: Any) -> tuple[list[Any], int | None, str | None]:
    """Send one message, receive until the server closes: (the messages, the close code, the reason)."""
    received = []
    async with websockets.connect(url, **options) as socket:
        await socket.send(sent)
        try:
            while True:
                received.append(await socket.recv())
        except ConnectionClosed as closed:
            assert closed.rcvd is not None
            return received, closed.rcvd.code, closed.rcvd.reason
    raise AssertionError("unreachable")


# ------------------------------------------------------------------------------------------------------------
# Truss's websocket method, with Truss's own test models


@pytest.fixture(scope="module")
def truss_servers(start_server_module: Any) -> dict[str, Any]:
    cases = ("websocket_endpoint", "websocket_endpoint_error_logs", "nonexistent_websocket_endpoint")
    servers = {case: start_server_module(TRUSS / case) for case in cases}
    for server in servers.values():
        server.wait_ready()
    return servers


def ws_url(server: Any, path: str) -> str:
    return server.url.replace("http://", "ws://") + path


def test_websocket_endpoint(truss_servers: dict[str, Any]) -> None:
    """truss/tests/test_model_inference.py::test_websocket_endpoint, its exchange and assertions."""

    async def exchange() -> None:
        async with websockets.connect(ws_url(truss_servers["websocket_endpoint"], "/v1/websocket")) as websocket:
            await websocket.send("hello")
            assert await websocket.recv() == "hello pong"
            await websocket.send("world")
            assert await websocket.recv() == "world pong"
            await websocket.send("done")
            with pytest.raises(ConnectionClosed) as exc_info:
                await websocket.recv()
            assert exc_info.value.rcvd is not None
            assert exc_info.value.rcvd.code == 1000
            assert exc_info.value.rcvd.reason == ""

    run(exchange())


def test_websocket_endpoint_error_logs(truss_servers: dict[str, Any]) -> None:
    """test_websocket_endpoint_error_logs: 1011 with Truss's reason, the traceback in the log."""
    server = truss_servers["websocket_endpoint_error_logs"]

    async def exchange() -> None:
        async with websockets.connect(ws_url(server, "/v1/websocket")) as websocket:
            await websocket.send("hello")
            assert await websocket.recv() == "hello pong"
            await websocket.send("raise")
            with pytest.raises(ConnectionClosedError) as exc_info:
                await websocket.recv()
            assert exc_info.value.rcvd is not None
            assert exc_info.value.rcvd.code == 1011
            assert exc_info.value.rcvd.reason == "Internal Server Error (in model/chainlet)."

    run(exchange())
    deadline = time.monotonic() + 10
    while 'raise ValueError("This is test error.")' not in server.log:
        assert time.monotonic() < deadline, server.log
        time.sleep(0.05)
    assert "ValueError: This is test error." in server.log


def test_nonexistent_websocket_endpoint(truss_servers: dict[str, Any]) -> None:
    """test_nonexistent_websocket_endpoint: accepted, then closed with 1003 and Truss's reason; the session is
    counted in the API's metrics as 501 (it was not counted at all)."""
    server = truss_servers["nonexistent_websocket_endpoint"]

    def counted() -> float:
        text = httpx.get(server.url + "/metrics").text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("modelserve_requests_total{") and 'code="501"' in line
        )

    before = counted()

    async def exchange() -> None:
        with pytest.raises(ConnectionClosedError) as exc_info:
            async with websockets.connect(ws_url(server, "/v1/websocket")) as ws:
                await ws.recv()
        assert exc_info.value.rcvd is not None
        assert exc_info.value.rcvd.code == 1003
        assert exc_info.value.rcvd.reason == "WebSocket is not implemented on this deployment."

    run(exchange())
    assert counted() == before + 1


def test_a_plain_get_of_a_websocket_route_is_a_400(truss_servers: dict[str, Any]) -> None:
    answer = httpx.get(truss_servers["websocket_endpoint"].url + "/v1/websocket")
    assert answer.status_code == 400
    assert answer.headers["upgrade"] == "websocket"


def test_the_websocket_model_has_no_predict(truss_servers: dict[str, Any]) -> None:
    assert httpx.post(truss_servers["websocket_endpoint"].url + "/model", json={}).status_code == 404


# ------------------------------------------------------------------------------------------------------------
# /<api>/ws of modelserve APIs


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_project(tmp_path_factory.mktemp("ws") / "project", PROJECT)


@pytest.fixture(scope="module")
def server(start_server_module: Any, project: Path) -> Any:
    served = start_server_module(project, env={"WS_TEST_KEYS": KEY})
    served.wait_listening()
    deadline = time.monotonic() + 60
    while httpx.get(served.url + "/readyz").status_code != 200:
        assert time.monotonic() < deadline, served.log
        time.sleep(0.05)
    return served


AUTH: dict[str, Any] = {"additional_headers": {"Authorization": f"Bearer {KEY}"}}


def test_a_stream_is_one_message_per_chunk_then_a_close_1000(server: Any) -> None:
    assert run(messages(ws_url(server, "/words/ws"), "one two three", **AUTH)) == (["one", "two", "three"], 1000, "")


def test_a_json_message_is_the_inputs_and_a_dict_the_answer(server: Any) -> None:
    received, code, _ = run(messages(ws_url(server, "/words/ws"), '{"a": 1}', **AUTH))
    assert (received, code) == (['{"echo":{"a":1}}'], 1000)


def test_a_failure_closes_with_1011_and_names_no_internals(server: Any) -> None:
    received, code, reason = run(messages(ws_url(server, "/words/ws"), '"fail"', **AUTH))
    assert (received, code) == ([], 1011)
    assert "secret" not in (reason or "")


def test_a_message_over_max_body_size_closes_with_1009(server: Any) -> None:
    received, code, _ = run(messages(ws_url(server, "/small/ws"), "x" * 65, **AUTH))
    assert (received, code) == ([], 1009)
    assert run(messages(ws_url(server, "/small/ws"), "fits", **AUTH))[0] == ["fits"]


def test_the_key_is_needed_at_the_handshake(server: Any) -> None:
    with pytest.raises(InvalidStatus) as caught:
        run(messages(ws_url(server, "/words/ws"), "x"))
    assert caught.value.response.status_code == 401
    with pytest.raises(InvalidStatus):
        run(messages(ws_url(server, "/words/ws"), "x", additional_headers={"Authorization": "Bearer wrong"}))


def test_a_browser_sends_the_key_as_a_subprotocol(server: Any) -> None:
    async def exchange() -> tuple[str | None, Any]:
        async with websockets.connect(ws_url(server, "/words/ws"), subprotocols=[f"bearer.{KEY}"]) as socket:  # type: ignore[list-item]
            await socket.send("hi")
            return socket.subprotocol, await socket.recv()

    assert run(exchange()) == (f"bearer.{KEY}", "hi")


@pytest.mark.parametrize(("origin", "status"), [("http://evil.example", 403), ("http://allowed.example", None)])
def test_the_origin_of_a_browser_is_checked(server: Any, origin: str, status: int | None) -> None:
    options = {**AUTH, "origin": origin}
    if status is None:
        assert run(messages(ws_url(server, "/words/ws"), "ok", **options))[0] == ["ok"]
        return
    with pytest.raises(InvalidStatus) as caught:
        run(messages(ws_url(server, "/words/ws"), "ok", **options))
    assert caught.value.response.status_code == status


def test_an_unknown_path_refuses_the_handshake(server: Any) -> None:
    with pytest.raises(InvalidStatus) as caught:
        run(messages(ws_url(server, "/nowhere/ws"), "x", **AUTH))
    assert caught.value.response.status_code == 404


def test_a_connection_holds_its_api_s_slot(server: Any, project: Path) -> None:
    release = project / "release"
    release.unlink(missing_ok=True)

    async def exchange() -> tuple[int, list[Any], int | None]:
        async with websockets.connect(ws_url(server, "/held/ws"), **AUTH) as first:
            await first.send("go")
            assert await first.recv() == "first"
            with pytest.raises(InvalidStatus) as refused:
                async with websockets.connect(ws_url(server, "/held/ws"), **AUTH):
                    pass
            release.write_text("")
            rest = [await first.recv()]
            with pytest.raises(ConnectionClosed) as closed:
                await first.recv()
            assert closed.value.rcvd is not None
            return refused.value.response.status_code, rest, closed.value.rcvd.code

    assert run(exchange()) == (503, ["last"], 1000)
    assert run(messages(ws_url(server, "/held/ws"), "again", **AUTH))[1] == 1000


# ------------------------------------------------------------------------------------------------------------
# docs/websocket.md's snippets, as written


def test_the_docs_page_s_snippets(start_server: Any, tmp_path: Path) -> None:
    import contextlib
    import io

    from tests.conftest import REPO
    from tests.test_readme import blocks

    text = (REPO / "docs" / "websocket.md").read_text(encoding="utf-8")
    truss_model, truss_client, api_client = blocks(text, "python")
    project = write_project(
        tmp_path / "project",
        {
            "config.yaml": "",
            "model/model.py": truss_model,
            "words.py": """
                class Words:
                    def predict(self, inputs):
                        yield from inputs.split()
            """,
            "modelserve.yaml": """
                apis:
                  - name: model
                    truss: config.yaml
                  - name: words
                    handler: {path: words.py, class: Words}
            """,
        },
    )
    served = start_server(project)
    served.wait_ready()
    out = io.StringIO()
    for code in (truss_client, api_client):
        code = code.replace("ws://127.0.0.1:8000", ws_url(served, ""))
        with contextlib.redirect_stdout(out):
            exec(compile(code, "docs/websocket.md", "exec"), {})  # noqa: S102 - our own docs
    assert out.getvalue().splitlines() == ["hello pong", "one", "two", "three"]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_200_idle_sockets_are_bounded_by_the_line_and_give_their_places_back(server: Any) -> None:
    """Idle connections wait in the API's line (1 + max_queue_length of them), the rest are refused with a 503;
    closed, they give their places back; the server answers meanwhile and its memory stays flat."""
    before = rss_kib(server.process.pid)

    async def flood() -> tuple[int, int, int]:
        sockets, refused = [], 0
        for _ in range(200):
            try:
                sockets.append(await websockets.connect(ws_url(server, "/idle/ws"), **AUTH))
            except InvalidStatus as exc:
                assert exc.response.status_code == 503
                refused += 1
        async with httpx.AsyncClient() as client:
            probe = (await client.get(server.url + "/healthz")).status_code
        for socket in sockets:
            await socket.close()
        return len(sockets), refused, probe

    assert run(flood()) == (21, 179, 200)
    # their places are back: a full line's worth of calls goes through again
    for _ in range(3):
        assert run(messages(ws_url(server, "/idle/ws"), "still here", **AUTH))[:2] == (["still", "here"], 1000)
    assert rss_kib(server.process.pid) - before < 32 * 1024


def test_sessions_are_counted_in_the_api_s_metrics(server: Any) -> None:
    def counted(code: str) -> float:
        prefix = f'modelserve_requests_total{{api="words",code="{code}"}} '
        text = httpx.get(server.url + "/metrics", headers={"authorization": f"Bearer {KEY}"}).text
        return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))

    ended, failed = counted("101"), counted("500")
    run(messages(ws_url(server, "/words/ws"), "a b", **AUTH))
    run(messages(ws_url(server, "/words/ws"), '"fail"', **AUTH))
    assert (counted("101"), counted("500")) == (ended + 1, failed + 1)


# ------------------------------------------------------------------------------------------------------------
# Idle sessions, pings and shutdown


def idle_project(root: Path, idle: float | None) -> Path:
    """Truss's echo model at /v1/websocket and a streaming API at /words/ws, with `idle` as both APIs'
    websocket_idle_timeout (None: the default)."""
    bound = "" if idle is None else f"websocket_idle_timeout: {idle}"
    return write_project(
        root,
        {
            "config.yaml": "",
            "model/model.py": (TRUSS / "websocket_endpoint" / "model" / "model.py").read_text(encoding="utf-8"),
            "words.py": """
                class Words:
                    def predict(self, inputs):
                        yield from inputs.split()
            """,
            "modelserve.yaml": f"""
                apis:
                  - name: model
                    truss: config.yaml
                    {bound}
                  - name: words
                    handler: {{path: words.py, class: Words}}
                    {bound}
            """,
        },
    )


@pytest.fixture(scope="module")
def idle_server(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    served = start_server_module(idle_project(tmp_path_factory.mktemp("idle") / "project", 1.5))
    served.wait_ready()
    return served


async def closed_after(socket: Any) -> tuple[int, str]:
    """Receive until the server closes: its close code and reason."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            await socket.recv()
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code, closed.value.rcvd.reason


def test_a_silent_truss_session_is_closed_with_1001(idle_server: Any) -> None:
    async def exchange() -> tuple[str, tuple[int, str]]:
        async with websockets.connect(ws_url(idle_server, "/v1/websocket")) as socket:
            await socket.send("hello")
            answer = await socket.recv()
            return str(answer), await closed_after(socket)

    answer, (code, reason) = run(exchange())
    assert (answer, code) == ("hello pong", 1001)
    assert "websocket_idle_timeout" in reason


def test_a_session_waiting_for_its_message_is_closed_with_1001_and_gives_its_place_back(idle_server: Any) -> None:
    async def exchange() -> tuple[int, str]:
        async with websockets.connect(ws_url(idle_server, "/words/ws")) as socket:
            return await closed_after(socket)

    code, reason = run(exchange())
    assert code == 1001 and "websocket_idle_timeout" in reason
    assert run(messages(ws_url(idle_server, "/words/ws"), "a b"))[:2] == (["a", "b"], 1000)


def test_pings_are_answered_and_do_not_count_as_messages(idle_server: Any) -> None:
    async def exchange() -> tuple[int, int]:
        pongs = 0
        async with websockets.connect(ws_url(idle_server, "/v1/websocket"), ping_interval=None) as socket:
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await (await socket.ping())  # the pong came back
                    pongs += 1
                    await asyncio.sleep(0.1)
        assert closed.value.rcvd is not None
        return pongs, closed.value.rcvd.code

    pongs, code = run(exchange())
    assert pongs >= 1 and code == 1001


def test_the_server_s_shutdown_closes_open_sessions_with_1001(start_server: Any, tmp_path: Path) -> None:
    served = start_server(idle_project(tmp_path / "project", None))
    served.wait_ready()

    async def exchange() -> list[tuple[int, str]]:
        async with (
            websockets.connect(ws_url(served, "/v1/websocket")) as truss,
            websockets.connect(ws_url(served, "/words/ws")) as waiting,
        ):
            await truss.send("hello")
            assert await truss.recv() == "hello pong"
            served.process.send_signal(signal.SIGTERM)
            return [await closed_after(truss), await closed_after(waiting)]

    assert run(exchange()) == [(1001, "the server is shutting down")] * 2
    assert served.wait_exit() == 0


def test_the_model_server_s_close_closes_open_sessions_with_1001(tmp_path: Path, monkeypatch: Any) -> None:
    """Another ASGI server: the lifespan's shutdown (`ModelServer.close`) closes the sessions still open."""
    import uvicorn

    import modelserve
    from tests.conftest import free_port

    monkeypatch.chdir(tmp_path)  # create_app moves into the project folder; back where the test began after it
    app = modelserve.create_app(idle_project(tmp_path / "project", None))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))

    async def exchange() -> tuple[int, str]:
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        await app.server.wait_loaded()
        async with websockets.connect(f"ws://127.0.0.1:{port}/words/ws") as waiting:
            await app.server.close()
            closed = await closed_after(waiting)
        server.should_exit = True
        await serving
        return closed

    assert run(exchange()) == (1001, "the server is shutting down")
