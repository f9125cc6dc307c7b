"""Dynamic batching: requests that arrive together share one model call.

Greedy: when the model is free, whatever is waiting (up to ``max_batch_size``) runs at once, and requests
that arrive while a batch runs form the next one. An idle server therefore adds no latency to a lone
request. With ``max_wait_ms`` > 0 a partial batch may wait at most that long for more requests.

A request cancelled while it waits leaves its batch; one cancelled during the call has its result dropped.

Sync batched calls run on `_threads.BatchThreads`: threads of the API's own, one per concurrency slot, started
at load and kept for the API's life (warm per-thread runtime state). The hand-over costs no loop turn: the
batch goes to its thread the moment `_dispatch` forms it, and the thread hands the results back with one
``call_soon_threadsafe``. How a model file's tensors are stacked into one call and split back is
`stacking.py`'s.

What a request costs the event loop here: a queue entry and a future, and the wake-up when its batch ends
(every future of a batch is settled in one callback, and a request's own failure, a `Failed` result, is raised
in that request alone: no coroutine of the request's own around `Batcher.submit`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from modelserve import context
from modelserve._threads import BatchThreads
from modelserve.context import current
from modelserve.errors import BatchSizeMismatch

logger = logging.getLogger("modelserve")

#: Runs one batch: a list of inputs in, a list of as many results out.
BatchCall = Callable[[list[Any]], Awaitable[list[Any]]]
#: The same, as sync code run on one of the API's `BatchThreads`.
SyncBatchCall = Callable[[list[Any]], list[Any]]


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
        #: What a waiting request is kept as, and what wraps a batch's call (None: nothing): with tracing on
        #: (`modelserve.tracing`), an entry that remembers its request's span and a batch span linked to them.
        self.entry: type[_Entry] = _Entry
        self.trace: Callable[[Batcher, list[_Entry], Any], Any] | None = None
        if context.tracing is not None:
            context.tracing.instrument_batcher(self)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def submit(self, item: Any) -> Any:
        """Wait for `item`'s batch to run and return its own result. A `Failed` result (one request's own
        failure) is raised here, as is the exception of a call that failed as a whole."""
        loop = asyncio.get_running_loop()
        entry = self.entry(item, loop.create_future(), time.perf_counter())
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

        call = self.sync_call if self.trace is None else self.trace(self, batch, self.sync_call)
        self.threads.submit(call, ([entry.item for entry in batch],), done)

    async def _run(self, batch: list[_Entry]) -> None:
        started = time.perf_counter()
        if self.on_batch is not None:
            self.on_batch(len(batch), [started - entry.arrived for entry in batch])
        assert self.call is not None
        call = self.call if self.trace is None else self.trace(self, batch, self.call)
        try:
            results = await call([entry.item for entry in batch])
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


class Failed:
    """One request's exception among the results of a batch: a bad request fails alone, not its batch.
    `Batcher.submit` raises it in that request."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error
