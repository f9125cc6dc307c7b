"""The command's shutdown closes open WebSocket sessions with 1001 (going away) with ``--workers 2``, with
``--reload`` and with ``--server granian``, as in one process (tests/http/test_websocket.py).
uvicorn's own close is 1012; `modelserve._serving` makes the worker processes serve through `ClosingServer`."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from modelserve import _serving
from tests.conftest import write_project

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: words
            handler: {path: words.py, class: Words}
    """,
    "words.py": """
        class Words:
            def predict(self, inputs):
                yield from inputs.split()
    """,
}


@pytest.mark.parametrize(
    "options",
    [["--workers", "2"], ["--reload"], ["--server", "granian"]],
    ids=["workers", "reload", "granian"],
)
def test_sigterm_closes_open_sessions_with_1001(start_server: Any, tmp_path: Path, options: list[str]) -> None:
    if options[0] == "--server":
        pytest.importorskip("granian")
    served = start_server(write_project(tmp_path / "project", PROJECT), *options)
    served.wait_ready()

    async def session() -> tuple[list[Any], int, str]:
        received: list[Any] = []
        async with websockets.connect(served.url.replace("http://", "ws://") + "/words/ws") as waiting:
            served.process.send_signal(signal.SIGTERM)
            try:
                while True:
                    received.append(await waiting.recv())
            except ConnectionClosed as closed:
                assert closed.rcvd is not None, "closed without a close frame"
                return received, closed.rcvd.code, closed.rcvd.reason
        raise AssertionError("unreachable")

    assert asyncio.run(asyncio.wait_for(session(), 30)) == ([], 1001, "the server is shutting down")
    assert served.wait_exit() == 0


def test_what_the_worker_processes_rely_on_in_uvicorn_is_there() -> None:
    assert _serving.workers_missing() == []


def test_a_uvicorn_that_changed_its_worker_process_is_found_out(monkeypatch: pytest.MonkeyPatch) -> None:
    class Changed:
        """A worker process class that makes its server some other way."""

        def __init__(self) -> None:
            self.server = None

        def target(self) -> None:
            return None

    monkeypatch.setattr(_serving.multiprocess, "Process", Changed)
    absent = _serving.workers_missing()
    assert any(item.startswith("Process.server") for item in absent)
    assert any(item.startswith("Process.target") for item in absent)
    assert any(item.startswith("Process.pong") for item in absent)


def test_a_supervisor_that_makes_its_workers_otherwise_is_found_out(monkeypatch: pytest.MonkeyPatch) -> None:
    class Changed(_serving.multiprocess.Multiprocess):
        def init_processes(self) -> None:
            return None

    monkeypatch.setattr(_serving.multiprocess, "Multiprocess", Changed)
    assert _serving.workers_missing() == ["Multiprocess.init_processes: makes its workers as the module's Process"]


def test_the_worker_process_serves_through_the_closing_server() -> None:
    """Without starting it: the property uvicorn's worker serves through, on a process made in this one."""
    import socket

    from uvicorn import Config

    with socket.socket() as sock:
        process = _serving.ClosingProcess(Config("modelserve.launch:worker_app", factory=True), [sock])
        try:
            assert isinstance(process.server, _serving.ClosingServer)
            assert process.server is process.server
        finally:
            process.parent_conn.close()
            process.child_conn.close()
