"""`modelserve.watch` on a virtual clock: deadlines, the caller's cancellation, the subscription, the watchdog.

Every test runs on `VirtualTimeLoop`, an event loop whose clock moves only when the loop has nothing ready
to do (then it jumps to its next timer). The watchdog's ticks, deadlines and ``asyncio.sleep`` therefore take
no real time, and a test can say exactly when something happened ("at the deadline, at most one tick late")
without reading a wall clock.
"""

from __future__ import annotations

import asyncio
import contextvars
import selectors
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import pytest

from modelserve.context import RequestContext
from modelserve.watch import LINGER, Subscribable, Watch, Watchdog

T = TypeVar("T")

WATCH_AFTER = 0.01
TICK = 0.005
#: Float sums of ticks are not exact: "at most one tick late" allows this much more.
EPSILON = 1e-9


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on a virtual clock: when it would wait for its next timer, the clock jumps there instead."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[Callable[..., Any]] = []
        loop = self

        class Selector(selectors.DefaultSelector):
            def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
                ready: list[tuple[selectors.SelectorKey, int]] = super().select(None if timeout is None else 0)
                if not ready and timeout:
                    loop.now += timeout
                return ready

        super().__init__(Selector())

    def time(self) -> float:
        return self.now

    def call_later(  # type: ignore[override]  # typeshed's TypeVarTuple signature, recorded as is
        self, delay: float, callback: Callable[..., object], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.TimerHandle:
        self.timers.append(callback)
        return super().call_later(delay, callback, *args, context=context)


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def now() -> float:
    return asyncio.get_running_loop().time()


async def bounded(awaitable: Awaitable[T]) -> T:
    """`awaitable`, failing the test (in virtual time) if it never completes."""
    return await asyncio.wait_for(awaitable, 60)


def watchdog() -> Watchdog:
    return Watchdog(watch_after=WATCH_AFTER, tick=TICK)


class Call:
    """A task under a `Watch`, the way `Api.call` runs user code: the watch is made inside the task, the user
    code "runs" until `finish`, and the watch is disarmed before the answer."""

    def __init__(
        self,
        dog: Watchdog,
        cancelled: Callable[[], Awaitable[Any]] | None = None,
        timeout: float | None = None,
        notify: bool = False,
    ) -> None:
        self.ctx = RequestContext("m", "r1")
        self.done = asyncio.Event()
        self.outcome: str | None = None
        self.ended_at: float | None = None
        self._made = asyncio.Event()
        self._watch: Watch | None = None
        self.task = asyncio.ensure_future(self._run(dog, cancelled, timeout, notify))

    @classmethod
    async def start(cls, dog: Watchdog, **options: Any) -> Call:
        call = cls(dog, **options)
        await call._made.wait()
        return call

    @property
    def watch(self) -> Watch:
        assert self._watch is not None
        return self._watch

    def finish(self) -> None:
        self.done.set()

    async def ended(self) -> str | None:
        await bounded(asyncio.shield(self.task))
        return self.outcome

    async def _run(
        self, dog: Watchdog, cancelled: Callable[[], Awaitable[Any]] | None, timeout: float | None, notify: bool
    ) -> None:
        self._watch = watch = Watch(dog, self.ctx, cancelled, timeout, notify)
        self._made.set()
        try:
            await self.done.wait()
            self.outcome = "answered"
        except asyncio.CancelledError:
            self.outcome = "cancelled"
            watch.absorb_cancel()
        finally:
            self.ended_at = now()
            watch.disarm()


class Transport:
    """A `Subscribable` caller's cancellation, as modelserve's HTTP protocol offers one."""

    def __init__(self, can_tell: bool = True) -> None:
        self.can_tell = can_tell
        self.callbacks: list[Callable[[], None]] = []
        self.unsubscribed = 0
        self.awaited = 0
        self._gone = asyncio.Event()

    def __call__(self) -> Awaitable[Any]:
        self.awaited += 1
        return self._wait()

    async def _wait(self) -> str:
        await self._gone.wait()
        return "disconnect"

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        if not self.can_tell:
            return None
        self.callbacks.append(callback)
        return self._unsubscribe

    def _unsubscribe(self) -> None:
        self.unsubscribed += 1

    def lose_client(self) -> None:
        """The transport saw the connection go."""
        self._gone.set()
        for callback in self.callbacks:
            callback()


async def came_of_age(call: Call) -> float:
    """Wait (virtual time) until the watch watches its caller; how old the call was then."""
    while not call.watch.watching:
        await asyncio.sleep(TICK / 5)
    return now() - call.watch.started


def test_a_transport_of_this_file_is_a_subscribable() -> None:
    async def main() -> None:
        transport: Subscribable = Transport()
        assert callable(transport.subscribe)

    run(main)


# -------------------------------------------------------------------------------------------------
# deadlines


def test_a_call_past_its_deadline_is_cancelled_at_most_one_tick_late() -> None:
    async def main() -> None:
        call = await Call.start(watchdog(), timeout=1.0)
        assert await call.ended() == "cancelled"
        assert call.watch.deadline is not None and call.ended_at is not None
        assert call.watch.deadline <= call.ended_at <= call.watch.deadline + TICK + EPSILON
        assert call.ctx.cancelled and call.ctx.reason == "timeout"
        assert call.watch.fired and not call.watch.armed

    run(main)


def test_a_call_that_answers_before_its_deadline_is_never_cancelled() -> None:
    async def main() -> None:
        dog = watchdog()
        call = await Call.start(dog, timeout=1.0)
        await asyncio.sleep(0.5)
        call.finish()
        assert await call.ended() == "answered"
        await asyncio.sleep(2.0)  # well past the deadline it had
        assert not call.ctx.cancelled and not call.watch.fired
        assert dog.active == 0

    run(main)


def test_deadlines_expire_in_their_order_each_at_most_one_tick_late() -> None:
    async def main() -> None:
        dog = watchdog()
        calls = [await Call.start(dog, timeout=timeout) for timeout in (0.3, 0.1, 0.2)]
        endless = await Call.start(dog)
        await asyncio.gather(*(call.ended() for call in calls))
        ends = [call.ended_at for call in calls]
        assert sorted(range(3), key=lambda n: ends[n] or 0) == [1, 2, 0]
        for call in calls:
            assert call.watch.deadline is not None and call.ended_at is not None
            assert call.watch.deadline <= call.ended_at <= call.watch.deadline + TICK + EPSILON
        assert endless.outcome is None and dog.active == 1
        endless.finish()
        assert await endless.ended() == "answered"

    run(main)


def test_an_absorbed_timeout_lets_the_call_go_on_to_answer() -> None:
    async def main() -> None:
        context = RequestContext("m", "r1")

        async def handler() -> str:
            watch = Watch(watchdog(), context, None, 0.1)
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                watch.absorb_cancel()
            finally:
                watch.disarm()
            await asyncio.sleep(1)  # answering (a 504) takes awaits of its own
            cancelling = getattr(asyncio.current_task(), "cancelling", None)  # Python >= 3.11
            assert cancelling is None or cancelling() == 0
            return "answered"

        assert await bounded(handler()) == "answered"
        assert context.reason == "timeout"

    run(main)


# -------------------------------------------------------------------------------------------------
# the caller's cancellation, awaited


def test_a_short_call_never_looks_at_its_caller() -> None:
    async def main() -> None:
        transport = Transport()
        call = await Call.start(watchdog(), cancelled=transport)
        await asyncio.sleep(WATCH_AFTER / 2)
        call.finish()
        assert await call.ended() == "answered"
        await asyncio.sleep(1.0)
        assert (transport.awaited, transport.callbacks) == (0, [])

    run(main)


@pytest.mark.parametrize(
    ("reason", "expected"), [("disconnect", "disconnect"), ("deleted", "deleted"), (True, "disconnect")]
)
def test_a_long_call_is_cancelled_when_the_cancelled_awaitable_completes(reason: Any, expected: str) -> None:
    async def main() -> None:
        gone = asyncio.Event()

        async def cancelled() -> Any:
            await gone.wait()
            return reason

        call = await Call.start(watchdog(), cancelled=cancelled)
        age = await came_of_age(call)
        assert WATCH_AFTER <= age <= WATCH_AFTER + TICK + EPSILON
        assert call.outcome is None
        gone.set()
        assert await call.ended() == "cancelled"
        assert call.ctx.reason == expected and call.watch.fired

    run(main)


def test_a_call_without_a_cancelled_awaitable_watches_nothing() -> None:
    async def main() -> None:
        call = await Call.start(watchdog())
        await asyncio.sleep(1.0)
        call.watch.watch_now()
        assert not call.watch.watching
        call.finish()
        assert await call.ended() == "answered"

    run(main)


# -------------------------------------------------------------------------------------------------
# the subscription: a transport that calls back


def test_a_transport_that_calls_back_is_subscribed_to_not_awaited() -> None:
    async def main() -> None:
        dog = watchdog()
        transport = Transport()
        call = await Call.start(dog, cancelled=transport)
        assert transport.callbacks == []
        age = await came_of_age(call)
        assert WATCH_AFTER <= age <= WATCH_AFTER + TICK + EPSILON
        assert len(transport.callbacks) == 1 and transport.awaited == 0
        transport.lose_client()
        assert await call.ended() == "cancelled"
        assert call.ctx.reason == "disconnect" and call.watch.fired
        assert transport.unsubscribed == 0  # the callback was spent: nothing to take back
        assert dog.active == 0

    run(main)


def test_a_call_that_ends_first_takes_its_callback_back_and_a_late_one_does_nothing() -> None:
    async def main() -> None:
        transport = Transport()
        call = await Call.start(watchdog(), cancelled=transport)
        await came_of_age(call)
        call.finish()
        assert await call.ended() == "answered"
        assert transport.unsubscribed == 1 and not call.watch.watching
        call.watch.disarm()
        assert transport.unsubscribed == 1
        transport.lose_client()  # a transport that calls back anyway, late
        assert not call.ctx.cancelled and not call.watch.fired

    run(main)


def test_a_transport_that_cannot_tell_is_awaited_instead() -> None:
    async def main() -> None:
        transport = Transport(can_tell=False)
        call = await Call.start(watchdog(), cancelled=transport)
        await came_of_age(call)
        assert transport.awaited == 1 and transport.callbacks == []
        transport.lose_client()
        assert await call.ended() == "cancelled"
        assert call.ctx.reason == "disconnect"

    run(main)


def test_a_stream_subscribes_at_once_and_only_once() -> None:
    async def main() -> None:
        transport = Transport()
        call = await Call.start(watchdog(), cancelled=transport)
        call.watch.watch_now()  # a stream watches its client from its first byte
        assert call.watch.watching and len(transport.callbacks) == 1
        call.watch.watch_now()
        await asyncio.sleep(1.0)  # coming of age starts no second watch
        assert len(transport.callbacks) == 1 and transport.awaited == 0
        call.finish()
        assert await call.ended() == "answered"
        assert transport.unsubscribed == 1

    run(main)


def test_a_disarmed_watch_subscribes_to_nothing() -> None:
    async def main() -> None:
        transport = Transport()
        call = await Call.start(watchdog(), cancelled=transport)
        call.finish()
        await call.ended()
        call.watch.watch_now()
        assert not call.watch.watching and transport.callbacks == [] and transport.awaited == 0

    run(main)


@pytest.mark.parametrize("can_tell", [True, False], ids=["subscribed", "awaited"])
def test_with_notify_a_lost_caller_is_told_and_the_deadline_still_holds(can_tell: bool) -> None:
    async def main() -> None:
        transport = Transport(can_tell)
        call = await Call.start(watchdog(), cancelled=transport, timeout=1.0, notify=True)
        await came_of_age(call)
        transport.lose_client()
        await asyncio.sleep(0.1)
        # Told (user code sees is_cancelled()), not cancelled: it may stop by itself.
        assert call.ctx.cancelled and call.ctx.reason == "disconnect" and call.watch.fired
        assert call.outcome is None and call.watch.armed
        assert await call.ended() == "cancelled"
        assert call.watch.deadline is not None and call.ended_at is not None
        assert call.watch.deadline <= call.ended_at <= call.watch.deadline + TICK + EPSILON

    run(main)


def test_with_notify_a_told_call_may_answer_by_itself() -> None:
    async def main() -> None:
        transport = Transport()
        call = await Call.start(watchdog(), cancelled=transport, timeout=1.0, notify=True)
        await came_of_age(call)
        transport.lose_client()
        await asyncio.sleep(0)
        assert call.ctx.cancelled
        call.finish()
        assert await call.ended() == "answered"
        await asyncio.sleep(2.0)
        assert call.outcome == "answered"

    run(main)


# -------------------------------------------------------------------------------------------------
# the watchdog


def test_the_watchdog_counts_the_calls_under_watch() -> None:
    async def main() -> None:
        dog = watchdog()
        calls = [await Call.start(dog, cancelled=Transport()) for _ in range(3)]
        assert dog.active == 3
        await came_of_age(calls[0])
        late = await Call.start(dog)
        assert dog.active == 4  # the young and the old alike
        for call in [*calls, late]:
            call.finish()
            await call.ended()
        assert dog.active == 0

    run(main)


def test_an_idle_watchdog_lingers_a_few_ticks_then_stops_and_a_new_call_starts_it_again() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop)
        dog = watchdog()

        def ticks() -> int:
            return sum(getattr(timer, "__self__", None) is dog for timer in loop.timers)

        call = await Call.start(dog)
        call.finish()
        await call.ended()
        idle_from = ticks()
        await asyncio.sleep((LINGER + 10) * TICK)
        assert ticks() - idle_from == LINGER  # then no timer: an idle server does not tick
        await asyncio.sleep(1.0)
        assert ticks() - idle_from == LINGER

        again = await Call.start(dog, timeout=0.05)
        assert await again.ended() == "cancelled"
        assert again.watch.deadline is not None and again.ended_at is not None
        assert again.ended_at <= again.watch.deadline + TICK + EPSILON

    run(main)


def test_a_watchdog_moved_to_a_new_event_loop_ticks_there() -> None:
    dog = watchdog()

    async def first() -> None:
        call = await Call.start(dog)
        call.finish()
        await call.ended()  # the loop closes with the watchdog's next tick still scheduled on it

    async def second() -> str | None:
        call = await Call.start(dog, timeout=0.05)
        return await call.ended()

    run(first)
    assert run(second) == "cancelled"
