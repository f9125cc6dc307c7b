"""The native route of each version of an API with numbered versions (`modelserve.repository`):
``POST /<api>/versions/<v>`` runs version `v` as ``POST /<api>`` runs the API, ``GET`` describes it.

``POST /<api>`` itself runs the version that was the highest when the server started. The routes are those of
the versions served at start; a version a repository load adds later is reached over V2 and gRPC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from modelserve.http.realtime import RealtimeEndpoint
from modelserve.http.routing import Route

if TYPE_CHECKING:
    from modelserve.server import ModelServer


def routes(server: ModelServer) -> list[Route]:
    """``/<api>/versions/<v>`` of each served version of each realtime API with numbered versions."""
    table = []
    for name, versions in server.versions.items():
        if server.apis[name].config.kind != "realtime":
            continue
        for number, api in sorted(versions.apis.items()):
            endpoint = RealtimeEndpoint(api)
            table.append(Route(f"/{name}/versions/{number}", {"GET": endpoint.get, "POST": endpoint.post}))
    return table
