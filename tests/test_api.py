"""`Api.call` (`modelserve.api`), the limiter and the watch, without HTTP: one call of an API, whatever asked.

Each test builds a `ModelServer` from a `ProjectConfig` holding one API of a handler class defined here, waits
for it to load, and calls ``api.call(value, ctx, cancelled=...)`` directly.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from modelserve.api import Api, Stream
from modelserve.config import ApiConfig, HandlerConfig, ProjectConfig
from modelserve.context import RequestContext
from modelserve.errors import ClientDisconnected, GatewayTimeout, QueueFull, ServiceUnavailable, UserCodeError
from modelserve.limiter import Limiter
from modelserve.server import ModelServer
from modelserve.watch import Watch, Watchdog

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def project_of(handler: type, **options: Any) -> ProjectConfig:
    api = ApiConfig(name="m", handler=HandlerConfig(obj=handler))
    for key, value in options.items():
        assert hasattr(api, key), key
        setattr(api, key, value)
    return ProjectConfig(root=Path.cwd(), apis=[api])


@asynccontextmanager
async def loaded(handler: type, **options: Any) -> AsyncIterator[Api]:
    """The API of `handler`, loaded; closed afterwards."""
    server = ModelServer(project_of(handler, **options))
    await server.wait_loaded()
    api = server.apis["m"]
    assert api.ready, api.error
    _servers[api] = server
    try:
        yield api
    finally:
        del _servers[api]
        await server.close()


_servers: dict[Api, ModelServer] = {}


def ctx(request_id: str = "r1") -> RequestContext:
    return RequestContext("m", request_id)


def counted(api: Api, family: str, **labels: str) -> float:
    """The value of a sample of the API's metrics (0 when it does not exist yet)."""
    metrics = _servers[api].metrics
    metrics.flush()
    value = metrics.registry.get_sample_value(family, {"api": "m", **labels})
    return value or 0.0


async def within(awaitable: Any, seconds: float = 5) -> Any:
    return await asyncio.wait_for(awaitable, seconds)


# --------------------------------------------------------------------------------------------------
# handler classes


class Echo:
    def predict(self, inputs):
        return {"echo": inputs}


class Steps:
    def preprocess(self, inputs):
        return inputs + 1

    async def predict(self, value):
        return value * 10

    def postprocess(self, value):
        return {"value": value}


class Gated:
    """Async predict that waits for the test: `started` gets each input, `gate` lets them all go."""

    started: asyncio.Queue[Any]
    gate: asyncio.Event
    cancelled: list[Any]

    @classmethod
    def reset(cls) -> None:
        cls.started, cls.gate, cls.cancelled = asyncio.Queue(), asyncio.Event(), []

    async def predict(self, inputs):
        Gated.started.put_nowait(inputs)
        try:
            await Gated.gate.wait()
        except asyncio.CancelledError:
            Gated.cancelled.append(inputs)
            raise
        return inputs


class BlockingSync:
    """Sync predict blocked on a threading.Event: a call that outlives its request."""

    entered: threading.Event
    release: threading.Event

    @classmethod
    def reset(cls) -> None:
        cls.entered, cls.release = threading.Event(), threading.Event()

    def predict(self, inputs):
        BlockingSync.entered.set()
        BlockingSync.release.wait(10)
        return "late"


class Streams:
    closed: list[str]

    def predict(self, inputs):
        return self.sync_chunks(inputs) if inputs == "sync" else self.async_chunks()

    def sync_chunks(self, inputs):
        try:
            yield "a"
            yield "b"
            yield "c"
        finally:
            Streams.closed.append("sync")

    async def async_chunks(self):
        try:
            yield {"i": 0}
            yield {"i": 1}
            yield {"i": 2}
        finally:
            Streams.closed.append("async")


class Failing:
    def predict(self, inputs):
        raise SystemExit(inputs)


class SlowLoad:
    gate: asyncio.Event

    async def load(self):
        await SlowLoad.gate.wait()

    def predict(self, inputs):
        return inputs


