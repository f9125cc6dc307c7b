"""Async jobs: the job table (`base.JobStore` and its stores), the worker loop, and the HTTP routes.

Stores: `memory` (in-process, for tests and notebooks), `sqlite` (the default: a file in the project's
hidden ``.modelserve/`` folder, durable, shared by ``--workers``) and ``redis://...`` (shared by several
machines). `make_store` picks one from the project's ``jobs:`` block.
"""

from __future__ import annotations

from pathlib import Path

from modelserve.config import JobsConfig
from modelserve.errors import ConfigError
from modelserve.jobs.base import JobStore


def make_store(jobs: JobsConfig, root: Path) -> JobStore:
    """The store the ``jobs:`` block names (not opened yet)."""
    if jobs.store == "memory":
        from modelserve.jobs.memory import MemoryStore

        return MemoryStore()
    if jobs.store == "sqlite":
        from modelserve.jobs.sqlite import SQLiteStore

        path = Path(jobs.path)
        return SQLiteStore(path if path.is_absolute() else root / path)
    if jobs.store.startswith(("redis://", "rediss://", "unix://")):
        from modelserve.jobs.redis import RedisStore

        return RedisStore(jobs.store, jobs.prefix)
    raise ConfigError(f"jobs store {jobs.store!r}: expected sqlite, memory or a redis:// URL")
