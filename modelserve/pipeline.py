"""The stage runner: calls an API's stages (preprocess, predict, postprocess, or hooks around a model run).

A `Pipeline` is compiled once, when the API loads. Consecutive sync stages are grouped into one hop to a
worker thread (one hop per request, like a bare route using `run_in_threadpool`; `_threads.run_in_thread`),
async stages run on the event loop. Between stages the runner checks whether the request was cancelled, so
that a cancelled request never starts its next stage.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException

from modelserve import _threads
from modelserve.context import RequestContext
from modelserve.errors import HTTPError, RequestCancelled, UserCodeError

#: A stage normalised to two arguments: the value from the previous stage and the request (or None).
StageCall = Callable[[Any, Any], Any]
#: A compiled step: ``await step(value, request, ctx)``.
Step = Callable[[Any, Any, "RequestContext | None"], Awaitable[Any]]
#: ``work(value, request, ctx)``: a function for a worker thread that runs the call and returns (result, keep).
ThreadWork = Callable[[Any, Any, RequestContext], Callable[[], "tuple[Any, bool]"]]
#: Receives (stage name, seconds) after each stage; metrics plug in here.
StageTimer = Callable[[str, float], None]


@dataclass(frozen=True)
class Stage:
    """One stage: its name, a two-argument call, and whether it is a coroutine function."""

    name: str
    call: StageCall
    is_async: bool
    #: A stage that already serves many requests in one call (a batched predict): `Pipeline.limited` leaves it.
    shared: bool = False


def adapt(fn: Callable[..., Any], takes_inputs: bool, takes_request: bool) -> StageCall:
    """Wrap a user's method so that every stage is called as ``call(value, request)``."""
    if takes_inputs and takes_request:
        return fn
    if takes_request:
        return lambda value, request: fn(request)
    return lambda value, request: fn(value)


#: Raised by user code (or by us, between stages) on purpose: answered as they are, not as a failure.
PASS_THROUGH = (HTTPError, HTTPException, RequestCancelled, asyncio.CancelledError)


