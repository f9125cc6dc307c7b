"""The routes of the wire protocols the HTTP edge speaks, from the registry `config.PROTOCOLS`.

A project's ``protocols:`` (modelserve.yaml) names the protocols it serves, ``native`` and ``v2`` by default.
Each spec module the registry names offers ``routes(server) -> list[Route]``: its routes for the server's
APIs, whose model calls run the one exchange (`modelserve.http.exchange`). A module is imported only when a
project serves its protocol::

    routes(server)              # every served protocol's routes, in the order of config.PROTOCOLS

Adding a transport is one module (an `Exchange` subclass with ``read_head``/``decode``/``encode``, and its
``routes(server)``) and one line in `config.PROTOCOLS`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from modelserve.config import PROTOCOLS

if TYPE_CHECKING:
    from modelserve.http.routing import Route
    from modelserve.server import ModelServer


def routes(server: ModelServer) -> list[Route]:
    """The routes of every protocol the server's project serves."""
    table: list[Route] = []
    for protocol, modules in PROTOCOLS.items():
        if protocol in server.project.protocols:
            for module in modules:
                table += importlib.import_module(module).routes(server)
    return table