# --------------------------------------------------------------------------------------------------
# Api.call


async def test_call_returns_the_result_and_gives_the_slot_back() -> None:
    async with loaded(Echo) as api:
        assert await api.call({"x": 1}, ctx()) == {"echo": {"x": 1}}
        assert api.limiter.running == 0
    async with loaded(Steps) as api:
        assert await api.call(1, ctx()) == {"value": 20}
        assert api.limiter.running == 0


async def test_user_code_failing_is_a_user_code_error_naming_the_stage() -> None:
    async with loaded(Failing) as api:
        with pytest.raises(UserCodeError) as raised:
            await api.call(3, ctx())
        assert raised.value.stage == "predict"
        assert isinstance(raised.value.error, SystemExit)
        assert raised.value.detail == "predict raised SystemExit: 3"
        assert api.limiter.running == 0


async def test_service_unavailable_before_loading_and_after_a_failed_load() -> None:
    SlowLoad.gate = asyncio.Event()
    server = ModelServer(project_of(SlowLoad))
    api = server.apis["m"]
    with pytest.raises(ServiceUnavailable, match="is loading"):
        await api.call(1, ctx())
    server.start()
    with pytest.raises(ServiceUnavailable, match="is loading"):
        await api.call(1, ctx())
    SlowLoad.gate.set()
    await server.wait_loaded()
    assert await api.call(1, ctx()) == 1
    await server.close()

    class Broken:
        def load(self):
            raise RuntimeError("weights missing")

        def predict(self, inputs):
            return inputs

    failures: list[Exception] = []
    server = ModelServer(project_of(Broken), on_load_error=failures.append)
    await server.wait_loaded()
    assert len(failures) == 1
    with pytest.raises(ServiceUnavailable, match="failed to load") as raised:
        await server.apis["m"].call(1, ctx())
    assert raised.value.headers == {"retry-after": "30"}
    await server.close()


async def test_queue_full_when_the_line_is_full() -> None:
    Gated.reset()
    async with loaded(Gated, max_concurrency=1, max_queue_length=1) as api:
        running = asyncio.create_task(api.call(1, ctx("r1")))
        assert await within(Gated.started.get()) == 1
        waiting = asyncio.create_task(api.call(2, ctx("r2")))
        while api.limiter.waiting == 0:  # it reaches the line within a few turns of the loop
            await asyncio.sleep(0)
        with pytest.raises(QueueFull):
            await api.call(3, ctx("r3"))
        assert counted(api, "modelserve_queue_full_total") == 1
        Gated.gate.set()
        assert [await within(running), await within(waiting)] == [1, 2]
        assert await within(Gated.started.get()) == 2 and Gated.started.empty()  # the refused one never ran
        assert (api.limiter.running, api.limiter.waiting) == (0, 0)


async def test_gateway_timeout_past_the_timeout_cancels_the_user_code() -> None:
    Gated.reset()
    async with loaded(Gated, timeout=0.05) as api:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(GatewayTimeout, match="the call took longer than the timeout of 0.05 s"):
            await within(api.call("slow", ctx()))
        assert 0.05 <= loop.time() - started < 1
        assert Gated.cancelled == ["slow"]
        assert api.limiter.running == 0
        assert counted(api, "modelserve_requests_cancelled_total", reason="timeout") == 1
        Gated.gate.set()
        assert await api.call("quick", ctx()) == "quick"


@pytest.mark.parametrize(("reason", "expected"), [(None, "disconnect"), ("cancelled", "cancelled")])
async def test_client_disconnected_when_the_cancelled_awaitable_completes(reason: str | None, expected: str) -> None:
    Gated.reset()
    gone = asyncio.Event()

    async def cancelled() -> str | None:
        await gone.wait()
        return reason

    async with loaded(Gated) as api:
        call = asyncio.create_task(api.call("long", ctx(), cancelled=cancelled))
        assert await within(Gated.started.get()) == "long"
        assert not call.done()
        gone.set()
        with pytest.raises(ClientDisconnected, match=f"cancelled: {expected}"):
            await within(call)
        assert Gated.cancelled == ["long"]
        assert api.limiter.running == 0
        assert counted(api, "modelserve_requests_cancelled_total", reason=expected) == 1
        assert counted(api, "modelserve_requests_cancelled_total", reason="timeout") == 0


