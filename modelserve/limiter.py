"""Backpressure: at most `max_concurrency` calls run, at most `max_queue_length` wait, the rest get 503.

A transport that must read a body before it can call admits the request first (`admit`): a request that
could not wait in the line, or whose body would take the bytes held by waiting requests past
`max_queued_bytes`, is refused before a byte of its body is read. An admitted request keeps its place (and
its bytes) while its body is read and decoded, and hands both over in `acquire` (or `run`).

A call whose work is all sync user code waits with `run`: its work waits in the line itself, and a worker
thread that finishes a call starts the next waiting one at once, in the same thread, without a turn of the
event loop. Under overload a loop turn is long (every connection that is ready gets its turn, every refusal
costs loop time): with 150 keep-alive clients flooding a 50 ms API, handing the slot over through the loop
(the result comes back to the loop, the slot is released there, the next waiter wakes a turn later and only
then hops to a thread) cost 15-25 ms per call, a third of the API's capacity (`benchmarks/overload.py`).

A waiter may be refused when its turn comes (`max_queue_wait`): after a fixed number of seconds, or, by
default (`AUTO`), when it has waited longer than the full line's calls take (`max_queue_length` calls of the
measured call time, `max_concurrency` at a time) while newcomers were being refused, and a younger request
waits behind it. A full FIFO line makes every accepted request wait the whole line plus what each hand-over
loses (a loop turn each, under a flood); the default bounds the wait by the calls themselves, and refuses
only when the API is refusing requests anyway and the slot goes on at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from modelserve import _threads
from modelserve.errors import QueueFull

#: The work of a `run` call: runs in a worker thread holding the slot; returns (result, keep), keep True
#: when the caller keeps the slot (a generator result: the stream gives it back) instead of the thread.
Work = Callable[[], "tuple[Any, bool]"]

#: `max_queue_wait`'s default: refuse a waiter that waited longer than the full line takes to go through.
AUTO = "auto"


class _Turn:
    """A `run` call's place in the line: its work, run by whichever thread hands it the slot."""

    __slots__ = ("work", "size", "since", "context", "future", "loop")

    def __init__(self, work: Work, size: int, loop: asyncio.AbstractEventLoop, since: float | None) -> None:
        self.work = work
        #: The body bytes it holds while it waits (counted in `Limiter.queued_bytes`).
        self.size = size
        self.since = time.monotonic() if since is None else since
        self.context = contextvars.copy_context()
        self.loop = loop
        self.future: asyncio.Future[tuple[Any, bool]] = loop.create_future()


class _Waiter(asyncio.Future):  # type: ignore[type-arg]
    """An `acquire` call's place in the line: a future that knows since when it waits."""

    def __init__(self, loop: asyncio.AbstractEventLoop, since: float | None) -> None:
        super().__init__(loop=loop)
        self.since = time.monotonic() if since is None else since


