"""Prometheus metrics: the server's own (``modelserve_*``) and the ones user code records.

Built on prometheus-client. One `Metrics` object per app owns a registry; with several worker processes
(``PROMETHEUS_MULTIPROC_DIR`` set, as the CLI does for ``--workers`` > 1) values are written to shared files
and ``GET /metrics`` adds up every worker's numbers.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

PREFIX = "modelserve_"
_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsError(ValueError):
    """User code asked for a metric that cannot exist (bad name, reserved name, label keys changed)."""


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")


class Metrics:
    """The metrics of one app: built-in families, per-API children, and user metrics."""

    def __init__(self) -> None:
        self.multiprocess = multiprocess_dir() is not None
        self.registry = CollectorRegistry(auto_describe=True)
        if self.multiprocess:
            multiprocess.MultiProcessCollector(self.registry)
        # In multiprocess mode the values live in files and the collector reads them: families must not be
        # registered a second time.
        owner = None if self.multiprocess else self.registry
        self._owner = owner
        self.requests = Counter(
            PREFIX + "requests", "Requests answered, by API and HTTP status code", ["api", "code"], registry=owner
        )
        self.latency = Histogram(
            PREFIX + "request_duration_seconds",
            "Time from a request's arrival to its answer",
            ["api"],
            buckets=_LATENCY_BUCKETS,
            registry=owner,
        )
        self.stage_latency = Histogram(
            PREFIX + "stage_duration_seconds",
            "Time spent in each stage (preprocess, predict, postprocess, pre_inference, run, post_inference)",
            ["api", "stage"],
            buckets=_LATENCY_BUCKETS,
            registry=owner,
        )
        self.in_flight = Gauge(
            PREFIX + "requests_in_flight",
            "Calls running now",
            ["api"],
            registry=owner,
            multiprocess_mode="livesum",
        )
        self.waiting = Gauge(
            PREFIX + "requests_waiting",
            "Requests waiting for a free slot",
            ["api"],
            registry=owner,
            multiprocess_mode="livesum",
        )
        self.queue_full = Counter(
            PREFIX + "queue_full", "Requests refused with 503 because the queue was full", ["api"], registry=owner
        )
        self.cancelled = Counter(
            PREFIX + "requests_cancelled",
            "Requests cancelled before they finished, by reason (disconnect, timeout)",
            ["api", "reason"],
            registry=owner,
        )
        self.jobs = Counter(PREFIX + "jobs", "Async jobs that reached a status", ["api", "status"], registry=owner)
        self.jobs_queued = Gauge(
            PREFIX + "jobs_queue_depth",
            "Async jobs waiting to run",
            ["api"],
            registry=owner,
            multiprocess_mode="mostrecent",
        )
        self.load_time = Gauge(
            PREFIX + "model_load_seconds",
            "Time the API took to load (constructor and load())",
            ["api"],
            registry=owner,
            multiprocess_mode="max",
        )
        self.batch_size = Histogram(
            PREFIX + "batch_size", "Requests per batched call", ["api"], buckets=_BATCH_BUCKETS, registry=owner
        )
        self.batch_wait = Histogram(
            PREFIX + "batch_wait_seconds",
            "Time a request waited for its batch to start",
            ["api"],
            buckets=_LATENCY_BUCKETS,
            registry=owner,
        )
        self._refreshers: list[Callable[[], None]] = []
        self._user: dict[str, tuple[str, tuple[str, ...], Any]] = {}
        self._user_lock = threading.Lock()

    def add_refresher(self, refresh: Callable[[], None]) -> None:
        """Register a callback that updates gauges before each scrape."""
        self._refreshers.append(refresh)

    def refresh(self) -> None:
        for refresh in self._refreshers:
            refresh()

    def exposition(self) -> bytes:
        self.refresh()
        return generate_latest(self.registry)

    # --------------------------------------------------------------------------------------------
    # user metrics

    def user_metric(self, kind: str, name: str, tags: dict[str, Any] | None) -> Any:
        """The labelled child of user metric `name`, created on first use."""
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise MetricsError(
                f"metric name {name!r} is not a valid Prometheus name (letters, digits, '_' and ':', "
                "not starting with a digit)"
            )
        if name.startswith(PREFIX):
            raise MetricsError(f"metric name {name!r} is reserved: names starting with {PREFIX!r} are modelserve's own")
        tags = tags or {}
        if not isinstance(tags, dict):
            raise MetricsError(f"tags of metric {name!r} must be a dict, got {type(tags).__name__}")
        keys = tuple(sorted(tags))
        for key in keys:
            if not isinstance(key, str) or not _LABEL_RE.match(key) or key.startswith("__"):
                raise MetricsError(f"tag {key!r} of metric {name!r} is not a valid Prometheus label name")
        with self._user_lock:
            known = self._user.get(name)
            if known is None:
                family = self._new_family(kind, name, keys)
                self._user[name] = (kind, keys, family)
            else:
                known_kind, known_keys, family = known
                if known_kind != kind:
                    raise MetricsError(f"metric {name!r} is a {known_kind}; it cannot be used as a {kind}")
                if known_keys != keys:
                    raise MetricsError(
                        f"metric {name!r} was first used with tags {list(known_keys)} and now with {list(keys)}; "
                        "a metric keeps the same tag keys"
                    )
        if not keys:
            return family
        return family.labels(**{key: str(tags[key]) for key in keys})

    def _new_family(self, kind: str, name: str, keys: tuple[str, ...]) -> Any:
        doc = f"user metric {name}"
        if kind == "gauge":
            return Gauge(name, doc, keys, registry=self._owner, multiprocess_mode="mostrecent")
        if kind == "counter":
            return Counter(name, doc, keys, registry=self._owner)
        return Histogram(name, doc, keys, registry=self._owner)


class MetricsClient:
    """What user constructors receive as ``metrics_client`` (the Cortex/Truss interface).

    ``tags`` become Prometheus labels::

        self.metrics.increment("cache_hits", tags={"model": "iris"})
        self.metrics.histogram("tokens_per_request", 17)
        self.metrics.gauge("queue_size", 3)
    """

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def gauge(self, metric: str, value: float, tags: dict[str, Any] | None = None) -> None:
        self._metrics.user_metric("gauge", metric, tags).set(value)

    def increment(self, metric: str, value: float = 1, tags: dict[str, Any] | None = None) -> None:
        self._metrics.user_metric("counter", metric, tags).inc(value)

    def histogram(self, metric: str, value: float, tags: dict[str, Any] | None = None) -> None:
        self._metrics.user_metric("histogram", metric, tags).observe(value)


class ApiMetrics:
    """The children of one API, bound once so the request path only calls inc/observe."""

    def __init__(self, metrics: Metrics, api: str) -> None:
        self.api = api
        self._metrics = metrics
        self._codes: dict[int, Any] = {}
        self.latency = metrics.latency.labels(api)
        self.in_flight = metrics.in_flight.labels(api)
        self.waiting = metrics.waiting.labels(api)
        self.queue_full = metrics.queue_full.labels(api)
        self.load_time = metrics.load_time.labels(api)
        self._stages: dict[str, Any] = {}
        self._batch_size: Any = None
        self._batch_wait: Any = None

    def answered(self, code: int, seconds: float) -> None:
        counter = self._codes.get(code)
        if counter is None:
            counter = self._codes[code] = self._metrics.requests.labels(self.api, str(code))
        counter.inc()
        self.latency.observe(seconds)

    def cancelled(self, reason: str) -> None:
        self._metrics.cancelled.labels(self.api, reason).inc()

    def stage_timer(self, name: str, seconds: float) -> None:
        child = self._stages.get(name)
        if child is None:
            child = self._stages[name] = self._metrics.stage_latency.labels(self.api, name)
        child.observe(seconds)

    def batch(self, size: int, waits: list[float]) -> None:
        """One batched call of `size` requests, each having waited `waits` seconds for it."""
        if self._batch_size is None:
            self._batch_size = self._metrics.batch_size.labels(self.api)
            self._batch_wait = self._metrics.batch_wait.labels(self.api)
        self._batch_size.observe(size)
        for wait in waits:
            self._batch_wait.observe(wait)

    def job(self, status: str) -> None:
        self._metrics.jobs.labels(self.api, status).inc()
