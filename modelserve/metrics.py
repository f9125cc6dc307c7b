"""Prometheus metrics: the server's own (``modelserve_*``) and the ones user code records.

Built on prometheus-client. One `Metrics` object per app owns a registry; with several worker processes
(``PROMETHEUS_MULTIPROC_DIR`` set, as the CLI does for ``--workers`` > 1) values are written to shared files
and ``GET /metrics`` adds up every worker's numbers.

The request path does not call prometheus-client: `modelserve.api_metrics.ApiMetrics` counts answers and
stage times in plain Python lists and dicts, one set per thread (the sync stages are timed in worker
threads), and `Metrics.flush` adds what changed to the prometheus children. A flush happens before every
scrape and, with several workers, every `FLUSH_INTERVAL` seconds in each worker: a scrape answered by one
worker sees the others' numbers at most that old (plus the live gauges, in flight and waiting, refreshed on
the same schedule).

Beside the server's own families, every answer has the process's (``process_*``: CPU, memory, open files;
with several workers one series per worker, labelled ``pid``), the platform's (``python_info``) and
``modelserve_build_info``. With tracing on (`modelserve.tracing`) the request latency histogram carries
exemplars, the trace id of a recent request in each bucket, shown when the scraper asks for the OpenMetrics
format (`Metrics.negotiated`).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import importlib.util
import math
import os
import re
import sys
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.samples import Exemplar, Sample

from modelserve.errors import MetricsError

PREFIX = "modelserve_"
_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The answer's type when the scraper's Accept asks for OpenMetrics (the format that shows exemplars).
OPENMETRICS_TYPE = openmetrics.CONTENT_TYPE_LATEST
#: Seconds between two flushes of a worker's buffered observations, with several worker processes.
FLUSH_INTERVAL = 1.0
#: Names of the samples each kind of family writes, from its name (a counter drops a ``_total`` suffix).
_SAMPLE_SUFFIXES = {
    "counter": ("", "_total", "_created"),
    "gauge": ("",),
    "histogram": ("", "_bucket", "_sum", "_count", "_created"),
}


#: The variables that put prometheus-client in multiprocess mode (its old lowercase name too).
MULTIPROCESS_ENV = ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROCESS_ENV[0]) or os.environ.get(MULTIPROCESS_ENV[1])


def count_in_memory() -> dict[str, str]:
    """Have this process count in memory, whatever its environment says: the `MULTIPROCESS_ENV` variables are
    removed (those that were set are returned, by name), and prometheus-client's value class, which it chose from
    them when it was imported, is chosen again."""
    dropped = {name: os.environ.pop(name) for name in MULTIPROCESS_ENV if name in os.environ}
    choose = getattr(values, "get_value_class", None)
    if dropped and callable(choose):
        values.ValueClass = choose()
    return dropped


class Metrics:
    """The metrics of one app: built-in families, per-API children, and user metrics."""

    def __init__(self) -> None:
        self.directory = multiprocess_dir()
        self.multiprocess = self.directory is not None
        self.registry = CollectorRegistry(auto_describe=True)
        if self.multiprocess:
            multiprocess.MultiProcessCollector(self.registry)  # type: ignore[no-untyped-call]  # untyped upstream
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
            "Time spent in each stage (preprocess, predict, postprocess, pre_inference, run, post_inference, job)",
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
            "Requests cancelled before they finished, by reason (disconnect, timeout, cancelled)",
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
        self.auth_failures = Counter(
            PREFIX + "auth_failures",
            "Requests refused with 401 for lack of a valid API key, by reason (missing, invalid)",
            ["reason"],
            registry=owner,
        )
        # The process's own families: this process's from /proc/self, or each live worker's (labelled pid).
        if self.multiprocess:
            self.registry.register(_WorkerProcesses(self.directory or ""))
        else:
            ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.registry.register(_BuildInfo())
        self._exposed = _WithoutCreated(self.registry)
        self._refreshers: list[Callable[[], None]] = []
        self._flushers: list[Callable[[], None]] = []
        self._user: dict[str, tuple[str, tuple[str, ...], Any]] = {}
        self._samples: dict[str, str] = {}
        self._user_lock = threading.Lock()
        self._flusher: asyncio.Task[None] | None = None

    def add_refresher(self, refresh: Callable[[], None]) -> None:
        """Register a callback that updates gauges before each flush (each scrape, or periodically)."""
        self._refreshers.append(refresh)

    def add_flusher(self, flush: Callable[[], None]) -> None:
        """Register a callback that adds buffered observations to prometheus-client (an API's `ApiMetrics`)."""
        self._flushers.append(flush)

    def remove(self, refresh: Callable[[], None], flush: Callable[[], None]) -> None:
        """Forget a refresher and a flusher (an API no longer served), once `flush` has run a last time."""
        flush()
        self._refreshers = [known for known in self._refreshers if known != refresh]
        self._flushers = [known for known in self._flushers if known != flush]

    def refresh(self) -> None:
        for refresh in self._refreshers:
            refresh()

    def flush(self) -> None:
        """Bring every buffered observation and live gauge of this process into prometheus-client."""
        self.refresh()
        for flush in self._flushers:
            flush()

    def exposition(self) -> bytes:
        """The answer of ``GET /metrics``: every family, without the ``_created`` samples."""
        return self.negotiated(None)[0]

    def negotiated(self, accept: str | None) -> tuple[bytes, bytes]:
        """(body, content type) of ``GET /metrics`` for a scraper's Accept: OpenMetrics (with the exemplars)
        when it asks for ``application/openmetrics-text``, else the Prometheus text format."""
        self.flush()
        if self.directory is not None:
            _forget_dead_workers(self.directory)
        if accept is not None and "application/openmetrics-text" in accept:
            return openmetrics.generate_latest(self._exposed), OPENMETRICS_TYPE.encode()  # type: ignore[no-untyped-call]
        return generate_latest(self._exposed), CONTENT_TYPE.encode()

    # --------------------------------------------------------------------------------------------
    # periodic flush (several worker processes only)

    def start(self) -> None:
        """Start flushing every `FLUSH_INTERVAL` seconds on the running loop (multiprocess mode only).

        A scrape reads every worker's files, but only the answering worker flushes first; the others' buffers
        reach their files on this schedule.
        """
        if self.multiprocess and self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_periodically())

    async def stop(self) -> None:
        """Flush one last time; in multiprocess mode, stop the periodic flush and drop this worker's live gauges."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        self.flush()
        if self.directory is not None:
            multiprocess.mark_process_dead(os.getpid(), self.directory)  # type: ignore[no-untyped-call]  # untyped upstream

    async def _flush_periodically(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL)
            self.flush()

    # --------------------------------------------------------------------------------------------
    # user metrics

    def user_metric(self, kind: str, name: str, tags: dict[str, Any] | None) -> Any:
        """The labelled child of user metric `name`, created on first use; `MetricsError` says what is wrong."""
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise MetricsError(
                f"metric name {name!r} is not a valid Prometheus name (letters, digits, '_' and ':', "
                "not starting with a digit)"
            )
        if name.startswith(PREFIX):
            raise MetricsError(f"metric name {name!r} is reserved: names starting with {PREFIX!r} are modelserve's own")
        if tags is None:
            tags = {}
        if not isinstance(tags, dict):
            raise MetricsError(f"tags of metric {name!r} must be a dict, got {type(tags).__name__}")
        keys = tuple(sorted(tags))
        for key in keys:
            if not isinstance(key, str) or not _LABEL_RE.match(key) or key.startswith("__"):
                raise MetricsError(
                    f"tag {key!r} of metric {name!r} is not a valid Prometheus label name "
                    "(letters, digits and '_', not starting with a digit or '__')"
                )
        with self._user_lock:
            known = self._user.get(name)
            if known is None:
                family = self._new_family(kind, name, keys)
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
        """Create user family `name` (under the lock), refusing names whose samples would collide."""
        base = name[: -len("_total")] if kind == "counter" and name.endswith("_total") else name
        samples = [base + suffix for suffix in _SAMPLE_SUFFIXES[kind]]
        for sample in samples:
            other = self._samples.get(sample)
            if other is not None:
                raise MetricsError(
                    f"metric {name!r} ({kind}) would write samples named {sample!r}, like metric {other!r} "
                    f"({self._user[other][0]}); choose another name"
                )
        doc = f"user metric {name}"
        family: Any
        if kind == "gauge":
            family = Gauge(name, doc, keys, registry=self._owner, multiprocess_mode="mostrecent")
        elif kind == "counter":
            family = Counter(name, doc, keys, registry=self._owner)
        else:
            family = Histogram(name, doc, keys, registry=self._owner)
        self._user[name] = (kind, keys, family)
        for sample in samples:
            self._samples[sample] = name
        return family


def _number(metric: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            return float(value)
        except (TypeError, ValueError):
            raise MetricsError(f"value of metric {metric!r} must be a number, got {type(value).__name__}") from None
    return value


class MetricsClient:
    """What user constructors receive as ``metrics_client`` (the Cortex/Truss interface).

    ``tags`` become Prometheus labels::

        self.metrics.increment("cache_hits", tags={"model": "iris"})
        self.metrics.histogram("tokens_per_request", 17)
        self.metrics.gauge("queue_size", 3)

    A name that is not a valid Prometheus name, starts with ``modelserve_``, is already used by a metric of
    another kind or with other tag keys raises `MetricsError` (a `ValueError`) saying why.
    """

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def gauge(self, metric: str, value: float, tags: dict[str, Any] | None = None) -> None:
        """Set gauge `metric` to `value`."""
        self._metrics.user_metric("gauge", metric, tags).set(_number(metric, value))

    def increment(self, metric: str, value: float = 1, tags: dict[str, Any] | None = None) -> None:
        """Add `value` (finite, >= 0) to counter `metric` (exposed as ``<metric>_total``)."""
        amount = _number(metric, value)
        if not 0 <= amount < math.inf:  # a NaN or an infinity would stay in the counter for good
            raise MetricsError(f"counter {metric!r} can only be incremented by a finite value >= 0, got {value!r}")
        self._metrics.user_metric("counter", metric, tags).inc(amount)

    def histogram(self, metric: str, value: float, tags: dict[str, Any] | None = None) -> None:
        """Record one observation of `value` (finite) in histogram `metric`."""
        amount = _number(metric, value)
        if not math.isfinite(amount):  # its _sum would stay NaN or infinite for good
            raise MetricsError(f"histogram {metric!r} can only observe a finite value, got {value!r}")
        self._metrics.user_metric("histogram", metric, tags).observe(amount)


class _WithoutCreated:
    """A registry view without the ``<name>_created`` samples of counters and histograms.

    They hold each series' creation time, which nobody reads here and which doubles the exposition's size.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            if metric.type in ("counter", "histogram", "summary"):
                created = metric.name + "_created"
                metric.samples = [sample for sample in metric.samples if sample.name != created]
            yield metric


