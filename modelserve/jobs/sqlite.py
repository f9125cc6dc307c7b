"""The default job store: one SQLite file, durable, shared by the processes of one machine.

The database runs in WAL mode with ``synchronous=NORMAL``: a committed job survives the process being
killed (kill -9, OOM), and readers never wait for writers. Every statement runs on one thread per process
that owns the connection, so the event loop never waits for the disk or for another process's lock.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from modelserve._threads import OwnThread
from modelserve.errors import DuplicateJob, HTTPError, JobQueueFull, LoadError
from modelserve.jobs.base import (
    CANCELLED,
    FAILED,
    IN_PROGRESS,
    IN_QUEUE,
    INTERRUPTED_TWICE,
    LEASE_SECONDS,
    MAX_ATTEMPTS,
    ClaimedJob,
    JobStore,
    JobView,
    NewJob,
    now,
)

if TYPE_CHECKING:
    from modelserve.config import JobsConfig

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY,
    api TEXT NOT NULL,
    id TEXT NOT NULL,
    status TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload BLOB,
    result BLOB,
    error TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    owner TEXT,
    lease_until REAL,
    finished REAL,
    expires_at REAL,
    trace TEXT,
    UNIQUE (api, id)
);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (api, status, seq);
CREATE INDEX IF NOT EXISTS jobs_by_expiry ON jobs (expires_at) WHERE expires_at IS NOT NULL;
-- Queued jobs per API, kept by triggers: every submit checks max_queue_length, and COUNT(*) over the queue
-- would cost time proportional to the backlog.
CREATE TABLE IF NOT EXISTS queue_counts (api TEXT PRIMARY KEY, queued INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS queue_in AFTER INSERT ON jobs WHEN NEW.status = 'in_queue' BEGIN
    INSERT INTO queue_counts (api, queued) VALUES (NEW.api, 1)
        ON CONFLICT (api) DO UPDATE SET queued = queued + 1;
END;
CREATE TRIGGER IF NOT EXISTS queue_back AFTER UPDATE OF status ON jobs
        WHEN OLD.status != 'in_queue' AND NEW.status = 'in_queue' BEGIN
    INSERT INTO queue_counts (api, queued) VALUES (NEW.api, 1)
        ON CONFLICT (api) DO UPDATE SET queued = queued + 1;
END;
CREATE TRIGGER IF NOT EXISTS queue_out AFTER UPDATE OF status ON jobs
        WHEN OLD.status = 'in_queue' AND NEW.status != 'in_queue' BEGIN
    UPDATE queue_counts SET queued = queued - 1 WHERE api = OLD.api;
END;
CREATE TRIGGER IF NOT EXISTS queue_gone AFTER DELETE ON jobs WHEN OLD.status = 'in_queue' BEGIN
    UPDATE queue_counts SET queued = queued - 1 WHERE api = OLD.api;
END;
"""

COUNT_QUEUED = "SELECT queued FROM queue_counts WHERE api = ?"


