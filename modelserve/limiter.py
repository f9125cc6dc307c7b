"""Backpressure: at most `max_concurrency` calls run, at most `max_queue_length` wait, the rest get 503.

A transport that must read a body before it can call admits the request first (`admit`): a request that
could not wait in the line, or whose body would take the bytes held by waiting requests past
`max_queued_bytes`, is refused before a byte of its body is read. An admitted request keeps its place (and
its bytes) while its body is read and decoded, and hands both over in `acquire`.
"""

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

    __slots__ = (
        "max_concurrency",
        "max_queue_length",
        "max_queued_bytes",
        "running",
        "admitted",
        "queued_bytes",
        "_waiters",
        "rejected",
        "on_release",
    )

    def __init__(self, max_concurrency: int, max_queue_length: int, max_queued_bytes: int | None = None) -> None:
        self.max_concurrency = max_concurrency
        self.max_queue_length = max_queue_length
        #: The bound on the body bytes of admitted requests that do not run yet (None: no bound).
        self.max_queued_bytes = max_queued_bytes
        self.running = 0
        #: Requests admitted that have not called `acquire` yet (their bodies are being read).
        self.admitted = 0
        #: Body bytes of the admitted requests that do not run yet.
        self.queued_bytes = 0
        self.rejected = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        #: Called when a slot becomes free (not when it is handed to a waiter): the jobs worker claims then.
        self.on_release: Callable[[], None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def admit(self, size: int = 0) -> None:
        """Take a place in the line for a request whose body of `size` bytes is still to be read (0 when not
        known yet); `QueueFull` when it could not wait. Follow with `acquire(size)`, or `unadmit(size)`."""
        if self.running + len(self._waiters) + self.admitted >= self.max_concurrency + self.max_queue_length:
            self.rejected += 1
            raise QueueFull()
        # One request alone is always admitted (max_body_size bounds it); beside others, the bytes are bounded.
        bound = self.max_queued_bytes
        if bound is not None and self.queued_bytes and self.queued_bytes + size > bound:
            self.rejected += 1
            raise QueueFull(
                f"the requests waiting for this API hold too many bytes (max_queued_bytes {self.max_queued_bytes});"
                " retry later"
            )
        self.admitted += 1
        self.queued_bytes += size

    def unadmit(self, size: int = 0) -> None:
        """An admitted request leaves before `acquire` (its body was refused, or its client left)."""
        self.admitted -= 1
        self.queued_bytes -= size

    def try_acquire(self) -> bool:
        if self.running < self.max_concurrency and not self._waiters:
            self.running += 1
            return True
        return False

    async def acquire(self, admitted: int | None = None) -> None:
        """Wait for a slot. `admitted` is the size given to `admit` (None for a request never admitted, which
        is refused with `QueueFull` when the line is full)."""
        if admitted is not None:
            self.admitted -= 1
        if self.running < self.max_concurrency and not self._waiters:
            self.running += 1
            if admitted:
                self.queued_bytes -= admitted
            return
        if admitted is None and len(self._waiters) >= self.max_queue_length:
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
        finally:
            if admitted:
                self.queued_bytes -= admitted

    def release(self) -> None:
        while self._waiters:
            future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self.running -= 1
        if self.on_release is not None:
            self.on_release()