def _forget_dead_workers(directory: str) -> None:
    """Drop the live gauges (in flight, waiting) of worker processes that died without cleaning up."""
    pids: set[int] = set()
    for path in glob.glob(os.path.join(directory, "gauge_live*_*.db")):
        digits = os.path.basename(path)[: -len(".db")].rpartition("_")[2]
        if digits.isdigit():
            pids.add(int(digits))
    for pid in _dead(pids):
        multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]  # untyped upstream


def _dead(pids: Iterable[int]) -> list[int]:
    dead = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            dead.append(pid)
        except PermissionError:
            pass  # alive, owned by someone else
    return dead


def has_exemplar_seam(child: Any) -> bool:
    """Whether histogram `child` has the private buckets `Exemplars` writes to (prometheus-client's own, in
    one process); checked once when tracing starts, which warns where it is not so."""
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    return (
        bounds is not None
        and buckets is not None
        and len(bounds) == len(buckets)
        and all(callable(getattr(bucket, "set_exemplar", None)) for bucket in buckets)
    )


class Exemplars:
    """The exemplars of histogram `child`, offered by every traced request of a route: the bucket its time
    falls in is marked with its trace (an OpenMetrics exemplar) at most once every `every` seconds, the first in
    each bucket at once. A bucket keeps only its last exemplar and a scrape comes every few seconds, so the ones
    in between were never seen; each costs a traced request ~2-3 us (the trace id in hex, the `Exemplar`, the
    clock) on the 2-core machine. The observation itself is counted as usual (`modelserve.api_metrics`); this
    sets only the exemplar, on prometheus-client's private buckets, left alone where they are not as expected
    (and without effect with several workers: prometheus-client keeps no exemplars in its multiprocess
    files)."""

    __slots__ = ("bounds", "buckets", "due", "every")

    def __init__(self, child: Any, every: float = 1.0) -> None:
        seam = has_exemplar_seam(child)
        self.bounds = child._upper_bounds if seam else ()
        self.buckets = child._buckets if seam else ()
        #: When each bucket takes its next exemplar (`time.perf_counter`); empty: the seam is not there.
        self.due = [0.0] * len(self.buckets)
        self.every = every

    def offer(self, seconds: float, now: float, trace_id: int) -> None:
        """A traced request took `seconds`, ending `now` (`time.perf_counter`), in the trace `trace_id`."""
        due = self.due
        if not due:
            return
        index = bisect_left(self.bounds, seconds)
        if now < due[index]:
            return
        due[index] = now + self.every
        self.buckets[index].set_exemplar(Exemplar({"trace_id": format(trace_id, "032x")}, seconds, time.time()))


