"""Prometheus metrics: the server's own (``modelserve_*``) and the ones user code records.

Built on prometheus-client. One `Metrics` object per app owns a registry; with several worker processes
(``PROMETHEUS_MULTIPROC_DIR`` set, as the CLI does for ``--workers`` > 1) values are written to shared files
and ``GET /metrics`` adds up every worker's numbers.

The request path does not call prometheus-client: `ApiMetrics` counts answers and stage times in plain
Python lists and dicts, one set per thread (the sync stages are timed in worker threads), and `Metrics.flush`
adds what changed to the prometheus children. A flush happens before every scrape and, with several
workers, every `FLUSH_INTERVAL` seconds in each worker: a scrape answered by one worker sees the others'
numbers at most that old (plus the live gauges, in flight and waiting, refreshed on the same schedule).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import re
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess
from prometheus_client.metrics_core import Metric

from modelserve.errors import MetricsError

PREFIX = "modelserve_"
_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Seconds between two flushes of a worker's buffered observations, with several worker processes.
FLUSH_INTERVAL = 1.0
#: Names of the samples each kind of family writes, from its name (a counter drops a ``_total`` suffix).
_SAMPLE_SUFFIXES = {
    "counter": ("", "_total", "_created"),
    "gauge": ("",),
    "histogram": ("", "_bucket", "_sum", "_count", "_created"),
}


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir")


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
        self._exposed = _WithoutCreated(self.registry)
        self._refreshers: list[Callable[[], None]] = []
        self._apis: list[ApiMetrics] = []
        self._user: dict[str, tuple[str, tuple[str, ...], Any]] = {}
        self._samples: dict[str, str] = {}
        self._user_lock = threading.Lock()
        self._flusher: asyncio.Task[None] | None = None

    def add_refresher(self, refresh: Callable[[], None]) -> None:
        """Register a callback that updates gauges before each flush (each scrape, or periodically)."""
        self._refreshers.append(refresh)

    def refresh(self) -> None:
        for refresh in self._refreshers:
            refresh()

    def flush(self) -> None:
        """Bring every buffered observation and live gauge of this process into prometheus-client."""
        self.refresh()
        for api in self._apis:
            api.flush()

    def exposition(self) -> bytes:
        """The answer of ``GET /metrics``: every family, without the ``_created`` samples."""
        self.flush()
        if self.directory is not None:
            _forget_dead_workers(self.directory)
        return generate_latest(self._exposed)

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
        """Add `value` (>= 0) to counter `metric` (exposed as ``<metric>_total``)."""
        amount = _number(metric, value)
        if amount < 0:
            raise MetricsError(f"counter {metric!r} can only be incremented by a value >= 0, got {value!r}")
        self._metrics.user_metric("counter", metric, tags).inc(amount)

    def histogram(self, metric: str, value: float, tags: dict[str, Any] | None = None) -> None:
        """Record one observation of `value` in histogram `metric`."""
        self._metrics.user_metric("histogram", metric, tags).observe(_number(metric, value))


class ApiMetrics:
    """The metrics of one API, cheap on the request path: no prometheus-client call per request.

    `answered`, `stage_timer` and `batch` count in plain Python lists and dicts, one set per calling thread
    (the sync stages are timed in worker threads), so that no lock and no label lookup is taken per request;
    `flush` adds what changed since the last flush to the prometheus children. Children are resolved once:
    per API here, per status code, stage or reason the first time one is seen.
    """

    def __init__(self, metrics: Metrics, api: str) -> None:
        self.api = api
        self._metrics = metrics
        self._lock = threading.Lock()
        self._local = threading.local()
        self._code_counts: list[tuple[dict[int, int], dict[int, int]]] = []  # (counts, flushed) per thread
        self._codes: dict[int, Any] = {}
        self._stages: dict[str, _Histogram] = {}
        self._reasons: dict[str, Any] = {}
        self._statuses: dict[str, Any] = {}
        self.latency = metrics.latency.labels(api)
        self.in_flight = metrics.in_flight.labels(api)
        self.waiting = metrics.waiting.labels(api)
        self.queue_full = metrics.queue_full.labels(api)
        self.load_time = metrics.load_time.labels(api)
        self._latency = _Histogram(self.latency)
        self._batch_size: _Histogram | None = None
        self._batch_wait: _Histogram | None = None
        #: For V2's statistics extension: when the last answer below 400 was sent (``time.time()``, 0: none yet),
        #: and the seconds the answers of 400 and above took (the rest of the latency sum is the successes').
        self.last_success = 0.0
        self.failed_seconds = 0.0
        metrics._apis.append(self)

    # the request path

    def answered(self, code: int, seconds: float) -> None:
        """A request was answered with status `code` after `seconds`."""
        try:
            counts = self._local.codes
        except AttributeError:
            counts = self._new_code_counts()
        counts[code] = counts.get(code, 0) + 1
        self._latency.observe(seconds)
        if code < 400:
            self.last_success = time.time()
        else:
            self.failed_seconds += seconds

    def stage_timer(self, name: str, seconds: float) -> None:
        """Stage `name` took `seconds` (called from worker threads too)."""
        histogram = self._stages.get(name)
        if histogram is None:
            histogram = self._new_stage(name)
        histogram.observe(seconds)

    def batch(self, size: int, waits: list[float]) -> None:
        """One batched call of `size` requests, each having waited `waits` seconds for it."""
        if self._batch_size is None or self._batch_wait is None:
            with self._lock:
                if self._batch_size is None or self._batch_wait is None:
                    self._batch_wait = _Histogram(self._metrics.batch_wait.labels(self.api))
                    self._batch_size = _Histogram(self._metrics.batch_size.labels(self.api))
        self._batch_size.observe(size)
        for wait in waits:
            self._batch_wait.observe(wait)

    # rare events: straight to prometheus-client

    def cancelled(self, reason: str) -> None:
        child = self._reasons.get(reason)
        if child is None:
            child = self._reasons[reason] = self._metrics.cancelled.labels(self.api, reason)
        child.inc()

    def job(self, status: str) -> None:
        child = self._statuses.get(status)
        if child is None:
            child = self._statuses[status] = self._metrics.jobs.labels(self.api, status)
        child.inc()

    # ---------------------------------------------------------------------------------------------

    def totals(self) -> ApiTotals:
        """What this process has counted for the API so far (read by V2's statistics extension)."""
        with self._lock:
            codes: dict[int, int] = {}
            for counts, _ in self._code_counts:
                for code, count in list(counts.items()):
                    codes[code] = codes.get(code, 0) + count
            stages = dict(self._stages)
            batches = self._batch_size
        return ApiTotals(
            codes,
            self._latency.totals()[1],
            self.failed_seconds,
            self.last_success,
            {name: histogram.totals() for name, histogram in stages.items()},
            None if batches is None else batches.totals()[0],
            None if self._batch_wait is None else self._batch_wait.totals(),
        )

    def flush(self) -> None:
        """Add what was counted since the last flush to the prometheus children (safe from any thread)."""
        with self._lock:
            for counts, flushed in self._code_counts:
                for code, count in list(counts.items()):
                    delta = count - flushed.get(code, 0)
                    if delta:
                        self._code(code).inc(delta)
                        flushed[code] = count
            histograms = [self._latency, *self._stages.values(), self._batch_size, self._batch_wait]
        for histogram in histograms:
            if histogram is not None:
                histogram.flush()

    def _new_code_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        with self._lock:
            self._code_counts.append((counts, {}))
        self._local.codes = counts
        return counts

    def _new_stage(self, name: str) -> _Histogram:
        with self._lock:
            histogram = self._stages.get(name)
            if histogram is None:
                histogram = self._stages[name] = _Histogram(self._metrics.stage_latency.labels(self.api, name))
            return histogram

    def _code(self, code: int) -> Any:
        child = self._codes.get(code)
        if child is None:
            child = self._codes[code] = self._metrics.requests.labels(self.api, str(code))
        return child


@dataclass(frozen=True)
class ApiTotals:
    """An API's counts in this process: answers by status code, their seconds (all, and those of codes >= 400),
    the last success's ``time.time()`` (0: none), stage (count, seconds) by stage name, batched calls and the
    (count, seconds) of batch waits (None without batching)."""

    codes: dict[int, int]
    seconds: float
    failed_seconds: float
    last_success: float
    stages: dict[str, tuple[int, float]]
    batches: int | None
    batch_wait: tuple[int, float] | None


class _Histogram:
    """The observations of one histogram child, counted in plain lists, one per observing thread.

    Each list is written by its own thread only (``[sum, count of bucket 0, count of bucket 1, ...]``,
    cumulative), so that observing takes no lock; `flush` adds the difference with what it flushed before
    to the child's bucket and sum values. Those are private attributes of prometheus-client, stable for
    years and covered by the tests; without them `observe` falls back to the child's own.
    """

    __slots__ = ("child", "bounds", "_local", "_tallies", "_lock", "_direct", "observe")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.bounds = tuple(getattr(child, "_upper_bounds", ()))
        self._local = threading.local()
        self._tallies: list[tuple[list[float], list[float]]] = []  # (written by its thread, flushed)
        self._lock = threading.Lock()
        buckets = getattr(child, "_buckets", None)
        self._direct = buckets is None or not hasattr(child, "_sum") or len(buckets) != len(self.bounds)
        self.observe: Callable[[float], None] = child.observe if self._direct else self._count

    def _count(self, value: float) -> None:
        try:
            tally = self._local.tally
        except AttributeError:
            tally = self._new_tally()
        tally[0] += value
        tally[1 + bisect_left(self.bounds, value)] += 1

    def _new_tally(self) -> list[float]:
        tally = [0.0] + [0] * len(self.bounds)
        with self._lock:
            self._tallies.append((tally, [0.0] * len(tally)))
        self._local.tally = tally
        return tally

    def totals(self) -> tuple[int, float]:
        """(count, sum) of every observation so far, flushed or not."""
        if self._direct:
            samples = {sample.name.rpartition("_")[2]: sample.value for sample in self.child.collect()[0].samples}
            return int(samples.get("count", 0)), float(samples.get("sum", 0.0))
        count, total = 0, 0.0
        with self._lock:
            for tally, _ in self._tallies:
                now = tally[:]
                total += now[0]
                count += int(sum(now[1:]))
        return count, total

    def flush(self) -> None:
        if self._direct:
            return
        buckets, total = self.child._buckets, self.child._sum
        with self._lock:
            for tally, flushed in self._tallies:
                now = tally[:]  # one consistent copy while the owning thread keeps counting
                for index in range(1, len(now)):
                    delta = now[index] - flushed[index]
                    if delta:
                        buckets[index - 1].inc(delta)
                if now[0] != flushed[0]:
                    total.inc(now[0] - flushed[0])
                flushed[:] = now


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
