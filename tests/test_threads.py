"""The worker threads of sync user code: results, errors, context, and both kinds of cancellation."""

from __future__ import annotations

import asyncio
import contextvars
import os
import sys
import threading
import time

import pytest

from modelserve import _threads

TAG: contextvars.ContextVar[str] = contextvars.ContextVar("tag", default="none")


def test_a_call_runs_in_another_thread_with_the_callers_context() -> None:
    async def main() -> tuple[str, int]:
        TAG.set("request-1")
        return await _threads.run_sync(lambda x: (TAG.get() + x, threading.get_ident()), "!")

    tag, ident = asyncio.run(main())
    assert tag == "request-1!"
    assert ident != threading.get_ident()


def test_an_exception_reaches_the_caller() -> None:
    def fail() -> None:
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        asyncio.run(_threads.run_sync(fail))


@pytest.mark.parametrize("abandon", [True, False])
def test_cancellation_abandons_or_waits_for_the_call(abandon: bool) -> None:
    # The call runs until its gate opens, not for a 0.3 s sleep that a busy machine could see end before the
    # cancelled caller is looked at.
    started, gate, finished = threading.Event(), threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        assert gate.wait(30)
        finished.set()
        return "done"

    async def main() -> None:
        task = asyncio.ensure_future(_threads.run_sync(slow, abandon_on_cancel=abandon))
        while not started.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        # A caller that waits for the call learns of its cancellation once the gate opened; one that abandons
        # it, before (the 10 s bound a failing test: a caller that waited would then see the call finished).
        asyncio.get_running_loop().call_later(10 if abandon else 0.05, gate.set)
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    if abandon:
        assert not finished.is_set()  # the caller left while the call still runs; it runs on
        gate.set()
        assert finished.wait(10)
    else:
        assert finished.is_set()  # the cancellation took effect once the call had returned


def test_shutdown_lets_the_idle_threads_go() -> None:
    asyncio.run(_threads.run_sync(time.sleep, 0))
    workers = [t for t in threading.enumerate() if t.name.startswith("modelserve-worker")]
    assert workers
    _threads.shutdown()
    for worker in workers:
        worker.join(2)
        assert not worker.is_alive()
    assert asyncio.run(_threads.run_sync(lambda: 42)) == 42  # a new pool on demand


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own nice value is Linux's")
def test_batch_threads_yield_the_core_to_the_event_loop() -> None:
    threads = _threads.BatchThreads("nice", 2)
    threads.start()
    try:
        nice_values: list[int] = []
        done = threading.Event()

        def record(result: object, error: BaseException | None) -> None:
            assert error is None
            nice_values.append(int(result))  # type: ignore[call-overload]
            if len(nice_values) == 2:
                done.set()

        for _ in range(2):
            threads.submit(os.getpriority, (os.PRIO_PROCESS, 0), record)
        assert done.wait(10)
        expected = min(os.getpriority(os.PRIO_PROCESS, 0) + _threads.BATCH_THREAD_NICE, 19)
        assert nice_values == [expected, expected]
        # the calling thread (the loop's) keeps its own; a process already at 19 has no lower priority to give
        assert os.getpriority(os.PRIO_PROCESS, 0) < expected or expected == 19
    finally:
        threads.close()


def test_batch_threads_are_busy_from_a_submit_until_its_job_has_finished() -> None:
    threads = _threads.BatchThreads("busy", 1)
    threads.start()
    try:
        assert not threads.busy()
        release, answered = threading.Event(), threading.Event()
        threads.submit(release.wait, (10,), lambda result, error: answered.set())
        threads.submit(lambda: None, (), lambda result, error: None)
        assert threads.busy()  # the first job waits in the thread, the second in the queue
        release.set()
        assert answered.wait(10)
        for _ in range(1000):  # the thread counts a job once its `done` has returned
            if not threads.busy():
                break
            time.sleep(0.01)
        assert not threads.busy()
    finally:
        threads.close()


def test_the_unbatched_thread_keeps_the_callers_priority_and_says_what_it_is() -> None:
    threads = _threads.BatchThreads("api", 1, nice=0, role="unbatched")
    threads.start()
    try:
        got: list[tuple[int, str]] = []
        done = threading.Event()

        def record(result: object, error: BaseException | None) -> None:
            assert error is None
            got.append(result)  # type: ignore[arg-type]
            done.set()

        threads.submit(lambda: (os.getpriority(os.PRIO_PROCESS, 0), threading.current_thread().name), (), record)
        assert done.wait(10)
        assert got == [(os.getpriority(os.PRIO_PROCESS, 0), "modelserve-unbatched-api-0")]
    finally:
        threads.close()
