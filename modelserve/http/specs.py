"""The wire protocols the HTTP edge speaks: a registry of the spec modules that make each one's routes.

A project's ``protocols:`` (modelserve.yaml) names the protocols it serves, ``native`` and ``v2`` by default.
Each spec module offers ``routes(server) -> list[Route]``: its routes for the server's APIs, whose model
calls run the one exchange (`modelserve.http.exchange`). A module is imported only when a project serves
its protocol::

    routes(server)              # every served protocol's routes, in the order of PROTOCOLS

Adding a transport is one module (an `Exchange` subclass with ``read_head``/``decode``/``encode``, and its
``routes(server)``) and one line here; ``protocols:`` in modelserve.yaml must name it too (`config.PROTOCOLS`,
which a test keeps equal to this registry).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from modelserve.http.routing import Route
    from modelserve.server import ModelServer

#: Each protocol's spec modules, in the order their routes enter the table: ``native`` is ``POST /<api>`` of
#: the realtime APIs, the job routes of the async ones, OpenAI's paths of the APIs that ask for them (``openai:``,
#: or a Truss class's ``chat_completions``...), Truss's and SageMaker's routes of a Truss API, and ``/v1/websocket``;
#: ``v2`` the Open Inference Protocol (``/v2/...``).
PROTOCOLS: dict[str, tuple[str, ...]] = {
    "native": (
        "modelserve.http.realtime",
        "modelserve.http.versions",
        "modelserve.http.jobs",
        "modelserve.http.openai",
        "modelserve.http.truss",
        "modelserve.http.websocket",
    ),
    "v2": ("modelserve.http.v2",),
}


def routes(server: ModelServer) -> list[Route]:
    """The routes of every protocol the server's project serves."""
    table: list[Route] = []
    for protocol, modules in PROTOCOLS.items():
        if protocol in server.project.protocols:
            for module in modules:
                table += importlib.import_module(module).routes(server)
    return table