class Limiter:
    """A FIFO semaphore with a bounded waiting line, shared by the event loop and the worker threads.

    The fast path (a free slot, nobody waiting) neither allocates nor suspends. A released slot is handed
    straight to the oldest waiter, so that a newcomer cannot overtake the queue. The counters and the line
    are guarded by a lock held for a few instructions, because a worker thread hands its slot over itself.
    """

    __slots__ = (
        "max_concurrency",
        "max_queue_length",
        "max_queued_bytes",
        "running",
        "admitted",
        "queued_bytes",
        "_waiters",
        "_lock",
        "rejected",
        "on_release",
        "max_queue_wait",
        "_workers",
        "_call",
        "_refused_at",
    )

    def __init__(
        self,
        max_concurrency: int,
        max_queue_length: int,
        max_queued_bytes: int | None = None,
        max_queue_wait: float | str | None = None,
    ) -> None:
        self.max_concurrency = max_concurrency
        self.max_queue_length = max_queue_length
        #: A waiter whose turn comes after waiting longer than this (seconds) is refused instead (None: never;
        #: `AUTO`: longer than the full line takes, see the module's text).
        self.max_queue_wait = max_queue_wait
        #: Seconds a call holds its slot, a moving average of the calls that end while requests wait (0.0 until
        #: measured), and when a request was last refused because the line was full.
        self._call = 0.0
        self._refused_at = 0.0
        #: The bound on the body bytes of admitted requests that do not run yet (None: no bound).
        self.max_queued_bytes = max_queued_bytes
        self.running = 0
        #: Requests admitted that have not called `acquire` yet (their bodies are being read).
        self.admitted = 0
        #: Body bytes of the admitted requests that do not run yet.
        self.queued_bytes = 0
        self.rejected = 0
        #: Waiting calls, oldest first: a `_Waiter` (`acquire`) or a `_Turn` (`run`).
        self._waiters: deque[_Waiter | _Turn] = deque()
        self._lock = threading.Lock()
        #: Worker threads running turns (`_run_turns`). Only they change the limiter off the loop, and only the
        #: loop starts them: while there is none, the loop skips the lock (measured: 0.5 us of every request).
        self._workers = 0
        #: Called on the event loop when a slot becomes free (not when it is handed to a waiter): the jobs
        #: worker claims then.
        self.on_release: Callable[[], None] | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def admit(self, size: int = 0) -> None:
        """Take a place in the line for a request whose body of `size` bytes is still to be read (0 when not
        known yet); `QueueFull` when it could not wait. Follow with `acquire(size)`, or `unadmit(size)`."""
        if self._workers:
            with self._lock:
                self._admit(size)
        elif not self.queued_bytes and self.running + len(self._waiters) + self.admitted < self.max_concurrency:
            self.admitted += 1  # a free slot and no bytes held: `_admit`, written out for the usual request
            self.queued_bytes = size
        else:
            self._admit(size)

    def _admit(self, size: int) -> None:
        if self.running + len(self._waiters) + self.admitted >= self.max_concurrency + self.max_queue_length:
            raise self._full()
        # One request alone is always admitted (max_body_size bounds it); beside others, the bytes are bounded.
        bound = self.max_queued_bytes
        if bound is not None and self.queued_bytes and self.queued_bytes + size > bound:
            self.rejected += 1
            raise QueueFull(
                "the requests waiting for this API hold too many bytes"
                f" (max_queued_bytes {self.max_queued_bytes}); retry later"
            )
        self.admitted += 1
        self.queued_bytes += size

    def count(self, size: int) -> None:
        """Count `size` more bytes for an admitted request whose body's size was not known when it was admitted
        (a chunked body, once read): pass the sum on to `acquire`, `run` or `unadmit`."""
        if self._workers:
            with self._lock:
                self.queued_bytes += size
        else:
            self.queued_bytes += size

    def unadmit(self, size: int = 0) -> None:
        """An admitted request leaves before `acquire` (its body was refused, or its client left)."""
        with self._lock:
            self.admitted -= 1
            self.queued_bytes -= size

    def try_acquire(self) -> bool:
        with self._lock:
            if self.running < self.max_concurrency and not self._waiters:
                self.running += 1
                return True
            return False

    def _enter(self, admitted: int | None) -> bool:
        """Under the lock: True when the caller takes a free slot now; `QueueFull` when it may not wait."""
        if admitted is not None:
            self.admitted -= 1
        if self.running < self.max_concurrency and not self._waiters:
            self.running += 1
            if admitted:
                self.queued_bytes -= admitted
            return True
        if admitted is None and len(self._waiters) >= self.max_queue_length:
            raise self._full()
        return False

    def _full(self) -> QueueFull:
        self.rejected += 1
        self._refused_at = time.monotonic()
        return QueueFull()

    def enter_now(self, admitted: int | None = None) -> bool:
        """Take a free slot without waiting when nobody waits for one (True); else `acquire` must wait.
        `admitted` as in `acquire`."""
        if self._workers:
            with self._lock:
                if self.running >= self.max_concurrency or self._waiters:
                    return False
                return self._enter(admitted)
        if self.running >= self.max_concurrency or self._waiters:
            return False
        if admitted is not None:
            self.admitted -= 1
            self.queued_bytes -= admitted
        self.running += 1
        return True

    async def acquire(self, admitted: int | None = None, since: float | None = None) -> None:
        """Wait for a slot. `admitted` is the size given to `admit` (None for a request never admitted, which
        is refused with `QueueFull` when the line is full); `since`, the `time.monotonic()` from which the
        request counts as waiting when it began to wait before it could be read (default: now)."""
        if self._workers:
            with self._lock:
                if self._enter(admitted):
                    return
                future = _Waiter(asyncio.get_running_loop(), since)
                self._waiters.append(future)
        else:
            if self._enter(admitted):
                return
            future = _Waiter(asyncio.get_running_loop(), since)
            self._waiters.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release()  # the slot was handed to us just as we were cancelled: pass it on
            else:
                self._drop(future)  # still waiting; or a thread is handing it over, and `_hand` passes it on
            raise
        finally:
            if admitted:
                with self._lock:
                    self.queued_bytes -= admitted

    async def run(self, work: Work, admitted: int | None = None, since: float | None = None) -> tuple[Any, bool]:
        """Run `work` in a worker thread once a slot is free, and return what it returned (`admitted` and
        `since` as in `acquire`).

        The thread gives the slot back as soon as `work` has returned (unless it said to keep it: then the
        caller releases it), and runs the next waiting `run` call's work at once. When the caller is cancelled
        it stops waiting; work that had started runs on and keeps its slot until it returns.
        """
        loop = asyncio.get_running_loop()
        turn = _Turn(work, admitted or 0, loop, since)
        with self._lock:
            now = self._enter(admitted)
            if now:
                self._workers += 1
            else:
                self._waiters.append(turn)
        if now:
            _threads.submit(self._run_turns, turn, False)
        try:
            return await turn.future
        except asyncio.CancelledError:
            future = turn.future
            if future.done() and not future.cancelled():
                if future.exception() is None and future.result()[1]:
                    self.release()  # the work kept the slot for us just as we were cancelled
            else:
                self._drop(turn)  # when a thread took it, the thread gives the slot back after the work
            raise

    def _drop(self, waiter: _Waiter | _Turn) -> None:
        with self._lock:
            try:
                self._waiters.remove(waiter)
            except ValueError:
                return
            if isinstance(waiter, _Turn):
                self.queued_bytes -= waiter.size

    def _run_turns(self, turn: _Turn | None, waited: bool) -> None:
        """In a worker thread holding a slot: run `turn`'s work, then the work the slot is handed to next.
        Only calls that waited for their slot are timed (as on the loop, where a free slot costs no clock)."""
        while turn is not None:
            ok, keep = True, False
            value: Any
            began = time.monotonic() if waited else 0.0
            waited = True
            try:
                value = turn.context.run(turn.work)
                keep = value[1]
            except BaseException as exc:  # noqa: B036 - the caller re-raises it
                ok, value = False, exc
            loop, future = turn.loop, turn.future
            # The slot is given back before the caller learns the outcome: a call that returned has its slot back.
            turn = None if keep else self._next(loop, began)
            loop.call_soon_threadsafe(self._deliver, future, ok, value)
        with self._lock:
            self._workers -= 1

    def _deliver(self, future: asyncio.Future[tuple[Any, bool]], ok: bool, value: Any) -> None:
        """On the loop: a `run` call's outcome to its caller."""
        if not future.done():
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)
        elif ok and value[1]:
            self.release()  # the caller left before it could take the slot its work kept

    def _next(self, loop: asyncio.AbstractEventLoop, began: float) -> _Turn | None:
        """Give a slot back from a worker thread (its call began at `began`): the next `run` call's turn to run
        in this thread, if any."""
        with self._lock:
            if began and self._waiters:
                self._measure(time.monotonic() - began)
            while self._waiters:
                waiter = self._waiters.popleft()
                if isinstance(waiter, _Turn):
                    self.queued_bytes -= waiter.size
                    late = self._too_late(waiter)
                    if late is not None:
                        loop.call_soon_threadsafe(self._deliver, waiter.future, False, late)
                        continue
                    return waiter
                late = self._too_late(waiter)
                if late is not None:
                    loop.call_soon_threadsafe(self._refuse, waiter, late)
                    continue
                loop.call_soon_threadsafe(self._hand, waiter)
                return None
            self.running -= 1
        if self.on_release is not None:
            loop.call_soon_threadsafe(self.on_release)
        return None

    def _measure(self, held: float) -> None:
        """Under the lock, a call that held its slot `held` seconds ended while requests wait."""
        self._call = held if not self._call else self._call + 0.2 * (held - self._call)

    def _too_late(self, waiter: _Waiter | _Turn) -> QueueFull | None:
        """Under the lock, `waiter` just taken from the line for a slot: its refusal when it waited too long
        (the slot goes on to the next), else None."""
        bound = self.max_queue_wait
        if bound is None:
            return None
        waited = time.monotonic() - waiter.since
        if not isinstance(bound, str):
            if waited <= bound:
                return None
            self.rejected += 1
            return QueueFull(f"waited longer than this API's max_queue_wait of {bound:g} s; retry later")
        # AUTO: only while newcomers are refused, and with someone behind to take the slot at once
        if not self._waiters or self._refused_at < waiter.since or not self._call:
            return None
        through = self.max_queue_length * self._call / self.max_concurrency
        if waited <= through:
            return None
        self.rejected += 1
        return QueueFull(
            f"waited {waited:.3g} s, longer than the calls of this API's full line take ({self.max_queue_length}"
            f" x {self._call * 1000:.3g} ms / max_concurrency {self.max_concurrency}); retry later"
        )

    def _refuse(self, future: _Waiter, late: QueueFull) -> None:
        """On the loop: refuse an `acquire` waiter a thread found too late (unless it has left already)."""
        if not future.done():
            future.set_exception(late)

    def _hand(self, future: _Waiter) -> None:
        """On the loop: give a slot a thread released to `future`'s waiter, or on if it has left."""
        if future.done():
            self.release()
        else:
            future.set_result(None)

    def release(self, began: float = 0.0) -> None:
        """Give a slot back (on the event loop); `began`, when known, is the `time.monotonic()` at which the call
        that held it began."""
        if self._workers:
            with self._lock:
                handed = self._release(began)
        elif not self._waiters:
            self.running -= 1  # `_release`, written out for the usual request: nobody waiting
            handed = None
        else:
            handed = self._release(began)
        if isinstance(handed, _Turn):
            _threads.submit(self._run_turns, handed, True)
        elif handed is None and self.on_release is not None:
            self.on_release()

    def _release(self, began: float = 0.0) -> _Turn | bool | None:
        """`release` under the lock (or with no thread running turns): the turn to start in a thread (counted in
        `_workers`), True when a waiting `acquire` got the slot, None when the slot is free."""
        if began and self._waiters:
            self._measure(time.monotonic() - began)
        while self._waiters:
            waiter = self._waiters.popleft()
            if isinstance(waiter, _Turn):
                self.queued_bytes -= waiter.size
                late = self._too_late(waiter)
                if late is not None:
                    self._deliver(waiter.future, False, late)
                    continue
                self._workers += 1
                return waiter
            if not waiter.done():
                late = self._too_late(waiter)
                if late is not None:
                    waiter.set_exception(late)
                    continue
                waiter.set_result(None)
                return True
        self.running -= 1
        return None
