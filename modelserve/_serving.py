"""uvicorn's server as the command runs it: its shutdown closes open WebSocket sessions with 1001 (going away).

uvicorn closes every WebSocket still open at its shutdown with 1012 (service restart); modelserve's sessions get
1001 first, the code a client reads as "this server is going away" (docs/websocket.md). `ClosingServer` does
it in the process that serves; with ``--reload`` it is the reloader's target, and with ``--workers N``
`run_workers` makes each worker process serve through it:

- uvicorn's `Multiprocess` makes each worker as its module's `Process`, whose ``server`` property makes a plain
  `uvicorn.Server` in the worker. `ClosingProcess` makes a `ClosingServer` instead, and `run_workers` has the
  supervisor make `ClosingProcess` by setting that module's name while it runs (this process runs nothing
  else then). These are uvicorn's internals: `workers_missing` checks them first and, when one changed, the
  workers serve with uvicorn's own `Process` (sessions closed with 1012) after one warning.

Both classes are defined at module level, so that the ``spawn`` start method pickles them by name into the
worker processes.
"""

from __future__ import annotations

import inspect
import logging
from socket import socket
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.supervisors import multiprocess

if TYPE_CHECKING:
    from modelserve.server import ModelServer

logger = logging.getLogger("modelserve")

#: The model servers of this process (`closing_at_shutdown`), whose sessions `ClosingServer` closes.
_SERVED: list[ModelServer] = []


def closing_at_shutdown(server: ModelServer) -> None:
    """Have this process's `ClosingServer` close the WebSocket sessions of `server` with 1001 at its shutdown."""
    _SERVED.append(server)


class ClosingServer(uvicorn.Server):
    """uvicorn's server whose shutdown first closes the open WebSocket sessions with 1001 (going away)."""

    async def shutdown(self, sockets: list[socket] | None = None) -> None:
        from modelserve.http.websocket import going_away

        for server in list(_SERVED):
            await going_away(server)
        await super().shutdown(sockets)


class ClosingProcess(multiprocess.Process):
    """A worker process of uvicorn's `Multiprocess` that serves through a `ClosingServer`."""

    @property
    def server(self) -> uvicorn.Server:
        made: uvicorn.Server | None = self.__dict__.get("_closing_server")
        if made is None:
            made = self.__dict__["_closing_server"] = ClosingServer(config=self.config)
        return made


#: The methods of `Multiprocess` that make a worker by the module's name `Process`.
MAKERS = ("init_processes", "restart_all", "keep_subprocess_alive")
#: The methods of `Process` that serve through its ``server`` property.
USERS = ("target", "pong")


def workers_missing() -> list[str]:
    """What `ClosingProcess` and `run_workers` rely on in uvicorn's `multiprocess` module and lacks; empty
    when nothing. Read from the code's names, not run: a worker process costs a second."""
    process = getattr(multiprocess, "Process", None)
    supervisor = getattr(multiprocess, "Multiprocess", None)
    if not isinstance(process, type) or not isinstance(supervisor, type):
        return ["uvicorn.supervisors.multiprocess: the classes Process and Multiprocess"]
    absent = []
    for name in MAKERS:
        code = getattr(getattr(supervisor, name, None), "__code__", None)
        if code is None or "Process" not in code.co_names:
            absent.append(f"Multiprocess.{name}: makes its workers as the module's Process")
    if not isinstance(inspect.getattr_static(process, "server", None), property):
        absent.append("Process.server: the property that makes the worker's server")
    for name in USERS:
        code = getattr(getattr(process, name, None), "__code__", None)
        if code is None or "server" not in code.co_names:
            absent.append(f"Process.{name}: serves through Process.server")
    return absent


def run_workers(config: uvicorn.Config, sockets: list[socket]) -> multiprocess.Multiprocess:
    """Run uvicorn's `Multiprocess` supervisor over `sockets` until it stops, each worker serving through a
    `ClosingServer` (uvicorn's plain server, with one warning, when `workers_missing` finds a change)."""
    supervisor = multiprocess.Multiprocess(config, sockets=sockets)
    absent = workers_missing()
    if absent:
        logger.warning(
            "uvicorn %s lacks what modelserve's worker processes rely on (%s): WebSocket sessions still open at "
            "the shutdown are closed with uvicorn's 1012 instead of 1001",
            uvicorn.__version__,
            "; ".join(absent),
        )
        supervisor.run()
        return supervisor
    stock: Any = multiprocess.Process
    multiprocess.Process = ClosingProcess  # type: ignore[misc]
    try:
        supervisor.run()
    finally:
        multiprocess.Process = stock  # type: ignore[misc]
    return supervisor