def _runtimes() -> str:
    """The model runtimes this install can serve, comma-separated (found, not imported)."""
    from modelserve.runtimes import RUNTIMES

    found = []
    for name, runtime in sorted(RUNTIMES.items()):
        try:
            if importlib.util.find_spec(runtime.package) is not None:
                found.append(name)
        except (ImportError, ValueError):
            pass
    return ",".join(found)


class _BuildInfo:
    """``modelserve_build_info{version, python, runtimes} 1``: what a dashboard shows beside the numbers."""

    def __init__(self) -> None:
        from modelserve import __version__

        self.labels = [__version__, ".".join(map(str, sys.version_info[:3])), _runtimes()]

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            PREFIX + "build_info",
            "modelserve's version, the Python version and the model runtimes installed",
            labels=["version", "python", "runtimes"],
        )
        family.add_metric(self.labels, 1)
        yield family


class _WorkerProcesses:
    """The ``process_*`` families of every live worker process, each series labelled with its ``pid``.

    prometheus-client's process collector reads one process; with several workers a scrape is answered by
    one of them, so this reads (in ``/proc``) each live worker that has metrics files in the shared folder."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def collect(self) -> Iterator[Metric]:
        pids: set[int] = set()
        for path in glob.glob(os.path.join(self.directory, "*.db")):
            digits = os.path.basename(path)[: -len(".db")].rpartition("_")[2]
            if digits.isdigit():
                pids.add(int(digits))
        merged: dict[str, Metric] = {}
        for pid in sorted(pids - set(_dead(pids))):
            for family in ProcessCollector(pid=lambda pid=pid: pid, registry=None).collect():  # type: ignore[misc]
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                for sample in family.samples:
                    into.samples.append(Sample(sample.name, {**sample.labels, "pid": str(pid)}, sample.value))
        yield from merged.values()
