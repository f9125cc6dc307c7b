"""The native routes of an API with numbered versions (`modelserve.repository`): ``POST /<api>/versions/<v>``
runs version `v` as ``POST /<api>`` runs the API, ``GET`` describes it.

The versions an API serves change while it serves (a repository load adds or retires some), so the version
is read from the path when a request comes, in the API's `Versions`: a version added by a load is reached as
soon as it serves, and one no longer served answers V2's 404 (``Request for unknown model: '<api>' version
<v> is not found``); an unloaded one answers its 503, as V2 does. ``POST /<api>`` is `CurrentVersion`: each
request goes to the highest ready version, as V2's unversioned routes do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.types import Receive, Scope, Send

from modelserve.errors import NotFound
from modelserve.http._asgi import request_headers
from modelserve.http.access import answering
from modelserve.http.errors import send_error
from modelserve.http.exchange import writes_access_line
from modelserve.http.realtime import RealtimeEndpoint
from modelserve.http.routing import Route

if TYPE_CHECKING:
    from modelserve.api import Api
    from modelserve.repository import Versions
    from modelserve.server import ModelServer


class CurrentVersion(RealtimeEndpoint):
    """``/<api>`` of an API with numbered versions: each request runs the version that is the highest ready one
    when it comes (the exchange reads ``api`` once per request, so a request stays on the version it began on).
    """

    def __init__(self, versions: Versions) -> None:
        self.versions = versions
        super().__init__(versions.current())

    @property  # the exchange's __init__ sets it once: the setter below ignores that
    def api(self) -> Api:
        return self.versions.current()

    @api.setter
    def api(self, value: Api) -> None:
        pass


class VersionRoutes:
    """``/<api>/versions/{version}`` of one API: the endpoint of each served version, looked up per request."""

    def __init__(self, versions: Versions) -> None:
        self.versions = versions
        self.name = versions.name
        #: One endpoint per loaded `Api` of a version (a reload of a version makes a new one).
        self._endpoints: dict[int, RealtimeEndpoint] = {}
        self._answering = answering(self.name)
        for number in versions.apis:
            self.endpoint(str(number))

    @property
    def api(self) -> Api:
        """The API the route belongs to (the API keys and the access line read its name)."""
        return self.versions.current()

    def endpoint(self, version: str) -> RealtimeEndpoint | None:
        """The endpoint of `version` (digits, as the path has it), None when it is not served now."""
        if not (version.isascii() and version.isdigit() and len(version) <= 18):
            return None
        number = int(version)
        api = self.versions.apis.get(number)
        if api is None:
            return None
        endpoint = self._endpoints.get(number)
        if endpoint is None or endpoint.api is not api:
            endpoint = self._endpoints[number] = RealtimeEndpoint(api)
        return endpoint

    def _unknown(self, version: str) -> NotFound:
        return NotFound(f"Request for unknown model: '{self.name}' version {version[:40]} is not found")

    async def get(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = scope["path_params"]["version"]
        endpoint = self.endpoint(version)
        if endpoint is None:
            await send_error(send, self._unknown(version), request_headers(scope)[0])
            return
        await endpoint.get(scope, receive, send)

    @writes_access_line
    async def post(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = scope["path_params"]["version"]
        endpoint = self.endpoint(version)
        if endpoint is None:
            await send_error(self._answering(scope, send), self._unknown(version), request_headers(scope)[0])
            return
        await endpoint.post(scope, receive, send)


def routes(server: ModelServer) -> list[Route]:
    """``/<api>`` (and ``/`` when it is the server's only API) and ``/<api>/versions/{version}`` of each realtime
    API with numbered versions."""
    table = []
    for name, versions in server.versions.items():
        if server.apis[name].config.kind != "realtime":
            continue
        current = CurrentVersion(versions)
        for path in [f"/{name}", "/"] if len(server.apis) == 1 else [f"/{name}"]:
            table.append(Route(path, {"GET": current.get, "POST": current.post}))
        each = VersionRoutes(versions)
        table.append(Route(f"/{name}/versions/{{version}}", {"GET": each.get, "POST": each.post}))
    return table
