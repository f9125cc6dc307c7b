"""`modelserve.pipeline` without an API or a server: stages, thread hops, errors, cancellation, timers, limits.

Each test compiles a `Pipeline` of tiny stages defined here and awaits ``pipeline.run(value, request, ctx)``.
Nothing waits on the clock: a stage that must be "still running" blocks on an event the test sets.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from starlette.exceptions import HTTPException

from modelserve import pipeline as pipeline_module
from modelserve._threads import run_in_thread
from modelserve.context import RequestContext
from modelserve.errors import BadRequest, RequestCancelled, UserCodeError
from modelserve.pipeline import Pipeline, Stage, adapt

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def sync_stage(name: str, fn: Callable[[Any, Any], Any], shared: bool = False) -> Stage:
    return Stage(name, fn, is_async=False, shared=shared)


def async_stage(name: str, fn: Callable[[Any, Any], Any], shared: bool = False) -> Stage:
    async def call(value: Any, request: Any) -> Any:
        return fn(value, request)

    return Stage(name, call, is_async=True, shared=shared)


def stage_of(kind: str, name: str, fn: Callable[[Any, Any], Any]) -> Stage:
    return sync_stage(name, fn) if kind == "s" else async_stage(name, fn)


def ctx() -> RequestContext:
    return RequestContext("m", "r1")


async def settle() -> None:
    """Let every task that can run, run until it waits (loop turns, not time)."""
    for _ in range(20):
        await asyncio.sleep(0)


#: Stage kinds in order: s = sync, a = async.
SHAPES = ["s", "a", "sss", "aaa", "sas", "asa", "ssaass"]


# -------------------------------------------------------------------------------------------------
# adapt


@pytest.mark.parametrize(
    ("takes_inputs", "takes_request", "expected"),
    [(True, False, ("v",)), (False, True, ("req",)), (True, True, ("v", "req"))],
)
def test_adapt_calls_the_users_method_with_what_it_takes(
    takes_inputs: bool, takes_request: bool, expected: tuple[str, ...]
) -> None:
    def method(*args: Any) -> tuple[Any, ...]:
        return args

    assert adapt(method, takes_inputs, takes_request)("v", "req") == expected


# -------------------------------------------------------------------------------------------------
# running stages


@pytest.mark.parametrize("shape", SHAPES)
async def test_stages_run_in_order_each_fed_the_one_before(shape: str) -> None:
    def appending(n: int) -> Callable[[Any, Any], Any]:
        return lambda value, request: [*value, (n, request)]

    stages = [stage_of(kind, f"stage{n}", appending(n)) for n, kind in enumerate(shape)]
    result = await Pipeline(stages).run([], "req", ctx())
    assert result == [(n, "req") for n in range(len(shape))]


@pytest.mark.parametrize("shape", SHAPES)
async def test_without_a_context_the_stages_run_too(shape: str) -> None:
    stages = [stage_of(kind, f"s{n}", lambda value, request: value + 1) for n, kind in enumerate(shape)]
    assert await Pipeline(stages).run(0, None, None) == len(shape)


@pytest.mark.parametrize(("shape", "hops"), [("s", 1), ("sss", 1), ("aaa", 0), ("sas", 2), ("ssaass", 2)])
async def test_consecutive_sync_stages_take_one_thread_hop_and_async_stages_stay_on_the_loop(
    shape: str, hops: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[Callable[..., Any]] = []
    run_sync = pipeline_module._threads.run_sync

    async def counting(fn: Callable[..., Any], *args: Any, **options: Any) -> Any:
        taken.append(fn)
        return await run_sync(fn, *args, **options)

    monkeypatch.setattr(pipeline_module._threads, "run_sync", counting)
    loop_thread = threading.get_ident()
    seen: list[tuple[str, int]] = []

    def noting(kind: str) -> Callable[[Any, Any], Any]:
        return lambda value, request: seen.append((kind, threading.get_ident()))

    stages = [stage_of(kind, f"s{n}", noting(kind)) for n, kind in enumerate(shape)]
    await Pipeline(stages).run(None, None, ctx())
    assert len(taken) == hops
    assert [kind for kind, _ in seen] == list(shape)
    for kind, thread in seen:
        assert (thread == loop_thread) is (kind == "a")
    # The stages of one group share their hop's thread.
    groups = "".join(shape).split("a")
    threads = iter(thread for kind, thread in seen if kind == "s")
    for group in filter(None, groups):
        assert len({next(threads) for _ in group}) == 1


# -------------------------------------------------------------------------------------------------
# the timer


@pytest.mark.parametrize("shape", SHAPES)
async def test_the_timer_hears_every_stage_once_in_order(shape: str) -> None:
    heard: list[tuple[str, float]] = []
    stages = [stage_of(kind, f"s{n}", lambda value, request: value) for n, kind in enumerate(shape)]
    await Pipeline(stages, timer=lambda name, seconds: heard.append((name, seconds))).run(None, None, ctx())
    assert [name for name, _ in heard] == [f"s{n}" for n in range(len(shape))]
    assert all(isinstance(seconds, float) and seconds >= 0 for _, seconds in heard)


@pytest.mark.parametrize("shape", ["sss", "aaa", "sas", "asa"])
async def test_the_timer_hears_no_stage_that_failed_or_never_ran(shape: str) -> None:
    heard: list[str] = []

    def fail(value: Any, request: Any) -> Any:
        raise ValueError("no")

    stages = [stage_of(shape[0], "first", lambda v, r: v), stage_of(shape[1], "second", fail)]
    stages.append(stage_of(shape[2], "third", lambda v, r: v))
    with pytest.raises(UserCodeError):
        await Pipeline(stages, timer=lambda name, seconds: heard.append(name)).run(None, None, ctx())
    assert heard == ["first"]


# -------------------------------------------------------------------------------------------------
# errors


@pytest.mark.parametrize("kind", ["s", "a"])
@pytest.mark.parametrize(
    "error", [ValueError("bad value"), SystemExit(3), KeyboardInterrupt()], ids=lambda error: type(error).__name__
)
async def test_user_code_failing_is_a_user_code_error_naming_the_stage(kind: str, error: BaseException) -> None:
    ran: list[str] = []

    def fail(value: Any, request: Any) -> Any:
        raise error

    stages = [stage_of(kind, "preprocess", fail), stage_of(kind, "predict", lambda v, r: ran.append("predict"))]
    with pytest.raises(UserCodeError) as raised:
        await Pipeline(stages).run(None, None, ctx())
    assert raised.value.stage == "preprocess"
    assert raised.value.error is error
    assert ran == []


@pytest.mark.parametrize("kind", ["s", "a"])
@pytest.mark.parametrize(
    "answer",
    [BadRequest("no 'x' in the body"), HTTPException(418, "teapot"), RequestCancelled()],
    ids=lambda answer: type(answer).__name__,
)
async def test_answers_raised_on_purpose_pass_through_as_they_are(kind: str, answer: Exception) -> None:
    def refuse(value: Any, request: Any) -> Any:
        raise answer

    with pytest.raises(type(answer)) as raised:
        await Pipeline([stage_of(kind, "predict", refuse)]).run(None, None, ctx())
    assert raised.value is answer


# -------------------------------------------------------------------------------------------------
# cancellation between stages


@pytest.mark.parametrize("shape", ["ss", "sa", "as", "aa"])
async def test_a_cancelled_request_never_starts_its_next_stage(shape: str) -> None:
    context = ctx()
    ran: list[str] = []

    def first(value: Any, request: Any) -> Any:
        ran.append("first")
        context.cancel("disconnect")  # as the watch does while the stage runs
        return value

    stages = [stage_of(shape[0], "first", first), stage_of(shape[1], "second", lambda v, r: ran.append("second"))]
    with pytest.raises(RequestCancelled):
        await Pipeline(stages).run(None, None, context)
    assert ran == ["first"]


@pytest.mark.parametrize("shape", SHAPES)
async def test_a_request_cancelled_before_the_run_starts_no_stage(shape: str) -> None:
    context = ctx()
    context.cancel("timeout")
    ran: list[int] = []
    stages = [stage_of(kind, f"s{n}", lambda v, r: ran.append(0)) for n, kind in enumerate(shape)]
    with pytest.raises(RequestCancelled):
        await Pipeline(stages).run(None, None, context)
    assert ran == []


# -------------------------------------------------------------------------------------------------
# run_in_thread: a request that leaves while its sync code runs


async def test_an_abandoned_thread_keeps_the_slot_until_its_code_returns() -> None:
    loop = asyncio.get_running_loop()
    context = ctx()
    entered = asyncio.Event()
    released = asyncio.Event()
    proceed = threading.Event()
    events: list[str] = []

    def release_slot() -> None:
        events.append("released")
        released.set()

    context.release_slot = release_slot

    def slow() -> str:
        loop.call_soon_threadsafe(entered.set)
        proceed.wait()
        events.append("returned")
        return "late"

    call = asyncio.ensure_future(
        run_in_thread(slow, ctx=context, on_abandon=lambda: events.append("abandoned")),
    )
    await entered.wait()
    call.cancel()  # the request left (timeout, disconnect)
    with pytest.raises(asyncio.CancelledError):
        await call
    assert context.leave() is False  # the thread holds the slot: the request must not give it back
    assert events == []
    proceed.set()
    await released.wait()
    assert events == ["returned", "abandoned", "released"]


async def test_a_thread_whose_request_stayed_leaves_the_slot_to_the_request() -> None:
    context = ctx()
    released: list[str] = []
    context.release_slot = lambda: released.append("thread")
    assert await run_in_thread(lambda a, b: a + b, 2, 3, ctx=context, on_abandon=lambda: released.append("x")) == 5
    assert context.leave() is True  # the request gives the slot back itself
    await settle()
    assert released == []


async def test_code_whose_request_left_before_a_thread_took_it_never_runs() -> None:
    context = ctx()
    context.leave()
    ran: list[str] = []
    with pytest.raises(RequestCancelled):
        await run_in_thread(lambda: ran.append("ran"), ctx=context)
    assert ran == []


async def test_without_a_context_a_thread_just_runs_the_call() -> None:
    assert await run_in_thread(lambda a, b: a * b, 6, 7, ctx=None) == 42


# -------------------------------------------------------------------------------------------------
# work: an all-sync pipeline as one function for a worker thread


def numbers() -> Iterator[int]:
    yield 1


@pytest.mark.parametrize(
    ("stages", "expected", "keep"),
    [
        ([sync_stage("pre", lambda v, r: v + 1), sync_stage("predict", lambda v, r: v * 10)], 20, False),
        ([sync_stage("predict", lambda v, r: numbers())], None, True),
    ],
    ids=["value", "generator"],
)
def test_work_is_the_whole_sync_call_and_says_whether_its_result_keeps_the_slot(
    stages: list[Stage], expected: Any, keep: bool
) -> None:
    pipeline = Pipeline(stages)
    assert pipeline.work is not None
    result, kept = pipeline.work(1, None, ctx())()
    assert kept is keep
    if expected is not None:
        assert result == expected


def test_work_of_a_request_that_left_runs_no_stage() -> None:
    ran: list[str] = []
    pipeline = Pipeline([sync_stage("predict", lambda v, r: ran.append("predict"))])
    context = ctx()
    context.leave()
    assert pipeline.work is not None
    with pytest.raises(RequestCancelled):
        pipeline.work(None, None, context)()
    assert ran == []


def test_work_is_offered_only_for_all_sync_stages_without_a_limit_and_with_run_untouched() -> None:
    same = sync_stage("predict", lambda v, r: v)
    assert Pipeline([same]).work is not None
    assert Pipeline([same, async_stage("post", lambda v, r: v)]).work is None
    assert Pipeline([same]).limited(2).work is None
    replaced = Pipeline([same])

    async def run(value: Any, request: Any, context: RequestContext | None) -> Any:
        return value

    replaced.run = run
    assert replaced.work is None


# -------------------------------------------------------------------------------------------------
# limited: at most n calls of each unshared stage at once


class Gate:
    """An async stage that counts the calls inside it and holds each until `open`."""

    def __init__(self) -> None:
        self.inside = 0
        self.most = 0
        self.calls = 0
        self.entered = asyncio.Event()
        self._open = asyncio.Event()

    async def __call__(self, value: Any, request: Any) -> Any:
        self.inside += 1
        self.calls += 1
        self.most = max(self.most, self.inside)
        self.entered.set()
        try:
            await self._open.wait()
        finally:
            self.inside -= 1
        return value

    def open(self) -> None:
        self._open.set()


async def test_limited_keeps_the_stages_and_the_options() -> None:
    def timer(name: str, seconds: float) -> None:
        return None

    stages = [sync_stage("predict", lambda v, r: v)]
    pipeline = Pipeline(stages, needs_inputs=False, needs_request=True, timer=timer)
    limited = pipeline.limited(3)
    assert (limited.stages, limited.needs_inputs, limited.needs_request, limited.timer) == (
        pipeline.stages,
        False,
        True,
        timer,
    )
    assert limited.stage_limit == 3
    assert await limited.run(4, None, ctx()) == 4


async def test_limited_runs_at_most_n_calls_of_a_stage_at_once() -> None:
    gate = Gate()
    pipeline = Pipeline([Stage("predict", gate, is_async=True)]).limited(2)
    calls = [asyncio.ensure_future(pipeline.run(n, None, ctx())) for n in range(5)]
    await settle()
    assert (gate.inside, gate.calls) == (2, 2)
    gate.open()
    assert await asyncio.gather(*calls) == list(range(5))
    assert gate.most == 2


async def test_a_shared_stage_is_left_unlimited() -> None:
    gate = Gate()
    pipeline = Pipeline([Stage("predict", gate, is_async=True, shared=True)]).limited(1)
    calls = [asyncio.ensure_future(pipeline.run(n, None, ctx())) for n in range(3)]
    await settle()
    assert gate.inside == 3
    gate.open()
    assert await asyncio.gather(*calls) == [0, 1, 2]


async def test_a_limited_stage_keeps_its_slot_after_its_request_left_until_its_work_ends() -> None:
    gate = Gate()
    pipeline = Pipeline([Stage("predict", gate, is_async=True)]).limited(1)
    left = asyncio.ensure_future(pipeline.run("left", None, ctx()))
    await gate.entered.wait()
    left.cancel()
    with pytest.raises(asyncio.CancelledError):
        await left  # the request stops waiting at once...
    assert gate.inside == 1  # ...while its work runs on
    waiting = asyncio.ensure_future(pipeline.run("next", None, ctx()))
    await settle()
    assert gate.calls == 1  # the slot is still the abandoned work's
    gate.open()
    assert await waiting == "next"
    assert gate.calls == 2


async def test_a_limited_sync_group_runs_at_most_n_at_once() -> None:
    loop = asyncio.get_running_loop()
    lock = threading.Lock()
    inside = most = 0
    two_inside = asyncio.Event()
    proceed = threading.Event()

    def predict(value: Any, request: Any) -> Any:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
            if inside == 2:
                loop.call_soon_threadsafe(two_inside.set)
        proceed.wait()
        with lock:
            inside -= 1
        return value

    pipeline = Pipeline([sync_stage("pre", lambda v, r: v), sync_stage("predict", predict)]).limited(2)
    calls = [asyncio.ensure_future(pipeline.run(n, None, ctx())) for n in range(4)]
    await two_inside.wait()
    await settle()
    with lock:
        assert inside == 2
    proceed.set()
    assert await asyncio.gather(*calls) == [0, 1, 2, 3]
    assert most == 2
