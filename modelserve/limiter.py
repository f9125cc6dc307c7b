"""Backpressure: at most `max_concurrency` calls run, at most `max_queue_length` wait, the rest get 503."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from modelserve.errors import QueueFull


class Limiter:
    """A FIFO semaphore with a bounded waiting line.

    The fast path (a free slot, nobody waiting) neither allocates nor suspends. A released slot is handed
    straight to the oldest waiter, so that a newcomer cannot overtake the queue.
    """

    __slots__ = ("max_concurrency", "max_queue_length", "running", "_waiters", "rejected", "on_release")

    def __init__(self, max_concurrency: int, max_queue_length: int) -> None:
        self.max_concurrency = max_concurrency
        self.max_queue_length = max_queue_length
        self.running = 0
        self.rejected = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        #: Called when a slot becomes free (not when it is handed to a waiter): the jobs worker claims then.
        self.on_release: Callable[[], None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def try_acquire(self) -> bool:
        if self.running < self.max_concurrency and not self._waiters:
            self.running += 1
            return True
        return False

    async def acquire(self) -> None:
        if self.running < self.max_concurrency and not self._waiters:
            self.running += 1
            return
        if len(self._waiters) >= self.max_queue_length:
            self.rejected += 1
            raise QueueFull()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the slot was handed to us just as we were cancelled: pass it on
            else:
                try:
                    self._waiters.remove(future)
                except ValueError:
                    pass  # release() already dropped it: it skips cancelled waiters
            raise

    def release(self) -> None:
        while self._waiters:
            future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self.running -= 1
        if self.on_release is not None:
            self.on_release()
