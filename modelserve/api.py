"""An API of a project, and `Api.call`: one call of it, whatever transport asked for it.

`Api.call` is the only way a request or a job reaches user code. It knows nothing of ASGI; it takes the
decoded inputs and a request context, and either returns the result or raises a modelserve exception
(`errors.py`). In order, it

1. refuses the call when the API is not ready (`ServiceUnavailable`);
2. takes a concurrency slot from the API's `Limiter`, waiting in its bounded line (`QueueFull` when full);
3. runs the pipeline (or the batcher behind it) under a `Watch`: past the API's ``timeout`` the call is
   cancelled and raises `GatewayTimeout`; when the caller's `cancelled` awaitable completes (an HTTP client
   disconnects, a job is deleted) it is cancelled and raises `ClientDisconnected`;
4. gives the slot back, unless a sync stage still runs in its thread: then the thread gives it back when the
   user code returns, so that ``max_concurrency`` bounds user code and not only requests. When every stage
   is sync, the call's work waits in the limiter's line and the worker thread gives the slot back itself,
   handing it to the next waiting work in the same thread (`Limiter.run`).

A generator result comes back as a `Stream` that keeps the slot and the watch until the transport closes it.
A cancellation that comes from outside (the server's shutdown) is not absorbed: `asyncio.CancelledError`
goes on to the caller.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import types
from collections.abc import Awaitable, Callable
from typing import Any

from modelserve._frames import release_frames
from modelserve._threads import run_in_thread
from modelserve.api_metrics import ApiMetrics
from modelserve.backends import Backend
from modelserve.config import ApiConfig
from modelserve.context import RequestContext
from modelserve.errors import (
    ClientDisconnected,
    GatewayTimeout,
    LoadError,
    QueueFull,
    RequestCancelled,
    ServiceUnavailable,
    UserCodeError,
)
from modelserve.limiter import Limiter
from modelserve.pipeline import Pipeline
from modelserve.watch import Watch, Watchdog

logger = logging.getLogger("modelserve")

#: The results that are streamed.
_GENERATORS = (types.GeneratorType, types.AsyncGeneratorType)

#: Completes when the caller no longer wants the answer (an HTTP disconnect, a job's DELETE).
Cancelled = Callable[[], Awaitable[Any]]


class Api:
    """One API: loads its backend once, tells whether it is ready, and runs its calls."""

    def __init__(self, config: ApiConfig, backend: Backend, metrics: ApiMetrics) -> None:
        self.name = config.name
        self.config = config
        self.backend = backend
        self.metrics = metrics
        # With batching, the requests of the running calls and of one more full batch are admitted: while a
        # batch runs the next one fills up (admitting only the running ones would split them into two halves,
        # one running while the other waits). max_queue_length still bounds the requests waiting beyond those.
        if config.batching is not None:
            admitted = (config.max_concurrency + 1) * config.batching.max_batch_size
        else:
            admitted = config.max_concurrency
        self.limiter = Limiter(admitted, config.max_queue_length, config.max_queued_bytes, config.max_queue_wait)
        self.watchdog = Watchdog()
        #: on_disconnect: notify tells running user code (is_cancelled) instead of cancelling it.
        self.notify = config.on_disconnect == "notify"
        self.state = "loading"
        self.error: str | None = None
        self.ready = False

    async def load(self) -> None:
        started = time.perf_counter()
        try:
            await self.backend.load()
            if self.config.batching is not None:
                self.backend.pipeline = self.backend.pipeline.limited(self.config.max_concurrency)
        except LoadError as exc:
            self.state, self.error = "failed", str(exc)
            raise
        except Exception as exc:
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            raise LoadError(f"api '{self.name}': loading failed: {self.error}") from exc
        seconds = time.perf_counter() - started
        self.metrics.load_time.set(seconds)
        self.state = "ready"
        self.ready = True
        logger.info("api '%s' is ready (loaded in %.2f s)", self.name, seconds)

    def not_ready(self, load: str | None = None) -> ServiceUnavailable:
        """The answer to a call that comes before the API has loaded (or after it failed to); `load`: the
        request that loads an unloaded API in the caller's protocol (default: the V2 HTTP route)."""
        if self.state == "failed":
            return ServiceUnavailable(f"api '{self.name}' failed to load; see the server log", retry_after=30)
        if self.state == "unloaded":  # model control: nothing loads it again but a load request
            if load is None:
                load = f"POST /v2/repository/models/{self.name}/load"
            return ServiceUnavailable(f"api '{self.name}' is unloaded; {load} loads it", retry_after=30)
        return ServiceUnavailable(f"api '{self.name}' is loading; retry later")

    def admit(self, size: int = 0) -> None:
        """Before reading a request's body of `size` bytes (0: not known): refuse now (503) a request that could
        not wait, or take its place in the line. Follow with `call(..., admitted=size)` or `unadmit(size)`."""
        if not self.ready:
            raise self.not_ready()
        try:
            self.limiter.admit(size)
        except QueueFull:
            self.metrics.queue_full.inc()
            raise

    def unadmit(self, size: int = 0) -> None:
        """An admitted request that will not call (its body was refused, its client left)."""
        self.limiter.unadmit(size)

    async def call(
        self,
        value: Any,
        ctx: RequestContext,
        *,
        request: Any = None,
        cancelled: Cancelled | None = None,
        admitted: int | None = None,
        since: float | None = None,
        pipeline: Pipeline | None = None,
    ) -> Any:
        """Run one call of the API: `value` is the decoded inputs, `request` what a stage taking the request
        receives, `admitted` the size given to `admit` when the transport admitted the request first, `since`
        the `time.monotonic()` from which the request counts as waiting when that began before it was read
        (the transport left its connection unread: `max_queue_wait` counts that time too), `pipeline` another
        entry of the backend to run instead of its pipeline (a model file's `tensors`, for a protocol whose
        values are the model's own tensors).

        A pipeline with a `busy_work` (a model file's one step) runs on the event loop while requests come one
        at a time, and as that work in a worker thread through the line while the server is busy
        (``ctx.crowded``: the transport read other requests after this one before its call began; or a call of
        the API running). Inline is the faster of the two alone (1.2-1.6x the requests of iris at one
        connection), the line under load (1.0-1.4x at 16 and 64 connections), where a worker thread runs the
        waiting calls one after the other while the event loop reads and answers requests.

        Returns the result (a `Stream` for a generator) or raises (see the module's docstring)."""
        limiter = self.limiter
        if not self.ready:
            if admitted is not None:
                limiter.unadmit(admitted)
            raise self.not_ready()
        watch = Watch(self.watchdog, ctx, cancelled, self.config.timeout, self.notify)
        acquired = streaming = False
        began = 0.0  # when a call that waited for its slot began (the limiter's estimate of a call's time)
        if pipeline is None:
            pipeline = self.backend.pipeline
        work = pipeline.work
        if work is None and (ctx.crowded or limiter.running):
            work = pipeline.busy_work
        try:
            if work is not None:
                # Sync stages only: the work waits in the line itself, and the thread that runs it gives the
                # slot back (to the next waiting work, in the same thread) unless it kept it for a stream.
                ctx.release_slot = limiter.release
                result, acquired = await limiter.run(work(value, request, ctx), admitted, since)
            else:
                if not limiter.enter_now(admitted):
                    await limiter.acquire(admitted, since)
                    began = time.monotonic()
                acquired = True
                ctx.release_slot = limiter.release
                result = await pipeline.run(value, request, ctx)
            if watch.fired:  # on_disconnect: notify, and the user's code returned after it was told
                raise self.cancelled(ctx)
            if isinstance(result, _GENERATORS):
                streaming = True
                return Stream(self, result, ctx, watch)
            return result
        except QueueFull:
            self.metrics.queue_full.inc()
            raise
        except (asyncio.CancelledError, RequestCancelled):
            if not watch.fired:
                raise
            watch.absorb_cancel()
            raise self.cancelled(ctx) from None
        except UserCodeError as exc:
            log_user_error(self.name, ctx, exc)
            raise
        finally:
            if not streaming:
                watch.disarm()
                # leave() also when the slot is not ours: work a thread has not started yet will not start
                if ctx.leave() and acquired:
                    limiter.release(began)

    def cancelled(self, ctx: RequestContext) -> GatewayTimeout | ClientDisconnected:
        """The exception a call cancelled by its watch ends with, counted and logged here (once)."""
        reason = ctx.reason or "disconnect"
        self.metrics.cancelled(reason)
        if reason == "timeout":
            timeout = self.config.timeout
            logger.warning("api '%s': request timed out after %s s (504)", self.name, timeout)
            return GatewayTimeout(f"the call took longer than the timeout of {timeout} s")
        logger.info("api '%s': %s; request cancelled (499)", self.name, _CANCEL_REASONS.get(reason, reason))
        return ClientDisconnected(f"cancelled: {reason}")

    def refresh_gauges(self) -> None:
        self.metrics.in_flight.set(self.limiter.running)
        self.metrics.waiting.set(self.limiter.waiting)

    def describe(self) -> dict[str, Any]:
        handler = self.config.handler
        return {
            "name": self.name,
            "kind": self.config.kind,
            "state": self.state,
            "backend": self.backend.kind,
            "config_keys": sorted(handler.config) if handler is not None else [],
            "max_concurrency": self.config.max_concurrency,
            "max_queue_length": self.config.max_queue_length,
            "timeout": self.config.timeout,
            **self.backend.describe(),
        }