class SQLiteStore(JobStore):
    durable = True
    shared = True
    poll_interval = 0.02

    @classmethod
    def from_config(cls, jobs: JobsConfig, root: Path) -> SQLiteStore:
        path = Path(jobs.path)
        if path.is_absolute():
            return cls(path)
        return cls(root / path, shown=path.as_posix())

    def __init__(self, path: Path, shown: str | None = None) -> None:
        self.path = path
        #: Shown in GET /<api> and the logs: the path as the project names it, not where the project lives.
        self.description = f"sqlite store {shown or path}"
        self._db: sqlite3.Connection | None = None
        self._thread: OwnThread | None = None
        self._pending: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self._flushing = False

    # ---------------------------------------------------------------------------------------------
    # connection

    def _connect(self) -> sqlite3.Connection:
        # The jobs hold users' payloads and results: a new folder is the owner's alone (0700), a new file too
        # (0600; SQLite gives its -wal and -shm files the database file's permissions).
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not self.path.exists():
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(SCHEMA)
        if "trace" not in {row[1] for row in db.execute("PRAGMA table_info(jobs)")}:
            db.execute("ALTER TABLE jobs ADD COLUMN trace TEXT")  # a file from before tracing came
        return db

    def check(self) -> None:
        try:
            self._connect().close()
        except (OSError, sqlite3.Error) as exc:
            raise LoadError(f"cannot open the {self.description}: {exc}") from exc

    async def open(self) -> None:
        self._thread = OwnThread("modelserve-sqlite")
        try:
            self._db = await self._run(self._connect)
        except (OSError, sqlite3.Error) as exc:
            raise LoadError(f"cannot open the {self.description}: {exc}") from exc

    async def close(self) -> None:
        if self._thread is None:
            return
        if self._db is not None:
            await self._run(self._db.close)
            self._db = None
        self._thread.close()
        self._thread = None

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        assert self._thread is not None, "the sqlite store is not open"
        return await self._thread.run(fn, *args)

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Run `fn` in a write transaction, grouped with the other writes waiting at the same moment.

        Group commit: while one transaction runs on the store's thread, new writes gather, and the next
        transaction applies them all. Under load, many submits (and the worker's claims between them) share
        one commit instead of queueing behind each other one transaction at a time.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._pending.append((fn, future))
        if not self._flushing:
            self._flushing = True
            loop.create_task(self._flush())
        return future

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    outcomes = await self._run(self._apply, [fn for fn, _ in batch])
                except BaseException as exc:  # the store's thread is gone (shutdown)
                    outcomes = [(False, exc)] * len(batch)
                for (_, future), (ok, value) in zip(batch, outcomes, strict=True):
                    if future.done():
                        continue
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
        finally:
            self._flushing = False

    def _apply(self, fns: list[Callable[[sqlite3.Connection], Any]]) -> list[tuple[bool, Any]]:
        """On the store's thread: one transaction for a group of writes; an HTTPError fails only its own."""
        db = self._db
        assert db is not None
        outcomes: list[tuple[bool, Any]] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            for fn in fns:
                try:
                    outcomes.append((True, fn(db)))
                except HTTPError as exc:  # refused before it wrote anything (duplicate id, full queue)
                    outcomes.append((False, exc))
            db.execute("COMMIT")
        except Exception as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            return [(False, exc)] * len(fns)
        return outcomes

    # ---------------------------------------------------------------------------------------------
    # the interface; each method is one transaction on the store's thread

    async def submit(self, job: NewJob, max_queued: int) -> None:
        def insert(db: sqlite3.Connection) -> None:
            if db.execute("SELECT 1 FROM jobs WHERE api = ? AND id = ?", (job.api, job.id)).fetchone():
                raise DuplicateJob(job.id)  # before the queue's limit, as every store: retrying would not help
            row = db.execute(COUNT_QUEUED, (job.api,)).fetchone()
            if row is not None and row[0] >= max_queued:
                raise JobQueueFull(max_queued)
            try:
                db.execute(
                    "INSERT INTO jobs (api, id, status, kind, payload, trace) VALUES (?, ?, ?, ?, ?, ?)",
                    (job.api, job.id, IN_QUEUE, job.kind, job.payload, job.trace),
                )
            except sqlite3.IntegrityError:
                raise DuplicateJob(job.id) from None

        await self._write(insert)

    async def claim(self, api: str, owner: str, limit: int = 1) -> list[ClaimedJob]:
        def take(db: sqlite3.Connection) -> list[ClaimedJob]:
            rows = db.execute(
                "UPDATE jobs SET status = ?, owner = ?, lease_until = ?, attempts = attempts + 1 "
                "WHERE seq IN (SELECT seq FROM jobs WHERE api = ? AND status = ? ORDER BY seq LIMIT ?) "
                "RETURNING seq, id, kind, payload, attempts, trace",
                (IN_PROGRESS, owner, now() + LEASE_SECONDS, api, IN_QUEUE, limit),
            ).fetchall()
            rows.sort()
            return [ClaimedJob(api, row[1], row[2], row[3], row[4], row[5]) for row in rows]

        return await self._write(take)

    async def finish(
        self, api: str, job_id: str, owner: str, status: str, result: bytes | None, error: str | None, ttl: float
    ) -> bool:
        def end(db: sqlite3.Connection) -> bool:
            moment = now()
            cursor = db.execute(
                "UPDATE jobs SET status = ?, result = ?, error = ?, finished = ?, expires_at = ?, payload = NULL, "
                "owner = NULL, lease_until = NULL WHERE api = ? AND id = ? AND status = ? AND owner = ?",
                (status, result, error, moment, moment + ttl, api, job_id, IN_PROGRESS, owner),
            )
            return cursor.rowcount == 1

        return await self._write(end)

    async def release(self, api: str, job_id: str, owner: str) -> None:
        def requeue(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE jobs SET status = ?, owner = NULL, lease_until = NULL, attempts = attempts - 1 "
                "WHERE api = ? AND id = ? AND status = ? AND owner = ?",
                (IN_QUEUE, api, job_id, IN_PROGRESS, owner),
            )

        await self._write(requeue)

    async def get(self, api: str, job_id: str) -> JobView | None:
        def read() -> JobView | None:
            assert self._db is not None
            row = self._db.execute(
                "SELECT status, result, error, finished FROM jobs WHERE api = ? AND id = ?", (api, job_id)
            ).fetchone()
            return None if row is None else JobView(job_id, row[0], row[1], row[2], row[3])

        return await self._run(read)

    async def cancel(self, api: str, job_id: str, ttl: float) -> str | None:
        def stop(db: sqlite3.Connection) -> str | None:
            row = db.execute("SELECT status FROM jobs WHERE api = ? AND id = ?", (api, job_id)).fetchone()
            if row is None:
                return None
            before: str = row[0]
            if before in (IN_QUEUE, IN_PROGRESS):
                moment = now()
                db.execute(
                    "UPDATE jobs SET status = ?, finished = ?, expires_at = ?, payload = NULL, owner = NULL, "
                    "lease_until = NULL WHERE api = ? AND id = ?",
                    (CANCELLED, moment, moment + ttl, api, job_id),
                )
            return before

        return await self._write(stop)

    async def heartbeat(self, api: str, owner: str, job_ids: list[str]) -> set[str]:
        def renew(db: sqlite3.Connection) -> set[str]:
            until = now() + LEASE_SECONDS
            lost = set()
            for job_id in job_ids:  # only the listed jobs: an unlisted one's lease runs out
                cursor = db.execute(
                    "UPDATE jobs SET lease_until = ? WHERE api = ? AND id = ? AND owner = ? AND status = ?",
                    (until, api, job_id, owner, IN_PROGRESS),
                )
                if cursor.rowcount == 0:
                    lost.add(job_id)
            return lost

        return await self._write(renew)

    async def recover(self, api: str, ttl: float) -> tuple[int, int]:
        def requeue_expired(db: sqlite3.Connection) -> tuple[int, int]:
            moment = now()
            rows = db.execute(
                "SELECT seq, attempts FROM jobs WHERE api = ? AND status = ? AND lease_until <= ?",
                (api, IN_PROGRESS, moment),
            ).fetchall()
            requeued = failed = 0
            for seq, attempts in rows:
                if attempts >= MAX_ATTEMPTS:
                    db.execute(
                        "UPDATE jobs SET status = ?, error = ?, finished = ?, expires_at = ?, payload = NULL, "
                        "owner = NULL, lease_until = NULL WHERE seq = ?",
                        (FAILED, INTERRUPTED_TWICE, moment, moment + ttl, seq),
                    )
                    failed += 1
                else:
                    db.execute(
                        "UPDATE jobs SET status = ?, owner = NULL, lease_until = NULL WHERE seq = ?", (IN_QUEUE, seq)
                    )
                    requeued += 1
            return requeued, failed

        return await self._write(requeue_expired)

    async def sweep(self) -> int:
        def delete(db: sqlite3.Connection) -> int:
            return db.execute("DELETE FROM jobs WHERE expires_at <= ?", (now(),)).rowcount

        return await self._write(delete)

    async def queued(self, api: str) -> int:
        def count() -> int:
            assert self._db is not None
            row = self._db.execute(COUNT_QUEUED, (api,)).fetchone()
            return int(row[0]) if row is not None else 0

        return await self._run(count)
