"""HTTP routes of async APIs, and the extension that owns their store and workers.

``POST /<api>`` stores a job and answers ``{"id": ...}`` once it is committed; ``GET /<api>/<id>`` shows
it; ``DELETE /<api>/<id>`` cancels it; ``GET /<api>`` describes the API.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from modelserve._http import ClientGone, read_body, request_headers, send_body, send_http_error, send_json
from modelserve.codecs import JSON_TYPE, decode_payload
from modelserve.context import RequestContext, current
from modelserve.endpoint import CLIENT_CLOSED
from modelserve.errors import ConfigError, Conflict, HTTPError, NotFound, ServiceUnavailable
from modelserve.jobs import make_store
from modelserve.jobs.base import CANCELLED, ENDED, IN_PROGRESS, JobQueueFull, JobStore, NewJob
from modelserve.jobs.worker import JobWorker
from modelserve.logs import access_writer

if TYPE_CHECKING:
    from modelserve.apis import Api
    from modelserve.app import ModelServer

logger = logging.getLogger("modelserve")


def stored_payload(content_type: str | None, body: bytes) -> tuple[str, bytes]:
    """Decode a body now (a malformed one is a 400 at submit), and keep it in a form that round-trips."""
    value = decode_payload(content_type, body)
    if isinstance(value, str):
        return "text", value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return "bytes", bytes(value)
    return "json", body


class JobsEndpoint:
    """ASGI app of one async API: submit, describe, poll and cancel."""

    def __init__(self, api: Api, jobs: Jobs) -> None:
        self.api = api
        self.name = api.name
        self.jobs = jobs
        self.worker: JobWorker | None = None
        self.access_log = access_writer()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        request_id, content_type, content_length, _ = request_headers(scope)
        job_id = scope.get("path_params", {}).get("job_id")
        method = scope["method"]
        token = current.set(RequestContext(self.name, request_id))
        status = 200
        try:
            if job_id is None and method == "GET":
                await send_json(send, 200, self.describe(), request_id)
            elif job_id is None:
                await self.submit(receive, send, request_id, content_type, content_length)
            elif method == "GET":
                await self.show(send, job_id, request_id)
            else:
                await self.cancel(send, job_id, request_id)
        except HTTPError as exc:
            if isinstance(exc, JobQueueFull):
                self.api.metrics.queue_full.inc()
            status = exc.status_code
            await send_http_error(send, exc, request_id)
        except ClientGone:
            status = CLIENT_CLOSED
        finally:
            current.reset(token)
        seconds = time.perf_counter() - started
        self.api.metrics.answered(status, seconds)
        if self.access_log is not None:
            self.access_log(scope, status, seconds, request_id, self.name)

    def _store(self, submitting: bool = False) -> JobStore:
        """The store, once this API has loaded and its worker runs (else a 503)."""
        if self.jobs.closed:
            raise ServiceUnavailable("the server is shutting down; retry later")
        if not self.api.ready or self.worker is None:
            if self.api.state == "failed":
                raise ServiceUnavailable(f"api '{self.name}' failed to load; see the server log", retry_after=30)
            raise ServiceUnavailable(f"api '{self.name}' is loading; retry later")
        if submitting and not self.jobs.accepting:
            raise ServiceUnavailable("the server is shutting down; retry later")
        return self.jobs.store

    async def submit(
        self, receive: Receive, send: Send, job_id: str, content_type: str | None, content_length: str | None
    ) -> None:
        store = self._store(submitting=True)
        body = await read_body(receive, self.api.config.max_body_size, content_length)
        kind, payload = stored_payload(content_type, body)
        await store.submit(NewJob(self.name, job_id, kind, payload), self.api.config.max_queue_length)
        assert self.worker is not None
        self.worker.wake()
        self.api.metrics.job("in_queue")
        await send_body(send, 200, b'{"id":"' + job_id.encode() + b'"}', JSON_TYPE, job_id)

    async def show(self, send: Send, job_id: str, request_id: str) -> None:
        view = await self._store().get(self.name, job_id)
        if view is None:
            raise NotFound(f"no job {job_id!r} in api '{self.name}' (unknown, or removed after its result_ttl)")
        await send_body(send, 200, view.to_json(), JSON_TYPE, request_id)

    async def cancel(self, send: Send, job_id: str, request_id: str) -> None:
        store = self._store()
        before = await store.cancel(self.name, job_id, self.api.config.result_ttl)
        if before is None:
            raise NotFound(f"no job {job_id!r} in api '{self.name}' (unknown, or removed after its result_ttl)")
        if before in ENDED and before != CANCELLED:
            raise Conflict(f"job {job_id!r} has already {before}; it cannot be cancelled")
        if before != CANCELLED:
            self.api.metrics.job(CANCELLED)
            if before == IN_PROGRESS and self.worker is not None and not self.worker.cancel_local(job_id):
                logger.info("api '%s': job %s runs in another process; it will stop there", self.name, job_id)
        view = await store.get(self.name, job_id)
        await send_body(send, 200, view.to_json() if view else b"{}", JSON_TYPE, request_id)

    def describe(self) -> dict[str, Any]:
        described = self.api.describe()
        described.update(result_ttl=self.api.config.result_ttl, jobs_store=self.jobs.store.description)
        return described


class Jobs:
    """The async APIs of one server: their store, a worker per API, and their routes.

    A server extension: `start` runs once every API has loaded, `stop` at shutdown.
    """

    def __init__(self, server: ModelServer, apis: list[Api]) -> None:
        self.server = server
        self.store = make_store(server.project.jobs, server.project.root)
        if server.workers > 1 and not self.store.shared:
            raise ConfigError(
                f"the {self.store.description} job store cannot be shared by --workers {server.workers}: each "
                "process would keep its own jobs. Use the sqlite store (the default) or a redis:// store"
            )
        self.store.check()
        self.endpoints = [JobsEndpoint(api, self) for api in apis]
        self.accepting = False
        self.closed = False

    def routes(self) -> list[BaseRoute]:
        routes: list[BaseRoute] = []
        for endpoint in self.endpoints:
            routes.append(Route(f"/{endpoint.name}", endpoint, methods=["GET", "POST"]))
            routes.append(Route(f"/{endpoint.name}/{{job_id}}", endpoint, methods=["GET", "DELETE"]))
            if len(self.server.apis) == 1:
                routes.append(Route("/", endpoint, methods=["GET", "POST"]))
        return routes

    async def start(self) -> None:
        await self.store.open()
        if not self.store.durable:
            logger.warning("async jobs are kept in memory: queued and finished jobs do not survive a restart")
        for index, endpoint in enumerate(self.endpoints):
            depth = self.server.metrics.jobs_queued.labels(endpoint.name)
            worker = JobWorker(endpoint.api, self.store, sweeps=index == 0, queue_depth=depth)
            worker.start()
            endpoint.worker = worker
        self.accepting = True

    async def stop(self) -> None:
        self.accepting = False
        grace = self.server.graceful_timeout
        for endpoint in self.endpoints:
            if endpoint.worker is not None:
                await endpoint.worker.stop(grace)
        for endpoint in self.endpoints:
            try:
                queued = await self.store.queued(endpoint.name)
            except Exception:
                continue
            if queued and self.store.durable:
                logger.info(
                    "api '%s': %d queued job(s) stay in the %s and run at the next start",
                    endpoint.name,
                    queued,
                    self.store.description,
                )
            elif queued:
                logger.warning(
                    "api '%s': %d queued job(s) dropped (the memory store does not survive a restart)",
                    endpoint.name,
                    queued,
                )
        self.closed = True
        await self.store.close()
