"""The loop that runs one async API's jobs in this process.

It claims the oldest queued job while fewer than ``max_concurrency`` of its jobs run here, runs it through
`Api.call` (the timeout and cancellation of a realtime request: a DELETE cancels like a disconnect), and
records the outcome. It is woken at once by a submit in the same process and polls
the store (every `JobStore.poll_interval`) for jobs submitted elsewhere. Beside it, a heartbeat renews the
leases of its running jobs, notices jobs cancelled from another process, requeues jobs of dead processes
and sweeps expired records.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING, Any

import orjson

from modelserve import context
from modelserve.codecs import encode_json
from modelserve.context import RequestContext, current
from modelserve.errors import ClientDisconnected, EncodeError, HTTPError, UserCodeError
from modelserve.jobs.base import COMPLETED, FAILED, HEARTBEAT_SECONDS, ClaimedJob, JobStore

if TYPE_CHECKING:
    from modelserve.api import Api

logger = logging.getLogger("modelserve")

#: How often expired records are swept (and dead processes' jobs looked for).
SWEEP_SECONDS = 1.0


def decode_stored(kind: str, payload: bytes) -> Any:
    """Give a stored payload back as the handler receives it (the core's Content-Type rules)."""
    if kind == "json":
        return orjson.loads(payload)
    if kind == "text":
        return payload.decode("utf-8")
    return payload


class _Running:
    """A job running here: its task, its context, and the event a DELETE sets."""

    __slots__ = ("task", "ctx", "deleted")

    task: asyncio.Task[None]

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.deleted = asyncio.Event()

    async def wait_deleted(self) -> str:
        """The call's `cancelled` awaitable: completes with the reason when the job is deleted."""
        await self.deleted.wait()
        return "cancelled"


class JobWorker:
    """Claims and runs the jobs of one API, at most ``max_concurrency`` at a time in this process."""

    def __init__(self, api: Api, store: JobStore, sweeps: bool, queue_depth: Any = None) -> None:
        self.api = api
        #: A gauge of the jobs waiting across every process, refreshed by the heartbeat.
        self.queue_depth = queue_depth
        self.name = api.name
        self.store = store
        self.sweeps = sweeps
        self.owner = f"{os.uname().nodename}:{os.getpid()}:{os.urandom(4).hex()}"
        self.running: dict[str, _Running] = {}
        #: Jobs holding a concurrency slot (a sync handler whose job was cancelled keeps its slot until it returns).
        self.busy = 0
        self._wake = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self.api.limiter.on_release = self._wake.set
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._claim_loop()), loop.create_task(self._heartbeat_loop())]

    def wake(self) -> None:
        """A job was submitted in this process: look for it now."""
        self._wake.set()

    # ---------------------------------------------------------------------------------------------
    # claiming

    async def _claim_loop(self) -> None:
        store = self.store
        limit = self.api.config.max_concurrency
        limiter = self.api.limiter
        while not self._stopping:
            self._wake.clear()
            # A sync handler still running in its thread after its job left keeps its slot: count it.
            while (free := limit - max(self.busy, limiter.running)) > 0 and not self._stopping:
                try:
                    jobs = await store.claim(self.name, self.owner, free)
                except Exception:
                    logger.exception("api '%s': could not claim a job from the %s", self.name, store.description)
                    await asyncio.sleep(1)
                    break
                for job in jobs:
                    self._start(job)
                if not jobs:
                    break
            try:
                await asyncio.wait_for(self._wake.wait(), store.poll_interval)
            except asyncio.TimeoutError:
                pass

    def _start(self, job: ClaimedJob) -> None:
        ctx = RequestContext(self.name, job.id)
        self.busy += 1
        self.api.metrics.job("in_progress")
        running = _Running(ctx)
        run = self._run(job, running)
        if context.tracing is not None:  # continues the trace of the job's submit (`modelserve.tracing`)
            run = context.tracing.job(run, job, self.name)
        running.task = asyncio.get_running_loop().create_task(run)
        self.running[job.id] = running

    async def _run(self, job: ClaimedJob, running: _Running) -> None:
        """One job through `Api.call`: the API's timeout, and a DELETE as the call's cancellation."""
        ctx = running.ctx
        current.set(ctx)
        started = time.perf_counter()
        status, result, error = FAILED, None, None
        try:
            payload = decode_stored(job.kind, job.payload)
            value = await self.api.call(payload, ctx, cancelled=running.wait_deleted)
            try:
                result = encode_json(value)
                status = COMPLETED
            except EncodeError as exc:
                error = f"the result is not JSON-serialisable: {exc}"
        except asyncio.CancelledError:
            if ctx.reason != "shutdown":
                raise
            await self._give_back(job)
            return
        except ClientDisconnected:  # a DELETE, logged by Api.call
            return
        except UserCodeError as exc:  # logged by Api.call
            error = exc.detail
        except HTTPError as exc:  # a timeout (logged by Api.call), or a 4xx raised by user code
            error = exc.message
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            logger.exception("api '%s': job %s failed", self.name, job.id)
        finally:
            self.running.pop(job.id, None)
            self.busy -= 1
            self._wake.set()
        await self._record(job, status, result, error, time.perf_counter() - started)

    async def _record(self, job: ClaimedJob, status: str, result: bytes | None, error: str | None, took: float) -> None:
        try:
            recorded = await self.store.finish(
                self.name, job.id, self.owner, status, result, error, self.api.config.result_ttl
            )
        except Exception:
            logger.exception("api '%s': could not record the end of job %s", self.name, job.id)
            return
        if recorded:
            self.api.metrics.job(status)
            self.api.metrics.stage_timer("job", took)
        else:
            logger.info("api '%s': job %s was cancelled while running; its result is dropped", self.name, job.id)

    async def _give_back(self, job: ClaimedJob) -> None:
        try:
            await self.store.release(self.name, job.id, self.owner)
        except Exception:
            logger.exception("api '%s': could not put job %s back in the queue", self.name, job.id)

    # ---------------------------------------------------------------------------------------------
    # cancellation

    def cancel_local(self, job_id: str) -> bool:
        """Cancel a job running in this process (already marked cancelled in the store)."""
        running = self.running.get(job_id)
        if running is None:
            return False
        running.deleted.set()
        return True

    async def _heartbeat_loop(self) -> None:
        store = self.store
        last_sweep = 0.0
        while not self._stopping:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                if self.running:
                    for job_id in await store.heartbeat(self.name, self.owner, list(self.running)):
                        if self.cancel_local(job_id):
                            logger.info("api '%s': job %s was cancelled from another process", self.name, job_id)
                moment = time.monotonic()
                if moment - last_sweep >= SWEEP_SECONDS:
                    last_sweep = moment
                    requeued, failed = await store.recover(self.name, self.api.config.result_ttl)
                    for _ in range(failed):
                        self.api.metrics.job(FAILED)
                    if requeued or failed:
                        logger.warning(
                            "api '%s': %d job(s) of a stopped process put back in the queue, %d failed "
                            "(interrupted twice)",
                            self.name,
                            requeued,
                            failed,
                        )
                        self._wake.set()
                    if self.sweeps:
                        await store.sweep()
                    if self.queue_depth is not None:
                        self.queue_depth.set(await store.queued(self.name))
            except Exception:
                logger.exception("api '%s': job store upkeep failed; retrying", self.name)

    # ---------------------------------------------------------------------------------------------
    # shutdown

    async def stop(self, grace: float) -> None:
        """Stop claiming; let running jobs finish within `grace` seconds, then give them back."""
        self._stopping = True
        self._wake.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        tasks = [running.task for running in self.running.values()]
        if tasks:
            logger.info("api '%s': waiting up to %s s for %d running job(s)", self.name, grace, len(tasks))
            _, pending = await asyncio.wait(tasks, timeout=grace)
            if pending:
                logger.warning(
                    "api '%s': %d job(s) still running after %s s; interrupting them", self.name, len(pending), grace
                )
                for running in list(self.running.values()):
                    running.ctx.cancel("shutdown")
                    running.task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
