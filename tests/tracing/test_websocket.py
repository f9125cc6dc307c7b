"""WebSocket sessions traced (modelserve/http/websocket.py): the handshake's ``traceparent`` continued by a server
span for the session, a span per message handled, user code seeing it; with the ``websockets`` client, through a
real server exporting to the OTLP receiver."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from tests.conftest import write_project
from tests.tracing.receiver import Receiver, Span, children, client_span, env

#: Truss's websocket model, answering each message with the span current while it handles it.
TRUSS = {
    "config.yaml": "model_name: traced-socket\n",
    "model/__init__.py": "",
    "model/model.py": """
        import fastapi
        from opentelemetry import trace


        class Model:
            async def websocket(self, websocket: fastapi.WebSocket):
                try:
                    while True:
                        text = await websocket.receive_text()
                        if text == "done":
                            return
                        current = trace.get_current_span().get_span_context()
                        await websocket.send_text(f"{text} {current.span_id:016x}")
                except fastapi.WebSocketDisconnect:
                    pass
    """,
}

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: seen
            handler: {path: model.py}
    """,
    "model.py": """
        from opentelemetry import trace


        class Model:
            def predict(self, inputs):
                return {"span_id": format(trace.get_current_span().get_span_context().span_id, "016x")}
    """,
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any, receiver: Receiver) -> dict[str, Any]:
    started = {
        "truss": start_server_module(write_project(tmp_path_factory.mktemp("truss"), TRUSS), env=env(receiver)),
        "api": start_server_module(write_project(tmp_path_factory.mktemp("api"), PROJECT), env=env(receiver)),
    }
    for server in started.values():
        server.wait_ready()
    return started


def ws_url(server: Any, path: str) -> str:
    return server.url.replace("http://", "ws://") + path


def session_span(receiver: Receiver, trace_id: str, parent_id: str, messages: int) -> tuple[Span, list[Span]]:
    """The session's server span, child of the client's, and its message spans once all have come."""

    def found(spans: list[Span]) -> Any:
        session = next((s for s in spans if s.trace_id == trace_id and s.parent_id == parent_id), None)
        if session is None:
            return None
        mine = sorted(
            (s for s in children(spans, session) if s.name == "modelserve.websocket.message"), key=lambda s: s.start
        )
        return (session, mine) if len(mine) == messages else None

    result: tuple[Span, list[Span]] = receiver.wait_for(found)
    return result


def test_a_truss_websocket_session_continues_the_trace_with_a_span_per_message(
    servers: dict[str, Any], receiver: Receiver
) -> None:
    headers, trace_id, parent_id = client_span()

    async def exchange() -> tuple[str, list[str]]:
        replies = []
        async with websockets.connect(ws_url(servers["truss"], "/v1/websocket"), additional_headers=headers) as socket:
            assert socket.response is not None
            accepted = socket.response.headers["traceparent"]
            for text in ("hello", "world"):
                await socket.send(text)
                replies.append(str(await socket.recv()))
            await socket.send("done")
            with pytest.raises(ConnectionClosed):
                await socket.recv()
        return accepted, replies

    accepted, replies = asyncio.run(exchange())
    session, messages = session_span(receiver, trace_id, parent_id, 3)
    assert session.name == "GET /v1/websocket" and session.kind == 2  # server
    assert session.attributes["http.route"] == "/v1/websocket"
    assert session.attributes["http.response.status_code"] == 101
    assert session.attributes["modelserve.websocket.messages"] == 3
    assert session.status == 0
    assert accepted.split("-")[1:3] == [trace_id, session.span_id]  # the accept names the session's span
    # each message's span was current while the model handled it, and ended before the next arrived
    assert [reply.split()[0] for reply in replies] == ["hello", "world"]
    assert [reply.split()[1] for reply in replies] == [span.span_id for span in messages[:2]]
    assert messages[0].end <= messages[1].start <= messages[1].end <= messages[2].start
    assert [span.attributes["modelserve.websocket.message.size"] for span in messages] == [5, 5, 4]
    assert all(span.attributes["modelserve.websocket.message.type"] == "text" for span in messages)


def test_an_api_websocket_message_has_its_span_and_the_stages_below_it(
    servers: dict[str, Any], receiver: Receiver
) -> None:
    headers, trace_id, parent_id = client_span()

    async def exchange() -> str:
        async with websockets.connect(ws_url(servers["api"], "/seen/ws"), additional_headers=headers) as socket:
            await socket.send('{"x": 1}')
            reply = str(await socket.recv())
            with pytest.raises(ConnectionClosed):
                await socket.recv()
        return reply

    reply = asyncio.run(exchange())
    session, (message,) = session_span(receiver, trace_id, parent_id, 1)
    assert session.name == "GET /seen/ws"
    assert session.attributes["modelserve.api"] == "seen"
    assert session.attributes["http.response.status_code"] == 101
    assert f'"span_id":"{message.span_id}"' in reply.replace(" ", "")  # predict ran with the message's span current
    stage = receiver.wait_for(
        lambda spans: next((s for s in children(spans, message) if s.name == "modelserve.stage.predict"), None)
    )
    assert message.start <= stage.start <= stage.end <= message.end <= session.end
