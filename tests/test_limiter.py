"""The limiter without HTTP: `Limiter.run` hands a slot from one worker thread's work to the next waiting work
in the same thread, keeps FIFO and max_concurrency, and gives slots back on every way out."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from modelserve.errors import QueueFull
from modelserve.limiter import Limiter

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def work(
    log: list[Any],
    name: str,
    seconds: float = 0.0,
    keep: bool = False,
    fail: bool = False,
    gate: threading.Event | None = None,
) -> Any:
    """A call for `Limiter.run` that logs itself, then sleeps `seconds` or holds its slot until `gate` is set (a
    test that needs the slot taken must not bet on a sleep outlasting the loop's next turns: a busy machine can
    stall the loop longer)."""

    def call() -> tuple[Any, bool]:
        log.append((name, threading.get_ident(), time.perf_counter()))
        if gate is not None:
            assert gate.wait(30), f"{name}'s gate was never opened"
        time.sleep(seconds)
        if fail:
            raise ValueError(name)
        return name, keep

    return call


async def test_a_freed_slot_runs_the_next_waiting_work_in_the_same_thread_and_in_order() -> None:
    limiter = Limiter(1, 10)
    log: list[Any] = []
    gate = threading.Event()
    calls = [asyncio.ensure_future(limiter.run(work(log, str(i), gate=gate))) for i in range(4)]
    await asyncio.sleep(0)
    assert limiter.running == 1 and limiter.waiting == 3
    gate.set()
    results = await asyncio.gather(*calls)
    assert results == [(str(i), False) for i in range(4)]
    assert [name for name, _, _ in log] == ["0", "1", "2", "3"]  # FIFO
    assert len({thread for _, thread, _ in log}) == 1  # handed over in the thread, not through the loop
    assert limiter.running == 0 and limiter.waiting == 0


async def test_max_concurrency_holds_across_the_hand_over() -> None:
    limiter = Limiter(2, 20)
    running = 0
    most = 0
    lock = threading.Lock()

    def call() -> tuple[Any, bool]:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.005)
        with lock:
            running -= 1
        return None, False

    await asyncio.gather(*(limiter.run(call) for _ in range(20)))
    assert most == 2
    assert limiter.running == 0


async def test_a_full_line_refuses_and_a_failure_gives_the_slot_back() -> None:
    limiter = Limiter(1, 1)
    log: list[Any] = []
    gate = threading.Event()
    first = asyncio.ensure_future(limiter.run(work(log, "a", fail=True, gate=gate)))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(limiter.run(work(log, "b")))
    await asyncio.sleep(0)
    with pytest.raises(QueueFull):
        await limiter.run(work(log, "c"))
    gate.set()
    with pytest.raises(ValueError, match="a"):
        await first
    assert await second == ("b", False)
    assert limiter.running == 0 and limiter.rejected == 1


async def test_a_cancelled_waiting_work_never_runs() -> None:
    limiter = Limiter(1, 10)
    log: list[Any] = []
    gate = threading.Event()
    first = asyncio.ensure_future(limiter.run(work(log, "a", gate=gate)))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(limiter.run(work(log, "b")))
    await asyncio.sleep(0)
    assert limiter.waiting == 1
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert limiter.waiting == 0
    gate.set()
    await first  # "a"'s thread finds nobody waiting: the slot is free, and "b" never runs
    assert [name for name, _, _ in log] == ["a"]
    assert limiter.running == 0 and limiter.waiting == 0


async def test_kept_slots_stay_until_released_and_then_go_to_the_next_waiter() -> None:
    limiter = Limiter(1, 10)
    log: list[Any] = []
    assert await limiter.run(work(log, "stream", keep=True)) == ("stream", True)
    assert limiter.running == 1
    waiter = asyncio.ensure_future(limiter.run(work(log, "next")))
    await asyncio.sleep(0.02)
    assert not waiter.done()
    limiter.release()
    assert await waiter == ("next", False)
    assert limiter.running == 0


async def test_a_thread_hands_its_slot_to_an_acquire_waiter_through_the_loop() -> None:
    limiter = Limiter(1, 10)
    released: list[bool] = []
    limiter.on_release = lambda: released.append(True)
    log: list[Any] = []
    gate = threading.Event()
    running = asyncio.ensure_future(limiter.run(work(log, "a", gate=gate)))
    await asyncio.sleep(0)
    acquired = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0)
    assert limiter.waiting == 1
    gate.set()
    await running
    await asyncio.wait_for(acquired, 30)
    assert limiter.running == 1 and not released
    limiter.release()
    assert limiter.running == 0 and released == [True]


async def test_the_bytes_of_admitted_waiting_work_count_until_it_runs() -> None:
    limiter = Limiter(1, 10, max_queued_bytes=100)
    log: list[Any] = []
    limiter.admit(60)
    gate = threading.Event()
    first = asyncio.ensure_future(limiter.run(work(log, "a", gate=gate), admitted=60))
    await asyncio.sleep(0)
    assert limiter.queued_bytes == 0  # running: no longer waiting
    limiter.admit(60)
    second = asyncio.ensure_future(limiter.run(work(log, "b"), admitted=60))
    await asyncio.sleep(0)
    assert limiter.queued_bytes == 60
    with pytest.raises(QueueFull, match="max_queued_bytes"):
        limiter.admit(50)
    gate.set()
    await asyncio.gather(first, second)
    assert limiter.queued_bytes == 0 and limiter.admitted == 0


async def test_a_waiter_whose_turn_comes_after_max_queue_wait_is_refused_and_the_slot_goes_on() -> None:
    limiter = Limiter(1, 10, max_queue_wait=0.5)
    log: list[Any] = []
    gate = threading.Event()
    first = asyncio.ensure_future(limiter.run(work(log, "a", gate=gate)))
    late = asyncio.ensure_future(limiter.run(work(log, "late")))
    late_acquire = asyncio.ensure_future(limiter.acquire())
    await asyncio.sleep(0)
    assert limiter.running == 1 and limiter.waiting == 2
    # Whenever their turn comes, these two have waited longer than this sleep, so longer than 0.5 s. The one
    # sent now is handed the slot as soon as the gate opens: a busy machine would have to stall the hand-over
    # for half a second to make it late (with a 0.03 s bound and 0.02 s margins on either side, it could).
    await asyncio.sleep(0.52)
    in_time = asyncio.ensure_future(limiter.run(work(log, "in time")))
    await asyncio.sleep(0)
    assert limiter.waiting == 3
    gate.set()
    await first
    with pytest.raises(QueueFull, match="max_queue_wait of 0.5 s"):
        await late
    with pytest.raises(QueueFull, match="max_queue_wait"):
        await late_acquire
    assert await in_time == ("in time", False)
    assert [name for name, _, _ in log] == ["a", "in time"]
    assert limiter.running == 0 and limiter.waiting == 0 and limiter.rejected == 2


def test_config_refuses_a_bad_max_queue_wait(tmp_path: Any) -> None:
    from modelserve.config import parse_project
    from modelserve.errors import ConfigError

    with pytest.raises(ConfigError, match="max_queue_wait"):
        parse_project({"apis": [{"name": "a", "handler": {"path": "m.py"}, "max_queue_wait": 0}]}, tmp_path)