class Pipeline:
    """The compiled stages of one API."""

    def __init__(
        self,
        stages: Sequence[Stage],
        *,
        needs_inputs: bool = True,
        needs_request: bool = False,
        timer: StageTimer | None = None,
        stage_limit: int | None = None,
        run: Step | None = None,
        busy_call: Callable[[Any, Any, RequestContext | None], Any] | None = None,
    ) -> None:
        """`run`: a backend's own step for all the stages at once (a measured fast path, `ModelFileBackend`'s); the
        stages stay the reference, which `limited` compiles. `busy_call`: ``run``'s call as one sync function,
        which `Api.call` runs in a worker thread instead of `run` while other requests wait (see `Api.call`)."""
        self.stages = tuple(stages)
        self.needs_inputs = needs_inputs
        self.needs_request = needs_request
        self.timer = timer
        #: At most this many calls of each stage that is not `shared` run at once (None: no limit of its own).
        self.stage_limit = stage_limit
        self._work: ThreadWork | None = None
        self._steps = self._compile()
        #: ``await run(value, request, ctx)`` runs every stage in order, feeding each one's result to the next
        #: (a lone step is called directly: one coroutine less on every request).
        self._compiled_run: Step = self._steps[0] if len(self._steps) == 1 else self._run_steps
        self.run: Step = run if run is not None else self._compiled_run
        #: ``run``'s call as one sync function, and as the `ThreadWork` that `Limiter.run` takes while the server
        #: is busy: None where ``run`` has none. A spec may run more of a request around `busy_call` in the same
        #: thread (V2 decodes and encodes there, `modelserve.http.v2`).
        self.busy_call = busy_call
        self.busy_work = self.thread_work(busy_call) if busy_call is not None else None

    @property
    def work(self) -> ThreadWork | None:
        """For stages that are all sync (and no `stage_limit`): ``work(value, request, ctx)`` is the whole call
        as one function for a worker thread, which `Api.call` gives to `Limiter.run` (a thread that finishes a
        call starts the next waiting one itself). None otherwise, or when ``run`` was replaced (it stays the
        reference): then ``run`` after ``Limiter.acquire``."""
        return self._work if self.run is self._compiled_run else None

    def limited(self, stage_limit: int) -> Pipeline:
        """The same stages, with at most `stage_limit` calls of each unshared stage at once.

        A batched API admits several requests per running batch; this keeps ``max_concurrency`` a promise
        about each of the user's stages (with 1, preprocess is never called concurrently). A pipeline built with
        this limit already is returned as it is (with its `run`).
        """
        if stage_limit == self.stage_limit:
            return self
        return Pipeline(
            self.stages,
            needs_inputs=self.needs_inputs,
            needs_request=self.needs_request,
            timer=self.timer,
            stage_limit=stage_limit,
        )

    def _compile(self) -> list[Step]:
        steps: list[Step] = []
        group: list[Stage] = []
        for stage in self.stages:
            if stage.is_async:
                if group:
                    steps.append(self._limit(self._sync_step(tuple(group))))
                    group = []
                step = self._async_step(stage)
                steps.append(step if stage.shared else self._limit(step))
            else:
                group.append(stage)
        if group:
            steps.append(self._limit(self._sync_step(tuple(group))))
            if len(group) == len(self.stages) and self.stage_limit is None:
                self._work = self.thread_work(self._group_runner(tuple(group)))
        return steps

    def _limit(self, step: Step) -> Step:
        """`step` holding one of `stage_limit` slots until its work has ended, even when its request leaves
        first (a timeout, a disconnect): the request stops waiting at once, the work runs on in its task (an
        "async" stage may be sync code in a thread, which cannot be interrupted) and keeps its slot."""
        if self.stage_limit is None:
            return step
        slots = asyncio.Semaphore(self.stage_limit)

        def done(task: asyncio.Task[Any]) -> None:
            slots.release()
            if not task.cancelled():
                task.exception()  # retrieved: a failure after the request left is not "never retrieved"

        async def limited(value: Any, request: Any, ctx: RequestContext | None) -> Any:
            await slots.acquire()
            try:
                task = asyncio.ensure_future(step(value, request, ctx))
            except BaseException:
                slots.release()
                raise
            task.add_done_callback(done)
            return await asyncio.shield(task)

        return limited

    def _async_step(self, stage: Stage) -> Step:
        call, name = stage.call, stage.name
        timer = self.timer

        async def step(value: Any, request: Any, ctx: RequestContext | None) -> Any:
            if ctx is not None and ctx.cancelled:
                raise RequestCancelled()
            started = time.perf_counter()
            try:
                value = await call(value, request)
            except PASS_THROUGH:
                raise
            except BaseException as exc:  # noqa: B036 - SystemExit or KeyboardInterrupt in user code is a failed call
                raise UserCodeError(name, exc) from exc
            if timer is not None:
                timer(name, time.perf_counter() - started)
            return value

        return step

    def _group_runner(self, group: tuple[Stage, ...]) -> Callable[[Any, Any, RequestContext | None], Any]:
        timer = self.timer

        def run_group(value: Any, request: Any, ctx: RequestContext | None) -> Any:
            for stage in group:
                if ctx is not None and ctx.cancelled:
                    raise RequestCancelled()
                started = time.perf_counter()
                try:
                    value = stage.call(value, request)
                except PASS_THROUGH:
                    raise
                except BaseException as exc:  # noqa: B036 - SystemExit or KeyboardInterrupt in user code is a failed call
                    raise UserCodeError(stage.name, exc) from exc
                if timer is not None:
                    timer(stage.name, time.perf_counter() - started)
            return value

        return run_group

    def _sync_step(self, group: tuple[Stage, ...]) -> Step:
        run_group = self._group_runner(group)

        async def step(value: Any, request: Any, ctx: RequestContext | None) -> Any:
            if ctx is not None and ctx.cancelled:
                raise RequestCancelled()
            return await _threads.run_in_thread(run_group, value, request, ctx, ctx=ctx)

        return step

    @staticmethod
    def thread_work(run_group: Callable[[Any, Any, RequestContext | None], Any]) -> ThreadWork:
        """``run_group(value, request, ctx)`` (a whole call, in a worker thread) as `ThreadWork`."""

        def work(value: Any, request: Any, ctx: RequestContext) -> Callable[[], tuple[Any, bool]]:
            def call() -> tuple[Any, bool]:
                if not ctx.enter_thread():
                    raise RequestCancelled()
                try:
                    result = run_group(value, request, ctx)
                finally:
                    ctx.exit_thread()
                # A generator's slot stays with the request: its stream gives it back when closed.
                return result, inspect.isgenerator(result) or inspect.isasyncgen(result)

            return call

        return work

    async def _run_steps(self, value: Any, request: Any, ctx: RequestContext | None) -> Any:
        for step in self._steps:
            value = await step(value, request, ctx)
        return value
