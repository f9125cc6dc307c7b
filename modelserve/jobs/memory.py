"""The in-process job table: fast, and gone with the process (for tests and notebooks)."""

from __future__ import annotations

import heapq
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING

from modelserve.errors import DuplicateJob, JobQueueFull
from modelserve.jobs.base import (
    CANCELLED,
    ENDED,
    IN_PROGRESS,
    IN_QUEUE,
    ClaimedJob,
    JobStore,
    JobView,
    NewJob,
    now,
)

if TYPE_CHECKING:
    from modelserve.config import JobsConfig


class _Record:
    __slots__ = ("seq", "id", "kind", "payload", "status", "owner", "attempts", "result", "error", "finished", "trace")

    def __init__(self, seq: int, job: NewJob) -> None:
        self.seq = seq  # submission order: the queue is kept in it
        self.id = job.id
        self.kind = job.kind
        self.payload: bytes | None = job.payload
        self.status = IN_QUEUE
        self.owner: str | None = None
        self.attempts = 0
        self.result: bytes | None = None
        self.error: str | None = None
        self.finished: float | None = None
        self.trace = job.trace


class MemoryStore(JobStore):
    """Jobs in dictionaries of this process. Not shared, not durable: refused with ``--workers`` > 1."""

    description = "memory"

    @classmethod
    def from_config(cls, jobs: JobsConfig, root: Path) -> MemoryStore:
        return cls()

    def __init__(self) -> None:
        self._jobs: dict[str, dict[str, _Record]] = {}
        self._queues: dict[str, deque[_Record]] = {}
        self._expiry: list[tuple[float, str, str]] = []
        self._submitted = 0

    def _table(self, api: str) -> dict[str, _Record]:
        table = self._jobs.get(api)
        if table is None:
            table = self._jobs[api] = {}
            self._queues[api] = deque()
        return table

    async def submit(self, job: NewJob, max_queued: int) -> None:
        table = self._table(job.api)
        if job.id in table:
            raise DuplicateJob(job.id)
        queue = self._queues[job.api]
        if len(queue) >= max_queued:
            raise JobQueueFull(max_queued)
        self._submitted += 1
        record = _Record(self._submitted, job)
        table[job.id] = record
        queue.append(record)

    async def claim(self, api: str, owner: str, limit: int = 1) -> list[ClaimedJob]:
        self._table(api)
        queue = self._queues[api]
        claimed: list[ClaimedJob] = []
        while queue and len(claimed) < limit:
            record = queue.popleft()
            record.status = IN_PROGRESS
            record.owner = owner
            record.attempts += 1
            assert record.payload is not None
            claimed.append(ClaimedJob(api, record.id, record.kind, record.payload, record.attempts, record.trace))
        return claimed

    def _end(self, api: str, record: _Record, status: str, ttl: float) -> None:
        record.status = status
        record.owner = None
        record.payload = None
        record.finished = now()
        heapq.heappush(self._expiry, (record.finished + ttl, api, record.id))

    async def finish(
        self, api: str, job_id: str, owner: str, status: str, result: bytes | None, error: str | None, ttl: float
    ) -> bool:
        record = self._table(api).get(job_id)
        if record is None or record.status != IN_PROGRESS or record.owner != owner:
            return False
        record.result, record.error = result, error
        self._end(api, record, status, ttl)
        return True

    async def release(self, api: str, job_id: str, owner: str) -> None:
        record = self._table(api).get(job_id)
        if record is not None and record.status == IN_PROGRESS and record.owner == owner:
            record.status, record.owner = IN_QUEUE, None
            record.attempts -= 1
            # Back to its place in submission order; the jobs ahead of it are only the few other ones put back.
            queue = self._queues[api]
            place = next((n for n, queued in enumerate(queue) if queued.seq > record.seq), len(queue))
            queue.insert(place, record)

    async def get(self, api: str, job_id: str) -> JobView | None:
        record = self._table(api).get(job_id)
        if record is None:
            return None
        return JobView(record.id, record.status, record.result, record.error, record.finished)

    async def cancel(self, api: str, job_id: str, ttl: float) -> str | None:
        record = self._table(api).get(job_id)
        if record is None:
            return None
        before = record.status
        if before in ENDED:
            return before
        if before == IN_QUEUE:
            self._queues[api].remove(record)
        self._end(api, record, CANCELLED, ttl)
        return before

    async def heartbeat(self, api: str, owner: str, job_ids: list[str]) -> set[str]:
        table = self._table(api)
        lost = set()
        for job_id in job_ids:
            record = table.get(job_id)
            if record is None or record.status != IN_PROGRESS or record.owner != owner:
                lost.add(job_id)
        return lost

    async def sweep(self) -> int:
        removed = 0
        moment = now()
        expiry = self._expiry
        while expiry and expiry[0][0] <= moment:
            _, api, job_id = heapq.heappop(expiry)
            table = self._jobs.get(api)
            record = table.get(job_id) if table is not None else None
            if record is not None and record.status in ENDED:
                del table[job_id]  # type: ignore[union-attr]
                removed += 1
        return removed

    async def queued(self, api: str) -> int:
        self._table(api)
        return len(self._queues[api])
