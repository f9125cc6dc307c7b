"""Watching calls: cancel one when its timeout passes or its caller stops wanting the answer.

A per-call timer costs more than a small model's whole request, so one `Watchdog` per API ticks every few
milliseconds while calls are in flight and looks after all of them: it expires the ones past their deadline
and, for those running longer than `WATCH_AFTER`, starts a task that awaits the caller's `cancelled`
awaitable (an HTTP client's disconnect, a job's DELETE: the transport decides what it means). Short calls
never pay for a watcher task; a cancellation or a timeout is noticed at most one tick (`TICK`) late.

A transport that learns of a lost client by itself offers ``cancelled.subscribe(callback)`` (`Subscribable`):
then a long call registers a callback instead of starting a task that waits on the connection. modelserve's
HTTP protocol does (`modelserve.http._protocol`): under load, when most calls outlast `WATCH_AFTER`, a task
per request was a tenth of a batched request's cost.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from modelserve.context import RequestContext

#: A request running longer than this starts watching its connection.
WATCH_AFTER = 0.01
#: How often the watchdog looks at the requests in flight.
TICK = 0.005
#: Ticks the watchdog goes on for with no request in flight before it stops: a server answering one request
#: at a time then does not start a timer for each of them.
LINGER = 20


class Subscribable(Protocol):
    """A `cancelled` awaitable whose transport can also call back when the caller is gone."""

    def __call__(self) -> Awaitable[Any]: ...

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        """Call `callback` once when the caller is gone; returns what undoes that, or None when the transport
        cannot tell (then the awaitable is awaited)."""


class Watch:
    """One call under watch: cancels the call's task on timeout or when `cancelled()` completes.

    With `notify`, a completed `cancelled()` only marks the request context cancelled (user code sees it
    through ``is_cancelled()`` or ``await request.is_disconnected()`` and stops by itself); the deadline
    still cancels the task.
    """

    __slots__ = (
        "ctx",
        "task",
        "cancelled",
        "notify",
        "armed",
        "started",
        "deadline",
        "watchdog",
        "fired",
        "_watcher",
        "_unsubscribe",
        "_registry",
    )

    def __init__(
        self,
        watchdog: Watchdog,
        ctx: RequestContext,
        cancelled: Callable[[], Awaitable[Any]] | None,
        timeout: float | None,
        notify: bool = False,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.ctx = ctx
        self.task = asyncio.current_task(loop)
        self.cancelled = cancelled
        self.notify = notify
        self.armed = True
        #: Whether this watch cancelled the call (or, with `notify`, told it to stop).
        self.fired = False
        self.watchdog = watchdog
        self._watcher: asyncio.Task[None] | None = None
        self._unsubscribe: Callable[[], None] | None = None
        # Registered here rather than through a Watchdog method: this runs on every call.
        self.started = started = loop.time()
        self._registry = young = watchdog.young
        young[self] = None
        if timeout is None:
            self.deadline = None
        else:
            self.deadline = deadline = started + timeout
            if deadline < watchdog.next_deadline:
                watchdog.next_deadline = deadline
        if watchdog._handle is None or watchdog._loop is not loop:
            watchdog.start(loop)

    def _fire(self, reason: str) -> None:
        if not self.armed or self.task is None:
            return
        self.fired = True
        self.ctx.cancel(reason)
        if self.notify and reason != "timeout":
            return  # the deadline still holds: stay armed
        self.armed = False
        self.watchdog.discard(self)
        self.task.cancel()

    def expire(self) -> None:
        self._fire("timeout")

    def watch_now(self) -> None:
        """Start waiting for the caller's cancellation (at once for streams, else from the watchdog)."""
        if self.watching or not self.armed or self.cancelled is None:
            return
        subscribe = getattr(self.cancelled, "subscribe", None)
        if subscribe is not None:
            self._unsubscribe = subscribe(self._gone)
            if self._unsubscribe is not None:
                return
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    @property
    def watching(self) -> bool:
        return self._watcher is not None or self._unsubscribe is not None

    def _gone(self) -> None:
        self._unsubscribe = None
        self._fire("disconnect")

    async def _watch(self) -> None:
        assert self.cancelled is not None
        reason = await self.cancelled()
        self._fire(reason if isinstance(reason, str) else "disconnect")

    def disarm(self) -> None:
        """Stop watching; call it before the final answer is sent (the server reports the end of a response
        to a waiting receive() as a disconnect)."""
        if self.armed:
            self.armed = False
            self._registry.pop(self, None)
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        elif self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def absorb_cancel(self) -> None:
        """Undo our own `task.cancel()` so that the task can go on to answer."""
        # Task.cancelling() and uncancel() came with Python 3.11; before, a cancelled task stays cancellable.
        cancelling = getattr(self.task, "cancelling", None)
        if cancelling is not None and cancelling():
            getattr(self.task, "uncancel")()  # noqa: B009


class Watchdog:
    """Ticks every `TICK` seconds while any request is in flight.

    The watches in flight are kept in two dicts in the order they started: `young`, not yet `watch_after`
    old, and `old`. A tick moves the young ones that came of age (starting their watch) and stops at the
    first that has not: it never walks the calls it has already looked after, which under load are most of
    them. Deadlines are looked at only once the earliest one known may have passed.
    """

    def __init__(self, watch_after: float = WATCH_AFTER, tick: float = TICK) -> None:
        self.watch_after = watch_after
        self.tick = tick
        self.young: dict[Watch, None] = {}
        self.old: dict[Watch, None] = {}
        #: No deadline is earlier than this (it may be earlier than every deadline still in flight).
        self.next_deadline = math.inf
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle = 0

    @property
    def active(self) -> int:
        """How many calls are under watch."""
        return len(self.young) + len(self.old)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Tick on `loop` (a new event loop, as in tests, forgets the handle of the old one)."""
        self._loop = loop
        self._handle = loop.call_later(self.tick, self._tick)

    def discard(self, watch: Watch) -> None:
        watch._registry.pop(watch, None)

    def _expire(self, now: float) -> None:
        earliest = math.inf
        for registry in (self.young, self.old):
            for watch in list(registry):
                deadline = watch.deadline
                if deadline is None:
                    continue
                if now >= deadline:
                    watch.expire()
                elif deadline < earliest:
                    earliest = deadline
        self.next_deadline = earliest

    def _tick(self) -> None:
        self._handle = None
        assert self._loop is not None
        now = self._loop.time()
        if now >= self.next_deadline:
            self._expire(now)
        watch_before = now - self.watch_after
        young, old = self.young, self.old
        while young:
            watch = next(iter(young))
            if watch.started > watch_before:
                break
            del young[watch]
            old[watch] = None
            watch._registry = old
            if watch.cancelled is not None:
                watch.watch_now()
        if young or old:
            self._idle = 0
        elif self._idle < LINGER:
            self._idle += 1
        else:
            self._idle = 0
            return
        self._handle = self._loop.call_later(self.tick, self._tick)
