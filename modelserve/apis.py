"""An API of a project: its configuration, its backend, its load state and its backpressure."""

from __future__ import annotations

import logging
import time
from typing import Any

from modelserve.backends import Backend
from modelserve.config import ApiConfig
from modelserve.errors import LoadError
from modelserve.limiter import Limiter
from modelserve.metrics import ApiMetrics

logger = logging.getLogger("modelserve")


class Api:
    """One API: loads its backend once and tells whether it is ready."""

    def __init__(self, config: ApiConfig, backend: Backend, metrics: ApiMetrics) -> None:
        self.name = config.name
        self.config = config
        self.backend = backend
        self.metrics = metrics
        # With batching, the requests of the running calls and of one more full batch are admitted: while a
        # batch runs the next one fills up (admitting only the running ones would split them into two halves,
        # one running while the other waits). max_queue_length still bounds the requests waiting beyond those.
        if config.batching is not None:
            admitted = (config.max_concurrency + 1) * config.batching.max_batch_size
        else:
            admitted = config.max_concurrency
        self.limiter = Limiter(admitted, config.max_queue_length)
        self.state = "loading"
        self.error: str | None = None
        self.ready = False

    async def load(self) -> None:
        started = time.perf_counter()
        try:
            await self.backend.load()
        except LoadError as exc:
            self.state, self.error = "failed", str(exc)
            raise
        except Exception as exc:
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            raise LoadError(f"api '{self.name}': loading failed: {self.error}") from exc
        seconds = time.perf_counter() - started
        self.metrics.load_time.set(seconds)
        self.state = "ready"
        self.ready = True
        logger.info("api '%s' is ready (loaded in %.2f s)", self.name, seconds)

    def refresh_gauges(self) -> None:
        self.metrics.in_flight.set(self.limiter.running)
        self.metrics.waiting.set(self.limiter.waiting)

    def describe(self) -> dict[str, Any]:
        handler = self.config.handler
        return {
            "name": self.name,
            "kind": self.config.kind,
            "state": self.state,
            "backend": self.backend.kind,
            "config_keys": sorted(handler.config) if handler is not None else [],
            "max_concurrency": self.config.max_concurrency,
            "max_queue_length": self.config.max_queue_length,
            "timeout": self.config.timeout,
            **self.backend.describe(),
        }
