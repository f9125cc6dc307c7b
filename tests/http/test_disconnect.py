"""A client that goes away during a long call: its call is cancelled, through the transport's own callback.

Real uvicorn servers on 127.0.0.1, run in the test's event loop so that the test can see how the watch
learned of the disconnect: modelserve's protocol calls back from ``connection_lost`` (no task waits on the
connection), uvicorn's h11 protocol is awaited as before (the fallback).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import uvicorn

import modelserve
from modelserve.http._asgi import LOST, Disconnected
from modelserve.http._protocol import TransportConfig
from modelserve.watch import Subscribable, Watch
from tests.conftest import free_port

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # uvicorn's server runs on asyncio


REQUEST = b"POST /slow HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 2\r\nContent-Type: application/json\r\n\r\n{}"


class Slow:
    """An async predict that runs until it is cancelled."""

    started: asyncio.Event
    cancelled: asyncio.Event

    async def predict(self, inputs: Any) -> Any:
        Slow.started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            Slow.cancelled.set()
            raise
        return {}


@pytest.mark.parametrize("http", ["modelserve", "h11"])
async def test_a_lost_connection_cancels_its_call(http: str, monkeypatch: pytest.MonkeyPatch) -> None:
    awaited: list[Watch] = []
    original = Watch._watch

    async def recorded(self: Watch) -> None:
        awaited.append(self)
        await original(self)

    monkeypatch.setattr(Watch, "_watch", recorded)
    Slow.started, Slow.cancelled = asyncio.Event(), asyncio.Event()
    app = modelserve.create_app(handler=Slow, name="slow")
    port = free_port()
    settings: dict[str, Any] = {"host": "127.0.0.1", "port": port, "log_level": "warning"}
    config = TransportConfig(app, **settings) if http == "modelserve" else uvicorn.Config(app, http="h11", **settings)
    server = uvicorn.Server(config)
    serving = asyncio.ensure_future(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        await app.server.wait_loaded()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(REQUEST)
        await asyncio.wait_for(Slow.started.wait(), 30)
        await asyncio.sleep(0.1)  # longer than WATCH_AFTER: the call is being watched
        writer.close()
        await asyncio.wait_for(Slow.cancelled.wait(), 30)  # bounds a failing test only
        # modelserve's protocol told the watch; uvicorn's h11 protocol was waited on by a task, as before
        assert (awaited == []) == (http == "modelserve")
        answer = await asyncio.to_thread(_metrics, port)
        assert 'modelserve_requests_cancelled_total{api="slow",reason="disconnect"} 1.0' in answer
    finally:
        server.should_exit = True
        await serving


def _metrics(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics").text


async def test_disconnected_subscribes_through_the_transport_in_the_scope() -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    class Transport:
        def __init__(self) -> None:
            self.callbacks: list[Any] = []

        def subscribe(self, callback: Any) -> Any:
            self.callbacks.append(callback)
            return lambda: self.callbacks.remove(callback)

    transport = Transport()
    cancelled: Subscribable = Disconnected(receive, {LOST: transport})  # the interface `Watch` relies on, typed
    undo = cancelled.subscribe(print)
    assert transport.callbacks == [print] and undo is not None
    undo()
    assert transport.callbacks == []
    assert Disconnected(receive, {}).subscribe(print) is None  # no such transport: the awaitable is awaited
    assert await cancelled() == "disconnect"
