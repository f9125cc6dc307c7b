"""Dynamic batching: requests that arrive together share one model call.

Greedy: when the model is free, whatever is waiting (up to ``max_batch_size``) runs at once, and requests
that arrive while a batch runs form the next one. An idle server therefore adds no latency to a lone
request. With ``max_wait_ms`` > 0 a partial batch may wait at most that long for more requests.

A request cancelled while it waits leaves its batch; one cancelled during the call has its result dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger("modelserve")

#: Runs one batch: a list of inputs in, a list of as many results out.
BatchCall = Callable[[list[Any]], Awaitable[list[Any]]]


class BatchSizeMismatch(ValueError):
    """The batched call returned a list of another length than its input."""


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
        call: BatchCall,
        *,
        name: str,
        max_batch_size: int,
        max_wait_ms: float = 0.0,
        max_concurrency: int = 1,
        on_batch: Callable[[int, list[float]], None] | None = None,
    ) -> None:
        self.call = call
        self.name = name
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000.0
        self.max_concurrency = max_concurrency
        self.on_batch = on_batch
        self.running = 0
        self._queue: deque[_Entry] = deque()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def submit(self, item: Any) -> Any:
        """Wait for `item`'s batch to run and return its own result."""
        loop = asyncio.get_running_loop()
        entry = _Entry(item, loop.create_future(), time.perf_counter())
        self._queue.append(entry)
        self._dispatch()
        try:
            return await entry.future
        except asyncio.CancelledError:
            try:
                self._queue.remove(entry)  # still waiting: leave the batch
            except ValueError:
                pass  # already running: its result will be dropped
            raise

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
            asyncio.get_running_loop().create_task(self._run(batch))

    def _on_timer(self) -> None:
        self._timer = None
        # The oldest waiter has waited long enough: run what is there.
        saved, self.max_wait = self.max_wait, 0.0
        try:
            self._dispatch()
        finally:
            self.max_wait = saved

    async def _run(self, batch: list[_Entry]) -> None:
        started = time.perf_counter()
        if self.on_batch is not None:
            self.on_batch(len(batch), [started - entry.arrived for entry in batch])
        try:
            results = await self.call([entry.item for entry in batch])
            if not isinstance(results, (list, tuple)) or len(results) != len(batch):
                got = f"{len(results)} results" if isinstance(results, (list, tuple)) else type(results).__name__
                raise BatchSizeMismatch(
                    f"api '{self.name}': the batched predict got a list of {len(batch)} inputs and returned {got}; "
                    "it must return a list of the same length"
                )
        except Exception as exc:
            if isinstance(exc, BatchSizeMismatch):
                logger.error("%s", exc)
            for entry in batch:
                if not entry.future.done():
                    entry.future.set_exception(exc)
        else:
            for entry, result in zip(batch, results, strict=True):
                if not entry.future.done():
                    entry.future.set_result(result)
        finally:
            self.running -= 1
            self._dispatch()


# --------------------------------------------------------------------------------------------------
# Tensor batching for model files: per-request feeds stacked along the first dimension, outputs split back.


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
    return tuple((name, array.dtype.str, array.shape[1:]) for name, array in feeds.items())


def split_prediction(prediction: Any, bounds: list[tuple[int, int]], total: int) -> list[Any] | None:
    """Cut a batched prediction (a list or a dict of arrays) back into one per request.

    None when an output has no batch dimension (its first dimension is not the batch's row count), in which
    case the requests must run separately.
    """
    if isinstance(prediction, dict):
        arrays = list(prediction.values())
    elif isinstance(prediction, (list, tuple)):
        arrays = list(prediction)
    else:
        return None
    for array in arrays:
        shape = getattr(array, "shape", ())
        if not shape or shape[0] != total:
            return None
    if isinstance(prediction, dict):
        return [{key: value[start:end] for key, value in prediction.items()} for start, end in bounds]
    return [[value[start:end] for value in arrays] for start, end in bounds]
