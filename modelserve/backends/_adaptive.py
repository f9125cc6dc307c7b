"""Inline or in a worker thread: run a sync call where it costs least, by its measured run time.

A hop to a worker thread costs tens of microseconds, which is more than a small ONNX model takes to run:
a bare route calling ``session.run`` through ``run_in_threadpool`` serves only 0.5-0.75x the requests of
the same route calling it inline. But a call that runs inline blocks the event loop, and so every other
request of the server (``/healthz`` too), for as long as it runs.

`Adaptive` keeps an estimate of a call's run time (an exponentially weighted moving average, updated after
every call wherever it ran, each measure clipped to `CLIP` times the estimate so that one call slowed by a
busy machine does not flip the decision) and runs the call inline while the estimate, scaled up for inputs
larger than usual, stays under a threshold (``inline_threshold_ms``, 1 ms by default); otherwise in a
worker thread. A call never measured goes to a thread. A threshold of 0 sends every call to a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING, Any

from modelserve.context import current
from modelserve.pipeline import run_in_thread

if TYPE_CHECKING:
    from modelserve.batching import BatchThreads

logger = logging.getLogger("modelserve")

#: Weight of the newest measure in the moving averages.
ALPHA = 0.2
#: A measure counts for at most this many times the estimate: one call slowed by the machine (the process
#: descheduled, a garbage collection) does not send the next calls to a thread, while a model that really
#: became slower crosses the threshold within a few calls (the estimate grows up to 1.6x per call).
CLIP = 4.0
#: An inline call this much slower than the threshold (and at least `BLOCKED_LOG_S`) is logged.
BLOCKED_FACTOR = 20
BLOCKED_LOG_S = 0.05


#: What `Adaptive.now` returns for a call that must run in a worker thread.
THREAD: Any = object()


class Adaptive:
    """Runs one sync callable inline while it is measured fast, else in a worker thread.

    ::

        run = Adaptive("run", threshold_s=0.001, label="api 'iris'")
        result = await run.call(session_run, feeds, size=feeds_size)
    """

    __slots__ = (
        "name",
        "label",
        "threshold",
        "estimate",
        "usual_size",
        "inline_calls",
        "thread_calls",
        "threads",
        "_warned",
    )

    def __init__(self, name: str, threshold_s: float, label: str = "") -> None:
        self.name = name
        self.label = label
        self.threshold = threshold_s
        #: Seconds per call (moving average); None until measured.
        self.estimate: float | None = None
        #: The usual size of a call's input (moving average), to scale the estimate for larger inputs.
        self.usual_size = 1.0
        self.inline_calls = 0
        self.thread_calls = 0
        #: Threads of its own for the calls that do not run inline (a batched model's); None: the process's pool.
        self.threads: BatchThreads | None = None
        self._warned = False

    def seed(self, seconds: float, size: float = 1.0) -> None:
        """Start from a measure taken elsewhere (a warm-up call at load)."""
        self.estimate = seconds
        self.usual_size = max(float(size), 1.0)

    def predicted(self, size: float = 1.0) -> float:
        """The expected run time of a call with an input of `size` elements."""
        if self.estimate is None:
            return float("inf")
        usual = self.usual_size
        return self.estimate * (size / usual) if size > usual else self.estimate

    def inline(self, size: float = 1.0) -> bool:
        return self.predicted(size) < self.threshold

    def record(self, seconds: float, size: float = 1.0) -> None:
        # Also called from worker threads: a lost update between two racing calls is harmless.
        estimate = self.estimate
        if estimate is None:
            self.estimate = seconds
        else:
            self.estimate = estimate + ALPHA * (min(seconds, CLIP * estimate) - estimate)
        self.usual_size += ALPHA * (max(float(size), 1.0) - self.usual_size)

    def now(self, fn: Callable[..., Any], *args: Any, size: float = 1.0) -> Any:
        """``fn(*args)`` inline when it is measured fast, else `THREAD` (then ``await call(...)``): a plain call on
        the fast path, where awaiting `call` would cost a coroutine."""
        # `inline` and `record`, written out: this runs on every request, where each method call counts.
        estimate = self.estimate
        if estimate is not None:
            usual = self.usual_size
            if (estimate * (size / usual) if size > usual else estimate) < self.threshold:
                self.inline_calls += 1
                started = perf_counter()
                try:
                    return fn(*args)
                finally:
                    seconds = perf_counter() - started
                    self.estimate = estimate + ALPHA * (min(seconds, CLIP * estimate) - estimate)
                    self.usual_size = usual + ALPHA * ((size if size > 1.0 else 1.0) - usual)
                    if seconds > BLOCKED_LOG_S and seconds > BLOCKED_FACTOR * self.threshold:
                        self._blocked(seconds)
        return THREAD

    async def call(self, fn: Callable[..., Any], *args: Any, size: float = 1.0) -> Any:
        result = self.now(fn, *args, size=size)
        if result is not THREAD:
            return result
        self.thread_calls += 1
        if self.threads is not None:
            return await self.threads.run_here(self._timed, fn, args, size)
        return await run_in_thread(self._timed, fn, args, size, ctx=current.get())

    def _timed(self, fn: Callable[..., Any], args: tuple[Any, ...], size: float) -> Any:
        started = perf_counter()
        try:
            return fn(*args)
        finally:
            self.record(perf_counter() - started, size)

    def _blocked(self, seconds: float) -> None:
        if self._warned:
            return
        self._warned = True
        logger.warning(
            "%s: %s took %.0f ms on the event loop, although earlier calls were faster than the inline "
            "threshold of %.3g ms; it runs in a worker thread until it is measured fast again. If its run time "
            "depends on the input's values, set inline_threshold_ms: 0 to always use a thread",
            self.label,
            self.name,
            seconds * 1000,
            self.threshold * 1000,
        )

    def describe(self) -> dict[str, Any]:
        return {
            "estimate_ms": None if self.estimate is None else round(self.estimate * 1000, 4),
            "inline": self.inline(),
            "inline_calls": self.inline_calls,
            "thread_calls": self.thread_calls,
        }