#: How the log says why a call was cancelled, by the reason its `cancelled` awaitable gave.
_CANCEL_REASONS = {"disconnect": "client disconnected", "cancelled": "job cancelled by a DELETE"}


def log_user_error(api: str, ctx: RequestContext, exc: UserCodeError) -> None:
    """The one log line of a failure in user code, with its traceback; then the traceback's frames let go of
    their locals (`release_frames`: the failing stage's arrays, the inputs)."""
    error = exc.error
    logger.error(
        "api '%s': %s",
        api,
        exc.detail,
        exc_info=(type(error), error, error.__traceback__) if error is not None else None,
    )
    release_frames(error)  # not yet the cause of `exc` when `exc` is still to be raised
    release_frames(exc)


_END = object()


class Stream:
    """A generator's chunks, one `next()` at a time; holds the API's slot and watch until `aclose()`.

    Sync generators are advanced in a worker thread, never on the event loop. A chunk that raises ends the
    stream with `UserCodeError` (logged once here); `aclose()` closes the generator so that its ``finally``
    runs, and gives the slot back.
    """

    END = _END

    def __init__(self, api: Api, gen: Any, ctx: RequestContext, watch: Watch) -> None:
        self.api = api
        self.gen = gen
        self.ctx = ctx
        self.watch = watch
        self.is_async = inspect.isasyncgen(gen)
        self._closed = False
        # A stream may run as long as it keeps sending: its client's disconnect is watched from the start.
        watch.watch_now()

    def _step(self) -> Any:
        try:
            return next(self.gen)
        except StopIteration:
            return _END

    async def next(self) -> Any:
        """The next chunk, or `Stream.END`."""
        try:
            if self.is_async:
                try:
                    return await self.gen.__anext__()
                except StopAsyncIteration:
                    return _END
            return await run_in_thread(self._step, ctx=self.ctx, on_abandon=self.gen.close)
        except (asyncio.CancelledError, RequestCancelled):
            if not self.watch.fired:
                raise
            self.watch.absorb_cancel()
            raise self.api.cancelled(self.ctx) from None
        except UserCodeError:
            raise
        except BaseException as exc:  # noqa: B036 - user code's SystemExit is a failed stream, not an exit
            error = UserCodeError("the stream", exc)
            log_user_error(self.ctx.api, self.ctx, error)
            raise error from exc

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.watch.disarm()
        try:
            if self.is_async:
                await self.gen.aclose()
            else:
                try:
                    self.gen.close()
                except ValueError:
                    pass  # still running in its worker thread, which closes it when next() returns
        except Exception as exc:
            logger.warning("api '%s': closing the stream raised %r", self.ctx.api, exc)
        finally:
            if self.ctx.leave():
                self.api.limiter.release()