async def test_a_cancelled_awaitable_that_never_completes_costs_nothing() -> None:
    never = asyncio.Event()
    async with loaded(Echo) as api:
        for n in range(3):
            assert await api.call(n, ctx(), cancelled=never.wait) == {"echo": n}
        assert not api.watchdog.active


async def test_a_sync_stage_that_outlives_its_timeout_keeps_the_slot_until_its_thread_returns() -> None:
    BlockingSync.reset()
    async with loaded(BlockingSync, timeout=0.05, max_queue_length=0) as api:
        freed = asyncio.Event()
        api.limiter.on_release = freed.set
        with pytest.raises(GatewayTimeout):
            await within(api.call({}, ctx()))
        assert BlockingSync.entered.is_set()
        assert api.limiter.running == 1  # the thread still runs user code
        assert not freed.is_set()
        with pytest.raises(QueueFull):  # so max_concurrency 1 still holds
            await api.call({}, ctx())
        BlockingSync.release.set()
        await within(freed.wait())
        assert api.limiter.running == 0
        assert await within(api.call({}, ctx())) == "late"


async def test_a_sync_stage_whose_caller_left_keeps_the_slot_too() -> None:
    BlockingSync.reset()
    gone = asyncio.Event()
    async with loaded(BlockingSync) as api:
        freed = asyncio.Event()
        api.limiter.on_release = freed.set
        call = asyncio.create_task(api.call({}, ctx(), cancelled=gone.wait))
        await within(asyncio.to_thread(BlockingSync.entered.wait, 5))
        gone.set()
        with pytest.raises(ClientDisconnected):
            await within(call)
        assert api.limiter.running == 1 and not freed.is_set()
        BlockingSync.release.set()
        await within(freed.wait())
        assert api.limiter.running == 0


@pytest.mark.parametrize(("kind", "chunks"), [("sync", ["a", "b", "c"]), ("async", [{"i": 0}, {"i": 1}, {"i": 2}])])
async def test_a_stream_holds_the_slot_until_it_is_closed(kind: str, chunks: list[Any]) -> None:
    Streams.closed = []
    async with loaded(Streams, max_queue_length=0) as api:
        stream = await api.call(kind, ctx())
        assert isinstance(stream, Stream)
        assert api.limiter.running == 1
        got = []
        while (chunk := await stream.next()) is not Stream.END:
            got.append(chunk)
        assert got == chunks
        assert api.limiter.running == 1  # all read, not yet closed
        with pytest.raises(QueueFull):
            await api.call(kind, ctx())
        await stream.aclose()
        assert api.limiter.running == 0
        await stream.aclose()  # twice is harmless: the slot is given back once
        assert api.limiter.running == 0
        assert Streams.closed == [kind]


async def test_a_stream_closed_early_runs_the_generators_finally() -> None:
    Streams.closed = []
    async with loaded(Streams) as api:
        stream = await api.call("async", ctx())
        assert await stream.next() == {"i": 0}
        await stream.aclose()
        assert Streams.closed == ["async"]
        assert api.limiter.running == 0


async def test_an_external_cancellation_propagates_and_frees_the_slot() -> None:
    Gated.reset()
    async with loaded(Gated, timeout=10) as api:
        call = asyncio.create_task(api.call("x", ctx()))
        assert await within(Gated.started.get()) == "x"
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert Gated.cancelled == ["x"]
        assert api.limiter.running == 0
        assert counted(api, "modelserve_requests_cancelled_total", reason="timeout") == 0
        assert counted(api, "modelserve_requests_cancelled_total", reason="disconnect") == 0


