"""The context of the request being served: its id, its API, and whether it was cancelled.

It lives in a context variable, so it follows the request into async user code and into the worker
threads that run sync stages (they run in a copy of the context). Log records read it to add ``api`` and
``request_id``; sync user code calls `is_cancelled()` to learn that its client went away.
"""

from __future__ import annotations

import contextvars
import re
import threading
from collections.abc import Callable
from random import getrandbits
from typing import Any, Protocol

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9\-_.:]{1,128}$")


def new_request_id() -> str:
    """A random uuid4 as 32 hex digits (the same format as ``uuid.uuid4().hex``).

    Request ids need to be unique, not unpredictable: `random.getrandbits` (seeded from the OS, reseeded in
    forked workers) costs half of ``os.urandom``'s system call on every request.
    """
    return "%032x" % ((getrandbits(128) & _CLEAR) | _UUID4_BITS)


# Version 4 in bits 76-79, variant 0b10 in bits 62-63 (RFC 4122).
_CLEAR = ~((0xF << 76) | (0x3 << 62))
_UUID4_BITS = (0x4 << 76) | (0x2 << 62)


def sane_request_id(candidate: str | None) -> str:
    """The client's X-Request-ID when it is a sane token, else a fresh uuid4 hex."""
    if candidate and _REQUEST_ID_RE.match(candidate):
        return candidate
    return new_request_id()


class RequestContext:
    """Per-request state shared by the event loop and the worker thread running a sync stage."""

    __slots__ = ("api", "request_id", "cancelled", "reason", "release_slot", "crowded", "_in_thread", "_left")

    #: Guards the hand-over between the loop and a worker thread; held for a few instructions, so one lock
    #: for all requests costs less than creating one for each.
    _lock = threading.Lock()

    def __init__(self, api: str, request_id: str) -> None:
        self.api = api
        self.request_id = request_id
        #: Set once the request is cancelled; `reason` says why ("disconnect" or "timeout").
        self.cancelled = False
        self.reason: str | None = None
        #: Gives back the API's concurrency slot; set by whoever acquired one for this request.
        self.release_slot: Callable[[], None] = _nothing
        #: Set by the transport when it read other requests after this one before its call began: the server
        #: is busy, and a model file's call runs in a worker thread rather than on the loop (`Api.call`).
        self.crowded = False
        self._in_thread = False
        self._left = False

    def cancel(self, reason: str) -> None:
        if not self.cancelled:
            self.reason = reason
            self.cancelled = True

    # A sync stage cannot be interrupted. When its request leaves early (timeout, disconnect), the worker
    # thread keeps the concurrency slot until the stage returns, so that max_concurrency stays a promise
    # about user code and not only about HTTP requests.

    def enter_thread(self) -> bool:
        """Called by a worker thread before user code; False when the request has already left."""
        with self._lock:
            if self._left:
                return False
            self._in_thread = True
            return True

    def exit_thread(self) -> bool:
        """Called by a worker thread after user code; True when it must release the slot itself."""
        with self._lock:
            self._in_thread = False
            return self._left

    def leave(self) -> bool:
        """Called when the request is done; True when the caller must release the slot now."""
        with self._lock:
            self._left = True
            return not self._in_thread


def _nothing() -> None:
    return None


current: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar("modelserve_request", default=None)


class Tracer(Protocol):
    """What the lower layers call of the process's tracing (`modelserve.tracing.Tracing`), when it is on."""

    def instrument_batcher(self, batcher: Any) -> None: ...

    def job_context(self) -> str: ...

    def job(self, run: Any, job: Any, api: str) -> Any: ...

    def log_ids(self) -> tuple[str, str] | None: ...


#: The process's tracing (`modelserve.tracing`) once ``--tracing`` turned it on, else None: the parts that trace
#: when it is on (a batcher, a job's submit and run, log lines) read it where they are built, or once per job.
tracing: Tracer | None = None


def is_cancelled() -> bool:
    """True when the request being served was cancelled (client gone, or timeout).

    Safe to call from sync stages running in worker threads::

        def predict(self, inputs):
            for step in range(1000):
                if modelserve.is_cancelled():
                    return None
                ...
    """
    ctx = current.get()
    return ctx is not None and ctx.cancelled


def current_request_id() -> str | None:
    ctx = current.get()
    return ctx.request_id if ctx is not None else None
