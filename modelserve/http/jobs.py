"""The HTTP routes of an async API: ``POST /<api>`` submits a job and answers ``{"id": ...}`` once it is
committed, ``GET /<api>/<id>`` shows it, ``DELETE /<api>/<id>`` cancels it, ``GET /<api>`` describes the API.
``HEAD`` answers like ``GET`` and changes nothing."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from starlette.types import Receive, Scope, Send

from modelserve.api import Api
from modelserve.codecs import JSON_TYPE
from modelserve.context import RequestContext, current
from modelserve.http._asgi import read_body, request_headers, send_body, send_json
from modelserve.http.errors import send_error
from modelserve.jobs.service import Jobs
from modelserve.logs import access_writer

#: What a route handler does once the request's headers are read: sends the answer, returns the status.
Action = Callable[[Scope, Receive, Send, str, str | None, str | None], Awaitable[int]]


class JobsEndpoint:
    """The handlers of one async API's routes, by method."""

    def __init__(self, api: Api, jobs: Jobs) -> None:
        self.api = api
        self.name = api.name
        self.jobs = jobs
        self.access_log = access_writer()

    async def _serve(self, scope: Scope, receive: Receive, send: Send, action: Action) -> None:
        started = time.perf_counter()
        request_id, content_type, content_length, _ = request_headers(scope)
        token = current.set(RequestContext(self.name, request_id))
        try:
            status = await action(scope, receive, send, request_id, content_type, content_length)
        except Exception as exc:
            status = await send_error(send, exc, request_id)
        finally:
            current.reset(token)
        seconds = time.perf_counter() - started
        self.api.metrics.answered(status, seconds)
        if self.access_log is not None:
            self.access_log(scope, status, seconds, request_id, self.name)

    # the routes

    async def describe(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self.jobs.describe(self.api), request_headers(scope)[0])

    async def submit(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._serve(scope, receive, send, self._submit)

    async def show(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._serve(scope, receive, send, self._show)

    async def cancel(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._serve(scope, receive, send, self._cancel)

    # what they do

    async def _submit(
        self, scope: Scope, receive: Receive, send: Send, job_id: str, content_type: str | None, length: str | None
    ) -> int:
        if not self.api.ready:
            raise self.api.not_ready()
        body = await read_body(receive, self.api.config.max_body_size, length)
        await self.jobs.submit(self.api, job_id, content_type, body)
        await send_body(send, 200, b'{"id":"' + job_id.encode() + b'"}', JSON_TYPE, job_id)
        return 200

    async def _show(
        self, scope: Scope, receive: Receive, send: Send, request_id: str, content_type: str | None, length: str | None
    ) -> int:
        view = await self.jobs.show(self.api, scope["path_params"]["job_id"])
        await send_body(send, 200, view.to_json(), JSON_TYPE, request_id)
        return 200

    async def _cancel(
        self, scope: Scope, receive: Receive, send: Send, request_id: str, content_type: str | None, length: str | None
    ) -> int:
        view = await self.jobs.cancel(self.api, scope["path_params"]["job_id"])
        await send_body(send, 200, view.to_json() if view else b"{}", JSON_TYPE, request_id)
        return 200
