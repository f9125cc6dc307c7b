"""The job table's interface, shared by every store, and the records it keeps.

A job goes ``in_queue`` -> ``in_progress`` -> ``completed`` | ``failed``, or to ``cancelled`` from either
of the first two. The routes and the worker loop only talk to a `JobStore`; nothing assumes that the
process that accepted a job is the one that runs it.

The queue is in submission order: a claim takes the queued jobs that were submitted first. A job that goes
back to the queue (`JobStore.release`, `JobStore.recover`) keeps its place, so it runs before every job
submitted after it, whatever order the jobs went back in.

A running job carries a *lease*: its owner (one process) renews it while the job runs. A lease ends
`LEASE_SECONDS` after its last renewal and is expired from that moment on (at its end time, not after it).
A lease that expired means its process died; the job is then put back in the queue once, and failed the
second time (`MAX_ATTEMPTS`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

from modelserve.codecs import encode_json

IN_QUEUE = "in_queue"
IN_PROGRESS = "in_progress"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
ENDED = frozenset({COMPLETED, FAILED, CANCELLED})

#: A job whose process died twice while running it is failed instead of being retried again.
MAX_ATTEMPTS = 2
INTERRUPTED_TWICE = "the job was interrupted twice (its process stopped while running it); not retried again"

#: How long a running job's lease lasts, and how often its owner renews it.
LEASE_SECONDS = 5.0
HEARTBEAT_SECONDS = 0.5


@dataclass
class NewJob:
    """What the submit route hands to a store. `payload` is the body re-encoded for its `kind`."""

    api: str
    id: str
    kind: str  # json | text | bytes: how to give the payload back to the handler
    payload: bytes
    #: The trace context of the submit, with tracing on (`modelserve.tracing.Tracing.job_context`): the worker
    #: that runs the job continues that trace. Stored with the job, opaque to the store.
    trace: str | None = None


@dataclass
class ClaimedJob:
    api: str
    id: str
    kind: str
    payload: bytes
    attempts: int
    trace: str | None = None


@dataclass
class JobView:
    """A job as ``GET /<api>/<id>`` shows it. `result` is the stored JSON document of a completed job."""

    id: str
    status: str
    result: bytes | None = None
    error: str | None = None
    finished: float | None = None

    def to_json(self) -> bytes:
        head = {"id": self.id, "status": self.status}
        if self.status == COMPLETED and self.result is not None:
            # The result is already JSON: splice it in instead of parsing and re-encoding it.
            prefix = encode_json(head)[:-1]
            return prefix + b',"result":' + self.result + b',"timestamp":' + encode_json(iso(self.finished)) + b"}"
        body: dict[str, object] = dict(head)
        if self.status == FAILED:
            body["error"] = self.error or "the job failed"
        if self.status in ENDED:
            body["timestamp"] = iso(self.finished)
        return encode_json(body)


def iso(stamp: float | None) -> str | None:
    """A Unix time as ISO 8601 in UTC, to the millisecond (``2026-11-22T18:40:00.123Z``)."""
    if stamp is None:
        return None
    moment = datetime.fromtimestamp(stamp, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def now() -> float:
    return time.time()


class JobStore:
    """Where jobs live. Every method is a coroutine except `check`; each call is atomic on its own."""

    #: Shown in logs and messages.
    description = "job store"
    #: Jobs survive a restart of the server.
    durable = False
    #: Several processes (``--workers``, machines) may share it.
    shared = False
    #: How often an idle worker asks for work it was not told about (None: only when woken in-process).
    poll_interval: float | None = None

    def check(self) -> None:
        """Open and close the store once, synchronously, so that start-up fails early (`LoadError`)."""

    async def open(self) -> None:
        """Connect; called on the serving loop before the first job."""

    async def close(self) -> None:
        """Release connections; called at shutdown."""

    async def submit(self, job: NewJob, max_queued: int) -> None:
        """Commit a new queued job; `DuplicateJob` when its id is taken, `JobQueueFull` beyond `max_queued`."""
        raise NotImplementedError

    async def claim(self, api: str, owner: str, limit: int = 1) -> list[ClaimedJob]:
        """Take up to `limit` of the first-submitted queued jobs of `api` for `owner` (now in_progress, leased)."""
        raise NotImplementedError

    async def finish(
        self, api: str, job_id: str, owner: str, status: str, result: bytes | None, error: str | None, ttl: float
    ) -> bool:
        """Record the end of a job `owner` ran; False when it is no longer `owner`'s (cancelled meanwhile)."""
        raise NotImplementedError

    async def release(self, api: str, job_id: str, owner: str) -> None:
        """Put a job `owner` could not finish (shutdown) back in the queue, not counted as a try.

        It goes back to its place in submission order: ahead of every job submitted after it. Released in any
        order, jobs are claimed again in the order they were submitted (a worker stopping releases its jobs in
        whatever order their tasks end; the submission order is the one every process agrees on).
        """
        raise NotImplementedError

    async def get(self, api: str, job_id: str) -> JobView | None:
        raise NotImplementedError

    async def cancel(self, api: str, job_id: str, ttl: float) -> str | None:
        """Cancel a queued or running job; its status before (None when unknown). Ended jobs stay as they are."""
        raise NotImplementedError

    async def heartbeat(self, api: str, owner: str, job_ids: list[str]) -> set[str]:
        """Renew the leases of exactly the listed jobs that `owner` runs; the listed ids no longer its own.

        A running job of `owner` that is not listed keeps the lease it had: the owner vouches for each job it
        still runs, and a job it stopped listing is recovered when its lease ends, as if its process had died.
        """
        raise NotImplementedError

    async def recover(self, api: str, ttl: float) -> tuple[int, int]:
        """Requeue jobs whose lease expired (their process died), or fail them the second time.

        A lease is expired from its end time on: ``lease end <= now``. A requeued job keeps its place in
        submission order, as a released one does.

        Returns (requeued, failed).
        """
        return 0, 0

    async def sweep(self) -> int:
        """Remove the records whose retention has passed; how many went."""
        return 0

    async def queued(self, api: str) -> int:
        """Jobs of `api` waiting to run, across every process."""
        raise NotImplementedError
