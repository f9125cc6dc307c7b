"""The jobs service of a server: the store of its async APIs and a worker per API.

A server extension: `start` runs once every API has loaded, `stop` at shutdown (running jobs get the
server's ``graceful_timeout`` to finish, then go back to the queue). The HTTP routes that submit, show and
cancel jobs are in `modelserve.http.jobs`; they call `submit`, `show` and `cancel` here.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelserve import _threads, context
from modelserve.codecs import DECODE_INLINE_MAX, decode_payload, release_in_pieces
from modelserve.errors import ConfigError, Conflict, JobQueueFull, NotFound, ServiceUnavailable
from modelserve.jobs import make_store
from modelserve.jobs.base import CANCELLED, ENDED, IN_PROGRESS, JobView, NewJob
from modelserve.jobs.worker import JobWorker

if TYPE_CHECKING:
    from modelserve.api import Api
    from modelserve.config import JobsConfig
    from modelserve.metrics import Metrics

logger = logging.getLogger("modelserve")


def stored_payload(content_type: str | None, body: bytes) -> tuple[str, bytes]:
    """Decode a body now (a malformed one is a 400 at submit), and keep it in a form that round-trips."""
    box = [decode_payload(content_type, body)]
    value = box[0]
    if isinstance(value, str):
        return "text", value.encode("utf-8")
    if isinstance(value, (bytes, bytearray)):
        return "bytes", bytes(value)
    del value
    release_in_pieces(box.pop())  # a large value a piece at a time (this runs in a worker thread for those)
    return "json", body


class Jobs:
    """The async APIs of one server: their store and a worker per API."""

    def __init__(self, jobs: JobsConfig, root: Path, apis: list[Api], metrics: Metrics, workers: int) -> None:
        self.store = make_store(jobs, root)
        if workers > 1 and not self.store.shared:
            raise ConfigError(
                f"the {self.store.description} job store cannot be shared by --workers {workers}: each "
                "process would keep its own jobs. Use the sqlite store (the default) or a redis:// store"
            )
        self.store.check()
        self.apis = {api.name: api for api in apis}
        self.metrics = metrics
        self.workers: dict[str, JobWorker] = {}
        #: Seconds that running jobs get to finish at shutdown (the CLI's --graceful-timeout).
        self.graceful_timeout = 30.0
        self.accepting = False
        self.closed = False

    def _ready(self, api: Api, submitting: bool = False) -> JobWorker:
        """The API's worker, once it has loaded and its worker runs (else a 503)."""
        if self.closed:
            raise ServiceUnavailable("the server is shutting down; retry later")
        worker = self.workers.get(api.name)
        if not api.ready or worker is None:
            raise api.not_ready()
        if submitting and not self.accepting:
            raise ServiceUnavailable("the server is shutting down; retry later")
        return worker

    async def submit(self, api: Api, job_id: str, content_type: str | None, body: bytes) -> None:
        """Store a job; returns once it is committed (`DuplicateJob`, `JobQueueFull` when refused)."""
        worker = self._ready(api, submitting=True)
        if len(body) > DECODE_INLINE_MAX:  # parsed off the event loop, as on a realtime route
            kind, payload = await _threads.run_sync(stored_payload, content_type, body)
        else:
            kind, payload = stored_payload(content_type, body)
        trace = context.tracing.job_context() if context.tracing is not None else None
        try:
            await self.store.submit(NewJob(api.name, job_id, kind, payload, trace), api.config.max_queue_length)
        except JobQueueFull:
            api.metrics.queue_full.inc()
            raise
        worker.wake()
        api.metrics.job("in_queue")

    async def show(self, api: Api, job_id: str) -> JobView:
        self._ready(api)
        view = await self.store.get(api.name, job_id)
        if view is None:
            raise NotFound(f"no job {job_id!r} in api '{api.name}' (unknown, or removed after its result_ttl)")
        return view

    async def cancel(self, api: Api, job_id: str) -> JobView | None:
        worker = self._ready(api)
        before = await self.store.cancel(api.name, job_id, api.config.result_ttl)
        if before is None:
            raise NotFound(f"no job {job_id!r} in api '{api.name}' (unknown, or removed after its result_ttl)")
        if before in ENDED and before != CANCELLED:
            raise Conflict(f"job {job_id!r} has already {before}; it cannot be cancelled")
        if before != CANCELLED:
            api.metrics.job(CANCELLED)
            if before == IN_PROGRESS and not worker.cancel_local(job_id):
                logger.info("api '%s': job %s runs in another process; it will stop there", api.name, job_id)
        return await self.store.get(api.name, job_id)

    def describe(self, api: Api) -> dict[str, Any]:
        described = api.describe()
        described.update(result_ttl=api.config.result_ttl, jobs_store=self.store.description)
        return described

    async def start(self) -> None:
        await self.store.open()
        if not self.store.durable:
            logger.warning("async jobs are kept in memory: queued and finished jobs do not survive a restart")
        for index, api in enumerate(self.apis.values()):
            depth = self.metrics.jobs_queued.labels(api.name)
            worker = JobWorker(api, self.store, sweeps=index == 0, queue_depth=depth)
            worker.start()
            self.workers[api.name] = worker
        self.accepting = True

    async def stop(self) -> None:
        self.accepting = False
        for worker in self.workers.values():
            await worker.stop(self.graceful_timeout)
        for name in self.apis:
            try:
                queued = await self.store.queued(name)
            except Exception:
                continue
            if queued and self.store.durable:
                logger.info(
                    "api '%s': %d queued job(s) stay in the %s and run at the next start",
                    name,
                    queued,
                    self.store.description,
                )
            elif queued:
                logger.warning(
                    "api '%s': %d queued job(s) dropped (the memory store does not survive a restart)", name, queued
                )
        self.closed = True
        await self.store.close()
