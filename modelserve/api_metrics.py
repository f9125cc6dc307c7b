"""An API's metrics on the request path: answers, stage and batch times, counted without prometheus-client.

`ApiMetrics` counts in plain Python lists and dicts, one set per calling thread (the sync stages are timed in
worker threads), so that no lock and no label lookup is taken per request; the app's `Metrics`
(`modelserve.metrics`) calls its `flush` before every scrape, and periodically with several workers, to add
what changed to the prometheus children.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modelserve.metrics import Metrics


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
        metrics.add_flusher(self.flush)

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