async def test_an_external_cancellation_of_a_waiting_call_leaves_the_line() -> None:
    Gated.reset()
    async with loaded(Gated, max_queue_length=5) as api:
        running = asyncio.create_task(api.call(1, ctx()))
        assert await within(Gated.started.get()) == 1
        waiting = asyncio.create_task(api.call(2, ctx()))
        while api.limiter.waiting == 0:
            await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert api.limiter.waiting == 0
        Gated.gate.set()
        assert await within(running) == 1
        assert Gated.started.empty()  # the cancelled call never ran
        assert api.limiter.running == 0


# --------------------------------------------------------------------------------------------------
# Limiter (a cancelled waiter racing a release is in test_batching_models.py)


async def test_limiter_fast_path_and_full_line() -> None:
    limiter = Limiter(2, 1)
    await limiter.acquire()
    assert limiter.try_acquire()
    assert (limiter.running, limiter.waiting) == (2, 0)
    assert not limiter.try_acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    assert limiter.waiting == 1
    with pytest.raises(QueueFull):
        await limiter.acquire()
    assert limiter.rejected == 1
    limiter.release()
    await within(waiter)
    assert (limiter.running, limiter.waiting) == (2, 0)


async def test_limiter_hands_slots_over_first_in_first_out() -> None:
    limiter = Limiter(1, 10)
    freed: list[int] = []
    limiter.on_release = lambda: freed.append(limiter.running)
    await limiter.acquire()
    order: list[int] = []

    async def wait(n: int) -> None:
        await limiter.acquire()
        order.append(n)

    waiters = [asyncio.create_task(wait(n)) for n in range(4)]
    await asyncio.sleep(0)
    assert limiter.waiting == 4
    for _ in range(4):
        limiter.release()  # handed straight to the oldest waiter: the slot never becomes free
        assert limiter.running == 1
        assert not limiter.try_acquire()  # and a newcomer cannot overtake the line
        await asyncio.sleep(0)
    await within(asyncio.gather(*waiters))
    assert order == [0, 1, 2, 3]
    assert freed == []
    limiter.release()
    assert freed == [0] and limiter.running == 0


async def test_limiter_cancelled_waiter_leaves_the_line() -> None:
    limiter = Limiter(1, 1)
    await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    assert limiter.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert limiter.waiting == 0
    follower = asyncio.create_task(limiter.acquire())  # the line has room again
    await asyncio.sleep(0)
    limiter.release()
    await within(follower)
    assert (limiter.running, limiter.waiting) == (1, 0)


# --------------------------------------------------------------------------------------------------
# Watch and Watchdog


# test_watch.py tests Watch and Watchdog on a virtual clock; what stays here is the bookkeeping of the
# watchdog's two generations of calls, on the real loop.


async def test_watchdog_passes_over_calls_it_has_looked_after_yet_still_expires_them() -> None:
    # A tick moves the calls that came of age to `old` (watching them) and stops at the first young one;
    # deadlines, of old calls too, are looked at once the earliest one known may have passed.
    watchdog = Watchdog(watch_after=0.01, tick=0.002)
    never = asyncio.Event()
    gone = Watch(watchdog, ctx("gone"), None, 0.005)
    gone.disarm()  # the earliest deadline known is now stale: it must not hide the next one
    context = ctx("old")
    watch = Watch(watchdog, context, never.wait, 1.0)  # far beyond the first sleep, even on a busy machine
    assert watch in watchdog.young and watchdog.next_deadline == gone.deadline
    await asyncio.sleep(0.04)
    assert watch in watchdog.old and watch not in watchdog.young and watch.watching
    assert watchdog.next_deadline == watch.deadline  # recomputed from the calls still in flight
    young = Watch(watchdog, ctx("young"), never.wait, None)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.sleep(60)  # the old call's deadline cancels this task
    watch.absorb_cancel()
    assert watch.fired and context.reason == "timeout" and not young.fired
    assert watch not in watchdog.old and watchdog.next_deadline == float("inf")
    young.disarm()
    assert not watchdog.active
