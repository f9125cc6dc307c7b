"""Every way modelserve runs code in a worker thread: the one module to read for "where does this run?".

- `run_sync`: a call in the process's pool, handed over at once (no loop turn first), in a copy of the
  caller's context; `submit`: the same, nobody waiting. `freed_on_failure` wraps a call that may fail with
  large values in its frames (a large body's decode), so that they are freed in the thread, not on the loop.
- `run_in_thread`: a request's sync code in the pool, holding the request's concurrency slot until the code
  returns even when the request left first (a timeout, a disconnect).
- `Adaptive`: one sync callable inline on the event loop while it is measured fast, else in a thread.
- `BatchThreads`: a few threads of one API's own, warmed at load and kept for its life (a batched model's).
- `OwnThread`: one thread of a component's own, for work that must all run on the same thread (the SQLite
  job store's connection).

Why not ``anyio.to_thread.run_sync``: it first yields to the event loop (a checkpoint) and only then hands the
call to a thread. On a busy server that yield waits behind every callback that is ready, several milliseconds
under load (measured: 9 ms at the median with 64 connections posting 6 KB bodies), and a batched model sits
idle for all of it. Here the call goes to a `ThreadPoolExecutor` at once and the caller awaits its future.

The pool is shared by the process (like anyio's default limiter, it caps the threads at `MAX_THREADS`).
Its threads are not daemons: `shutdown` lets the idle ones go, so that a thread still alive afterwards is
one still running user code.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import queue
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from time import perf_counter
from typing import Any, TypeVar

from modelserve import devices
from modelserve.context import RequestContext, current
from modelserve.errors import RequestCancelled

logger = logging.getLogger("modelserve")

T = TypeVar("T")

#: At most this many sync calls run at once in the process (anyio's default is 40 too).
MAX_THREADS = 40

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        with _lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="modelserve-worker")
    return _executor


async def run_sync(fn: Callable[..., Any], *args: Any, abandon_on_cancel: bool = False) -> Any:
    """Run ``fn(*args)`` in a worker thread, in a copy of the caller's context; its result or exception.

    When the caller is cancelled, with `abandon_on_cancel` it stops waiting at once (the call runs on, or
    never starts if no thread has picked it up yet); without, the cancellation takes effect once the call
    has returned.
    """
    context = contextvars.copy_context()
    future = asyncio.wrap_future(_pool().submit(context.run, fn, *args))
    if abandon_on_cancel:
        return await future
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(future)
        except asyncio.CancelledError:
            if future.done():
                raise
            cancelled = True
            continue
        if cancelled:
            raise asyncio.CancelledError()
        return result


def submit(fn: Callable[..., Any], *args: Any) -> None:
    """Start ``fn(*args)`` in a worker thread, in the thread's own context; nobody waits for it (`fn` hands
    its outcome over itself, as the limiter's turns do)."""
    _pool().submit(fn, *args)


