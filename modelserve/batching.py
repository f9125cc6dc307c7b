"""Dynamic batching: requests that arrive together share one model call.

Greedy: when the model is free, whatever is waiting (up to ``max_batch_size``) runs at once, and requests
that arrive while a batch runs form the next one. An idle server therefore adds no latency to a lone
request. With ``max_wait_ms`` > 0 a partial batch may wait at most that long for more requests.

A request cancelled while it waits leaves its batch; one cancelled during the call has its result dropped.

Sync batched calls run on `BatchThreads`: threads of the API's own, one per concurrency slot, started at load
and kept for the API's life. A GPU runtime builds per-thread state on a thread's first call (CUDA context
binding, cuBLAS handles: 45 ms at the median for BERT-base on an H100 against 6.8 ms on a warm thread), so a
batch must never land on a fresh thread of a shared pool. The hand-over costs no loop turn: the batch goes to
its thread the moment `_dispatch` forms it, and the thread hands the results back with one
``call_soon_threadsafe``.

What a request costs the event loop here: a queue entry and a future, and the wake-up when its batch ends
(every future of a batch is settled in one callback, and a request's own failure, a `Failed` result, is raised
in that request alone: no coroutine of the request's own around `Batcher.submit`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from modelserve import devices
from modelserve.context import current
from modelserve.errors import BatchSizeMismatch

if TYPE_CHECKING:
    import numpy as np

    from modelserve.config import BatchingConfig
    from modelserve.runtimes._tensors import TensorSpec

logger = logging.getLogger("modelserve")

#: Runs one batch: a list of inputs in, a list of as many results out.
BatchCall = Callable[[list[Any]], Awaitable[list[Any]]]
#: The same, as sync code run on one of the API's `BatchThreads`.
SyncBatchCall = Callable[[list[Any]], list[Any]]
#: Receives a call's result or its exception, in the thread that ran it.
_Done = Callable[[Any, "BaseException | None"], None]


class BatchThreads:
    """The threads of one batched API: one per concurrency slot, started at load, alive as long as the API.

    A small executor of its own rather than the process's pool: the model always runs on the same few threads
    (warm per-thread runtime state), and a job costs a queue put and one ``call_soon_threadsafe``, not a
    `concurrent.futures.Future` and a wrapped asyncio future. Daemon threads: an idle one never holds up the
    process's exit; `close` lets them go.

    ::

        threads = BatchThreads("mlp", 1)
        threads.start(warm=lambda: model.run(zeros))     # each thread runs `warm` once, before any batch
        threads.submit(run_batch, items, done)           # done(results, error) is called in the thread
    """

    def __init__(self, name: str, count: int) -> None:
        self.name = name
        self.count = count
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], _Done] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        #: ``threading.get_ident()`` of each started thread.
        self.idents: list[int] = []

    def start(self, warm: Callable[[], Any] | None = None) -> None:
        """Start the threads and wait until each has run `warm` (its exception is logged, not raised)."""
        if self._threads:
            return
        ready = threading.Barrier(self.count + 1)
        for index in range(self.count):
            thread = threading.Thread(
                target=self._work, args=(warm, ready), name=f"modelserve-batch-{self.name}-{index}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        ready.wait()

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...], done: _Done) -> None:
        """Run ``fn(*args)`` on one of the threads, then ``done(result, None)`` or ``done(None, exception)``."""
        if not self._threads:
            self.start()
        self._jobs.put((fn, args, done))

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

    def _work(self, warm: Callable[[], Any] | None, ready: threading.Barrier) -> None:
        self.idents.append(threading.get_ident())
        devices.enter(self.name)  # modelserve.device() in the batched predict: this API's device
        try:
            if warm is not None:
                warm()
        except Exception as exc:
            logger.debug("batch thread of api '%s': warm-up failed (%r)", self.name, exc)
        finally:
            ready.wait()
        jobs = self._jobs
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
            del job, fn, args, done, result, error  # nothing of a finished batch stays alive while the thread waits

    def close(self) -> None:
        """Let the threads end once the jobs already queued have run."""
        for _ in self._threads:
            self._jobs.put(None)
        self._threads = []


def _context_of_no_request() -> contextvars.Context:
    """A batch serves many requests: it must not run in the context of the one that happened to dispatch it
    (that request's cancellation, its concurrency slot and `is_cancelled()` are not the batch's)."""
    context = contextvars.copy_context()
    context.run(current.set, None)
    return context


class _Entry:
    __slots__ = ("item", "future", "arrived")

    def __init__(self, item: Any, future: asyncio.Future[Any], arrived: float) -> None:
        self.item = item
        self.future = future
        self.arrived = arrived


class Batcher:
    """Collects items submitted by concurrent requests and runs them in batches."""

    def __init__(
        self,
        call: BatchCall | None = None,
        *,
        name: str,
        max_batch_size: int,
        max_wait_ms: float = 0.0,
        max_concurrency: int = 1,
        on_batch: Callable[[int, list[float]], None] | None = None,
        sync_call: SyncBatchCall | None = None,
        threads: BatchThreads | None = None,
    ) -> None:
        """`call` runs a batch as a coroutine, in a task of its own; or `sync_call` runs it on `threads` (one
        per concurrency slot by default), handed over from `_dispatch` directly."""
        if (call is None) == (sync_call is None):
            raise TypeError("give call or sync_call")
        self.call = call
        self.sync_call = sync_call
        if sync_call is not None and threads is None:
            threads = BatchThreads(name, max_concurrency)
        self.threads = threads
        self.name = name
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.max_concurrency = max_concurrency
        self.on_batch = on_batch
        self.running = 0
        self._queue: deque[_Entry] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks
        self._soon = False

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def submit(self, item: Any) -> Any:
        """Wait for `item`'s batch to run and return its own result. A `Failed` result (one request's own
        failure) is raised here, as is the exception of a call that failed as a whole."""
        loop = asyncio.get_running_loop()
        entry = _Entry(item, loop.create_future(), time.perf_counter())
        self._queue.append(entry)
        if not self._soon:
            # Dispatched at the end of this turn of the loop, not now: the requests that the same turn parses
            # join the batch (clients answered by one batch come back together), and a lone request waits for
            # nothing but the callbacks already ready.
            self._soon = True
            loop.call_soon(self._dispatch_soon)
        try:
            return await entry.future
        except asyncio.CancelledError:
            try:
                self._queue.remove(entry)  # still waiting: leave the batch
            except ValueError:
                pass  # already running: its result will be dropped
            raise

    def _dispatch_soon(self) -> None:
        self._soon = False
        self._dispatch()

    def _dispatch(self) -> None:
        while self.running < self.max_concurrency and self._queue:
            if self.max_wait > 0 and len(self._queue) < self.max_batch_size:
                wait = self._queue[0].arrived + self.max_wait - time.perf_counter()
                if wait > 0:
                    if self._timer is None:
                        self._timer = asyncio.get_running_loop().call_later(wait, self._on_timer)
                    return
            batch: list[_Entry] = []
            while self._queue and len(batch) < self.max_batch_size:
                entry = self._queue.popleft()
                if not entry.future.done():
                    batch.append(entry)
            if not batch:
                continue
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self.running += 1
            if self.sync_call is not None:
                self._run_in_thread(batch)
                continue
            task = _context_of_no_request().run(asyncio.get_running_loop().create_task, self._run(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _on_timer(self) -> None:
        self._timer = None
        # The oldest waiter has waited long enough: run what is there.
        saved, self.max_wait = self.max_wait, 0.0
        try:
            self._dispatch()
        finally:
            self.max_wait = saved

    def _run_in_thread(self, batch: list[_Entry]) -> None:
        assert self.sync_call is not None and self.threads is not None
        if self.on_batch is not None:
            started = time.perf_counter()
            self.on_batch(len(batch), [started - entry.arrived for entry in batch])
        call_soon = asyncio.get_running_loop().call_soon_threadsafe
        finish = self._finish

        def done(results: Any, error: BaseException | None) -> None:
            call_soon(finish, batch, results, error)

        self.threads.submit(self.sync_call, ([entry.item for entry in batch],), done)

    async def _run(self, batch: list[_Entry]) -> None:
        started = time.perf_counter()
        if self.on_batch is not None:
            self.on_batch(len(batch), [started - entry.arrived for entry in batch])
        assert self.call is not None
        try:
            results = await self.call([entry.item for entry in batch])
        except Exception as exc:
            self._finish(batch, None, exc)
        except BaseException:
            self._next()
            raise
        else:
            self._finish(batch, results, None)

    def _finish(self, batch: list[_Entry], results: Any, error: BaseException | None) -> None:
        """On the loop: start the next batch, then hand each request its result (or the batch's exception)."""
        if error is None and (not isinstance(results, (list, tuple)) or len(results) != len(batch)):
            got = f"{len(results)} results" if isinstance(results, (list, tuple)) else type(results).__name__
            error = BatchSizeMismatch(
                f"api '{self.name}': the batched predict got a list of {len(batch)} inputs and returned {got}; "
                "it must return a list of the same length"
            )
            logger.error("%s", error)
        # The next batch first: it is handed to its thread (or its task scheduled) before the requests woken
        # below, so the model starts again at once instead of after this batch's answers have been sent.
        self._next()
        if error is not None:
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(error)
            return
        for entry, result in zip(batch, results, strict=True):
            future = entry.future
            if not future.done():
                if type(result) is Failed:
                    future.set_exception(result.error)  # one request's own failure (see `Failed`)
                else:
                    future.set_result(result)

    def close(self) -> None:
        if self.threads is not None:
            self.threads.close()

    def _next(self) -> None:
        self.running -= 1
        self._dispatch()


# --------------------------------------------------------------------------------------------------
# Tensor batching for model files (ONNX, TensorFlow): the feeds of concurrent requests are concatenated along
# the first dimension, the model runs once, and its outputs are cut back by each request's row count.

#: Runs the model once on feeds (``{input name: array}``) and returns its prediction.
RunFeeds = Callable[[dict[str, Any]], Awaitable[Any]]


class Failed:
    """One request's exception among the results of a batch: a bad request fails alone, not its batch.
    `Batcher.submit` raises it in that request."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def has_batch_dimension(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> bool:
    """Whether requests of a model can be stacked: every input and output has a dynamic first dimension.

    A fixed first dimension (``[2, 3]``), a scalar input or an input of unknown rank means that concatenated
    feeds would not fit the model; an output with a fixed first dimension could not be cut back into rows.
    """
    for spec in inputs:
        if not spec.shape or isinstance(spec.shape[0], int):
            return False
    for spec in outputs:
        if spec.shape is not None and (not spec.shape or isinstance(spec.shape[0], int)):
            return False
    return bool(inputs)


def rows_of(feeds: dict[str, Any]) -> int | None:
    """The number of rows every input of one request shares, or None when they disagree (or are scalars)."""
    rows = None
    for array in feeds.values():
        shape = getattr(array, "shape", ())
        if not shape:
            return None
        if rows is None:
            rows = shape[0]
        elif shape[0] != rows:
            return None
    return rows


def stack_key(feeds: dict[str, Any]) -> tuple[Any, ...]:
    """Requests with equal keys can be concatenated: same inputs, dtypes and non-batch dimensions."""
    return tuple(sorted((name, array.dtype.str, array.shape[1:]) for name, array in feeds.items()))


def stack(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The feeds of several requests (of one stack key) concatenated along the first dimension."""
    import numpy as np

    return {name: np.concatenate([feeds[name] for feeds in items]) for name in items[0]}


def split_prediction(prediction: Any, rows: list[int]) -> list[Any] | None:
    """Cut a batched prediction (a list or a dict of arrays) back into one per request of `rows` rows.

    None when an output has no batch dimension (its first dimension is not the batch's row count), in which
    case the requests must run separately.
    """
    if isinstance(prediction, dict):
        arrays = list(prediction.values())
    elif isinstance(prediction, (list, tuple)):
        arrays = list(prediction)
    else:
        return None
    total = sum(rows)
    for array in arrays:
        shape = getattr(array, "shape", ())
        if not shape or shape[0] != total:
            return None
    bounds = []
    start = 0
    for count in rows:
        bounds.append((start, start + count))
        start += count
    if isinstance(prediction, dict):
        return [{key: value[begin:end] for key, value in prediction.items()} for begin, end in bounds]
    return [[value[begin:end] for value in arrays] for begin, end in bounds]


class FeedStacker:
    """The batched call of a model file: runs a batch of per-request feeds in as few model calls as it can.

    Requests whose feeds share a `stack_key` run as one call on their concatenation; the others (different
    non-batch dimensions, inputs of unequal rows, a model without a batch dimension) run alone. Returns one
    prediction per request, or a `Failed` for a request whose call raised. A stacked call that raises is
    retried request by request, so that one bad request cannot fail the others.
    """

    def __init__(self, run: RunFeeds, *, stackable: bool, run_stacked: RunFeeds | None = None, label: str = "") -> None:
        self.run = run
        self.run_stacked = run_stacked or run
        self.stackable = stackable
        self.label = label
        #: Model calls made, calls that served more than one request, and requests served.
        self.calls = 0
        self.stacked_calls = 0
        self.requests = 0
        self._unsplittable: set[tuple[Any, ...]] = set()

    async def __call__(self, items: list[dict[str, Any]]) -> list[Any]:
        self.requests += len(items)
        if not self.stackable or len(items) == 1:
            return [await self._alone(feeds) for feeds in items]
        results: list[Any] = [None] * len(items)
        groups: dict[tuple[Any, ...], list[int]] = {}
        alone: list[int] = []
        for index, feeds in enumerate(items):
            if rows_of(feeds) is None:
                alone.append(index)
                continue
            key = stack_key(feeds)
            if key in self._unsplittable:
                alone.append(index)
            else:
                groups.setdefault(key, []).append(index)
        for key, indices in groups.items():
            if len(indices) == 1:
                alone.extend(indices)
                continue
            parts = await self._stacked(key, [items[index] for index in indices])
            if parts is None:
                alone.extend(indices)
                continue
            for index, part in zip(indices, parts, strict=True):
                results[index] = part
        for index in sorted(alone):
            results[index] = await self._alone(items[index])
        return results

    async def _alone(self, feeds: dict[str, Any]) -> Any:
        self.calls += 1
        try:
            return await self.run(feeds)
        except Exception as exc:
            return Failed(exc)

    async def _stacked(self, key: tuple[Any, ...], group: list[dict[str, Any]]) -> list[Any] | None:
        rows = [rows_of(feeds) or 0 for feeds in group]
        self.calls += 1
        self.stacked_calls += 1
        try:
            prediction = await self.run_stacked(stack(group))
        except Exception as exc:
            logger.debug(
                "%s: a stacked call of %d requests raised %r; running them one by one", self.label, len(group), exc
            )
            return None
        parts = split_prediction(prediction, rows)
        if parts is None:
            self._unsplittable.add(key)
            logger.warning(
                "%s: an output of the model has no batch dimension (its first dimension is not the number of "
                "rows); requests with inputs of this shape run one by one",
                self.label,
            )
        return parts

    def describe(self) -> dict[str, Any]:
        return {
            "stackable": self.stackable,
            "requests": self.requests,
            "model_calls": self.calls,
            "stacked_calls": self.stacked_calls,
        }


class TensorBatcher:
    """Batching for a model file: a `Batcher` whose batched call is a `FeedStacker`.

    `run` runs the feeds of one request, `run_stacked` (by default `run`) the concatenated feeds of several;
    `execution` describes where the stacked calls run (``GET /<api>``).

    ::

        batcher = TensorBatcher(run_feeds, model.inputs, model.outputs, config.batching, name="mlp")
        prediction = await batcher.run(feeds)      # this request's rows of a shared call
    """

    def __init__(
        self,
        run: RunFeeds,
        inputs: Sequence[TensorSpec],
        outputs: Sequence[TensorSpec],
        config: BatchingConfig,
        *,
        name: str,
        run_stacked: RunFeeds | None = None,
        execution: Callable[[], dict[str, Any]] | None = None,
        max_concurrency: int = 1,
        on_batch: Callable[[int, list[float]], None] | None = None,
    ) -> None:
        self.stacker = FeedStacker(
            run, stackable=has_batch_dimension(inputs, outputs), run_stacked=run_stacked, label=f"api '{name}'"
        )
        self.execution = execution
        self.batcher = Batcher(
            self.stacker,
            name=name,
            max_batch_size=config.max_batch_size,
            max_wait_ms=config.max_wait_ms,
            max_concurrency=max_concurrency,
            on_batch=on_batch,
        )
        #: ``await run(feeds)``: wait for the batch of `feeds` to run; its own prediction, or the exception
        #: its call raised.
        self.run: Callable[[dict[str, np.ndarray]], Awaitable[Any]] = self.batcher.submit

    def describe(self) -> dict[str, Any]:
        return {
            "max_batch_size": self.batcher.max_batch_size,
            "max_wait_ms": self.batcher.max_wait * 1000,
            "waiting": self.batcher.waiting,
            **self.stacker.describe(),
            "stacked_execution": self.execution() if self.execution is not None else None,
        }
