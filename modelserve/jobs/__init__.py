"""Async jobs: the job table (`base.JobStore` and its stores), the worker loop, and the service that runs them.

Stores are picked from `STORES` by the ``jobs: store:`` value, a name or a URL whose scheme is a name:
``memory`` (in-process, for tests and notebooks), ``sqlite`` (the default: a file in the project's hidden
``.modelserve/`` folder, durable, shared by ``--workers``) and ``redis://...`` (shared by several machines).
Config validation and the CLI help read the same registry.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from modelserve.errors import ConfigError

if TYPE_CHECKING:
    from modelserve.config import JobsConfig
    from modelserve.jobs.base import JobStore

#: Job stores by name or URL scheme, as import strings (a store's module is imported only when used).
STORES: dict[str, str] = {
    "sqlite": "modelserve.jobs.sqlite:SQLiteStore",
    "memory": "modelserve.jobs.memory:MemoryStore",
    "redis": "modelserve.jobs.redis:RedisStore",
    "rediss": "modelserve.jobs.redis:RedisStore",
    "unix": "modelserve.jobs.redis:RedisStore",
}
#: What ``jobs: store:`` accepts, for messages and the CLI help.
STORE_CHOICES = "sqlite, memory or a redis:// URL (rediss://, unix:// too)"


def store_kind(store: str) -> str | None:
    """The `STORES` key of a ``store:`` value: the name itself, or a URL's scheme; None when unknown."""
    scheme, sep, _ = store.partition("://")
    kind = scheme if sep else store
    if kind not in STORES or (kind in ("sqlite", "memory")) == bool(sep):
        return None
    return kind


def make_store(jobs: JobsConfig, root: Path) -> JobStore:
    """The store the ``jobs:`` block names (not opened yet)."""
    kind = store_kind(jobs.store)
    if kind is None:
        raise ConfigError(f"jobs store {jobs.store!r}: expected {STORE_CHOICES}")
    module, _, name = STORES[kind].partition(":")
    cls = getattr(importlib.import_module(module), name)
    store: JobStore = cls.from_config(jobs, root)
    return store
