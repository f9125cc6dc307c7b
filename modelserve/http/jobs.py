"""The job spec: the HTTP routes of an async API. ``POST /<api>`` submits a job and answers ``{"id": ...}``
once it is committed, ``GET /<api>/<id>`` shows it, ``DELETE /<api>/<id>`` cancels it, ``GET /<api>``
describes the API. ``HEAD`` answers like ``GET`` and changes nothing.

Each route that reaches the jobs service (`modelserve.jobs.service`) is an exchange (`modelserve.http.exchange`)
that calls the service instead of the API: the request id is the job's id, and the payload is decoded (and
refused with a 400) by the service when it is stored, in a worker thread when large.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send

from modelserve.api import Api
from modelserve.codecs import JSON_TYPE
from modelserve.context import RequestContext
from modelserve.http._asgi import request_headers, send_json
from modelserve.http.exchange import Exchange, Head, writes_access_line
from modelserve.http.routing import Route
from modelserve.jobs.service import Jobs

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from modelserve.server import ModelServer


class _JobExchange(Exchange):
    """An exchange that reaches the jobs service: admitted while the API is ready, never into its line."""

    inline_max = sys.maxsize  # nothing is decoded here: the service decodes a large payload in a thread

    def __init__(self, api: Api, jobs: Jobs) -> None:
        super().__init__(api)
        self.jobs = jobs
        self.admit = self._ready
        self.unadmit = _nothing
        self.call = self._call

    def _ready(self, size: int) -> None:
        if not self.api.ready:
            raise self.api.not_ready()

    async def _call(self, value: Any, ctx: RequestContext, **_: Any) -> Any:
        raise NotImplementedError


class _Submit(_JobExchange):
    def decode(self, body: bytes, head: Head, ctx: RequestContext) -> Any:
        return head[1], body

    async def _call(self, value: Any, ctx: RequestContext, **_: Any) -> Any:
        content_type, body = value
        await self.jobs.submit(self.api, ctx.request_id, content_type, body)

    def encode(self, result: Any, value: Any, head: Head, ctx: RequestContext) -> Any:
        return b'{"id":"' + ctx.request_id.encode() + b'"}', JSON_TYPE, None


class _Show(_JobExchange):
    @staticmethod
    def read_head(scope: Scope) -> Head:
        return request_headers(scope)[0], None, None, scope["path_params"]["job_id"]

    def decode(self, body: bytes, head: Head, ctx: RequestContext) -> Any:
        return head[3]

    async def _call(self, value: Any, ctx: RequestContext, **_: Any) -> Any:
        return await self.jobs.show(self.api, value)

    def encode(self, result: Any, value: Any, head: Head, ctx: RequestContext) -> Any:
        return result.to_json(), JSON_TYPE, None


class _Cancel(_Show):
    async def _call(self, value: Any, ctx: RequestContext, **_: Any) -> Any:
        return await self.jobs.cancel(self.api, value)

    def encode(self, result: Any, value: Any, head: Head, ctx: RequestContext) -> Any:
        return result.to_json() if result else b"{}", JSON_TYPE, None


class JobsEndpoint:
    """The handlers of one async API's routes, by method."""

    def __init__(self, api: Api, jobs: Jobs) -> None:
        self.api = api
        self.jobs = jobs
        self._submit = _Submit(api, jobs)
        self._show = _Show(api, jobs)
        self._cancel = _Cancel(api, jobs)

    async def describe(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self.jobs.describe(self.api), request_headers(scope)[0])

    @writes_access_line
    def submit(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        return self._submit.exchange(scope, receive, send)

    @writes_access_line
    def show(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        return self._show.exchange(scope, receive, send)

    @writes_access_line
    def cancel(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        return self._cancel.exchange(scope, receive, send)


def _nothing(size: int) -> None:
    return None


def routes(server: ModelServer) -> list[Route]:
    """``/<api>`` (and ``/`` too, when it is the server's only API) and ``/<api>/{job_id}`` of each async API."""
    table = []
    for api in server.apis.values():
        if api.config.kind == "async":
            assert server.jobs is not None
            endpoint = JobsEndpoint(api, server.jobs)
            paths = [f"/{api.name}", "/"] if len(server.apis) == 1 else [f"/{api.name}"]
            for path in paths:
                table.append(Route(path, {"GET": endpoint.describe, "POST": endpoint.submit}))
            table.append(Route(f"/{api.name}/{{job_id}}", {"GET": endpoint.show, "DELETE": endpoint.cancel}))
    return table