def freed_on_failure(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, run in a worker thread (``run_sync(freed_on_failure, fn, *args)``); when it raises, what its
    frames held is freed here, before the exception goes to the event loop.

    An exception keeps the frames it passed through, and their variables, until it is dropped: a large body's
    decode refused half-way (a V2 request whose 100,000th tensor is wrong) held every value decoded so far, freed
    on the loop when the loop dropped the exception after answering the 400 (about 50 ms for 100,000 tensors).
    The frames of its traceback, and of the exceptions it chains, are cleared here; their lines stay, for a log.
    """
    try:
        return fn(*args)
    except BaseException as exc:
        _clear_frames(exc)
        raise


def _clear_frames(error: BaseException) -> None:
    """Drop the variables of the frames that `error` and the exceptions it chains passed through (not the frame
    still running, `freed_on_failure`'s own, whose variables are its arguments)."""
    pending, seen = [error], set()
    while pending:
        one = pending.pop()
        if id(one) in seen:
            continue
        seen.add(id(one))
        traceback.clear_frames(one.__traceback__)
        pending += [chained for chained in (one.__cause__, one.__context__) if chained is not None]


def shutdown() -> None:
    """Let the idle threads exit (a new call starts a new pool)."""
    global _executor
    with _lock:
        executor, _executor = _executor, None
    if executor is not None:
        executor.shutdown(wait=False)


async def run_in_thread(
    fn: Callable[..., Any],
    *args: Any,
    ctx: RequestContext | None,
    on_abandon: Callable[[], None] | None = None,
) -> Any:
    """Run a request's sync code `fn` in the pool.

    If the request leaves while `fn` runs (timeout, disconnect), the call is abandoned but the thread keeps
    the request's concurrency slot until `fn` returns; then it runs `on_abandon` and releases the slot.
    """
    if ctx is None:
        return await run_sync(fn, *args)
    loop = asyncio.get_running_loop()

    def job() -> Any:
        if not ctx.enter_thread():
            raise RequestCancelled()
        try:
            return fn(*args)
        finally:
            if ctx.exit_thread():
                try:
                    if on_abandon is not None:
                        on_abandon()
                finally:
                    loop.call_soon_threadsafe(ctx.release_slot)

    return await run_sync(job, abandon_on_cancel=True)


# --------------------------------------------------------------------------------------------------
# Inline or in a worker thread, by the call's measured run time.
#
# A hop to a worker thread costs tens of microseconds, which is more than a small ONNX model takes to run: a
# bare route calling ``session.run`` through ``run_in_threadpool`` serves only 0.5-0.75x the requests of the
# same route calling it inline. But a call that runs inline blocks the event loop, and so every other request
# of the server (``/healthz`` too), for as long as it runs.
#
# `Adaptive` keeps an estimate of a call's run time (an exponentially weighted moving average, updated after
# every call wherever it ran, each measure clipped to `CLIP` times the estimate so that one call slowed by a
# busy machine does not flip the decision) and runs the call inline while the estimate, scaled up for inputs
# larger than usual, stays under a threshold (``inline_threshold_ms``, 1 ms by default); otherwise in a worker
# thread. A call never measured goes to a thread. A threshold of 0 sends every call to a thread.

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
        return await self.in_thread(fn, *args, size=size)

    def in_thread(self, fn: Callable[..., Any], *args: Any, size: float = 1.0) -> Awaitable[Any]:
        """``fn(*args)`` in a thread (the API's own, else the pool's for the current request), measured."""
        self.thread_calls += 1
        if self.threads is not None:
            return self.threads.run_here(self._timed, fn, args, size)
        return run_in_thread(self._timed, fn, args, size, ctx=current.get())

    def measured(self, fn: Callable[..., Any], *args: Any, size: float = 1.0) -> Any:
        """``fn(*args)`` in the caller's thread (a batch thread that chose no other), counted as a thread call."""
        self.thread_calls += 1
        return self._timed(fn, args, size)

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


# --------------------------------------------------------------------------------------------------
# Threads of one API's own.

#: Receives a call's result or its exception, in the thread that ran it.
Done = Callable[[Any, "BaseException | None"], None]

#: How much higher than the event loop's a batched API's threads set their nice value (Linux; elsewhere they
#: keep the process's).
#: Where the model and the event loop share a core, the loop then reads, decodes and answers requests before
#: the model's thread takes the core back, so the next batch finds every request that came meanwhile: with
#: the server on one core, a 4x1024^2 MLP at 64 connections ran batches of 22-31 requests instead of 4.4, and
#: served 1.6-1.7x the requests (`benchmarks/serving_matrix.py`'s heavy model). The threads still get a third
#: of a contended core (CFS weights 335 against 1024), and an idle loop leaves them all of it; with cores to
#: spare, or a GPU doing the model's work, it changes nothing.
BATCH_THREAD_NICE = 5


class BatchThreads:
    """The threads of one batched API: one per concurrency slot, started at load, alive as long as the API.

    A GPU runtime builds per-thread state on a thread's first call (CUDA context binding, cuBLAS handles: 45 ms
    at the median for BERT-base on an H100 against 6.8 ms on a warm thread), so a batch must never land on a
    fresh thread of a shared pool. A small executor of its own rather than the process's pool: the model always
    runs on the same few threads (warm per-thread runtime state), and a job costs a queue put and one
    ``call_soon_threadsafe``, not a `concurrent.futures.Future` and a wrapped asyncio future. Daemon threads:
    an idle one never holds up the process's exit; `close` lets them go. `nice`: how far below the starting
    thread's priority they run (`BATCH_THREAD_NICE` for batches; a batched API's thread for the requests it
    serves unbatched keeps the loop's, ``nice=0``); `role` names them (``modelserve-<role>-<api>-<index>``).

    ::

        threads = BatchThreads("mlp", 1)
        threads.start(warm=lambda: model.run(zeros))     # each thread runs `warm` once, before any batch
        threads.submit(run_batch, items, done)           # done(results, error) is called in the thread
    """

    def __init__(self, name: str, count: int, nice: int = BATCH_THREAD_NICE, role: str = "batch") -> None:
        self.name = name
        self.count = count
        #: How much higher than the starting thread's the threads set their nice value (0: the same).
        self.nice = nice
        self.role = role
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], Done] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        #: ``threading.get_ident()`` of each started thread.
        self.idents: list[int] = []
        #: Jobs submitted (by the event loop's thread only), and jobs finished by each thread (each slot
        #: written by its thread only): `busy()` compares them without a lock.
        self.submitted = 0
        self._finished = [0] * count

    def start(self, warm: Callable[[], Any] | None = None) -> None:
        """Start the threads and wait until each has run `warm` (its exception is logged, not raised)."""
        if self._threads:
            return
        ready = threading.Barrier(self.count + 1)
        for index in range(self.count):
            thread = threading.Thread(
                target=self._work,
                args=(warm, ready, index),
                name=f"modelserve-{self.role}-{self.name}-{index}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        ready.wait()

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], done: Done) -> None:
        """Run ``fn(*args)`` on one of the threads, then ``done(result, None)`` or ``done(None, exception)``."""
        if not self._threads:
            self.start()
        self.submitted += 1
        self._jobs.put((fn, args, done))

    def busy(self) -> bool:
        """Whether a job submitted is still queued or running (its `done` may have been called already)."""
        return self.submitted != sum(self._finished)

    def run_here(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        """``fn(*args)`` on one of the threads, as an awaitable of the running loop (for async callers)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if not future.done():
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(result)

        def done(result: Any, error: BaseException | None) -> None:
            loop.call_soon_threadsafe(settle, result, error)

        self.submit(fn, args, done)
        return future

    def _work(self, warm: Callable[[], Any] | None, ready: threading.Barrier, index: int) -> None:
        self.idents.append(threading.get_ident())
        if self.nice and sys.platform == "linux":  # where PRIO_PROCESS with a thread's id sets its nice value alone
            try:
                # relative to the nice value the thread started with (the loop's): a server started at nice 10
                # keeps its batch threads below its loop too, rather than raising them to BATCH_THREAD_NICE
                native = threading.get_native_id()
                os.setpriority(os.PRIO_PROCESS, native, min(os.getpriority(os.PRIO_PROCESS, native) + self.nice, 19))
            except OSError as exc:  # a sandbox refusing it: the threads keep the process's priority
                logger.debug("batch thread of api '%s': nice value not set (%s)", self.name, exc)
        devices.enter(self.name)  # modelserve.device() in the batched predict: this API's device
        try:
            if warm is not None:
                warm()
        except Exception as exc:
            logger.debug("batch thread of api '%s': warm-up failed (%r)", self.name, exc)
        finally:
            ready.wait()
        jobs, finished = self._jobs, self._finished
        while True:
            job = jobs.get()
            if job is None:
                return
            fn, args, done = job
            error: BaseException | None = None
            try:
                result = fn(*args)
            except BaseException as exc:  # noqa: B036 - user code's SystemExit fails its batch, not the thread
                result, error = None, exc
            try:
                done(result, error)
            except RuntimeError:  # the event loop is closed (the server stopped while the batch ran)
                logger.debug("batch thread of api '%s': a batch ended after the event loop closed", self.name)
            finished[index] += 1
            del job, fn, args, done, result, error  # nothing of a finished batch stays alive while the thread waits

    def close(self) -> None:
        """Let the threads end once the jobs already queued have run."""
        for _ in self._threads:
            self._jobs.put(None)
        self._threads = []


class OwnThread:
    """One thread of a component's own: every call handed to it runs there, one at a time, in order (a SQLite
    connection, which the job store uses from one thread). `close` waits for what was handed over."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread; its result or exception."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
