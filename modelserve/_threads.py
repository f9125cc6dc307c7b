"""Worker threads for sync user code, handed over at once.

``anyio.to_thread.run_sync`` first yields to the event loop (a checkpoint) and only then hands the call to a
thread. On a busy server that yield waits behind every callback that is ready, several milliseconds under
load (measured: 9 ms at the median with 64 connections posting 6 KB bodies), and a batched model sits idle
for all of it. Here the call goes to a `ThreadPoolExecutor` at once and the caller awaits its future.

The pool is shared by the process (like anyio's default limiter, it caps the threads at `MAX_THREADS`).
Its threads are not daemons: `shutdown` lets the idle ones go, so that a thread still alive afterwards is
one still running user code.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

#: At most this many sync calls run at once in the process (anyio's default is 40 too).
MAX_THREADS = 40

_executor: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _executor
    if _executor is None:
        with _lock:
            if _executor is None:
                _executor = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="modelserve-worker")
    return _executor


async def run_sync(fn: Callable[..., Any], *args: Any, abandon_on_cancel: bool = False) -> Any:
    """Run ``fn(*args)`` in a worker thread, in a copy of the caller's context; its result or exception.

    When the caller is cancelled, with `abandon_on_cancel` it stops waiting at once (the call runs on, or
    never starts if no thread has picked it up yet); without, the cancellation takes effect once the call
    has returned.
    """
    context = contextvars.copy_context()
    future = asyncio.wrap_future(_pool().submit(context.run, fn, *args))
    if abandon_on_cancel:
        return await future
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(future)
        except asyncio.CancelledError:
            if future.done():
                raise
            cancelled = True
            continue
        if cancelled:
            raise asyncio.CancelledError()
        return result


def submit(fn: Callable[..., Any], *args: Any) -> None:
    """Start ``fn(*args)`` in a worker thread, in the thread's own context; nobody waits for it (`fn` hands
    its outcome over itself, as the limiter's turns do)."""
    _pool().submit(fn, *args)


def shutdown() -> None:
    """Let the idle threads exit (a new call starts a new pool)."""
    global _executor
    with _lock:
        executor, _executor = _executor, None
    if executor is not None:
        executor.shutdown(wait=False)
