"""Server spans of gRPC calls, when tracing is on (`modelserve.tracing`; imported only then).

The calls that run an API are traced, ``ModelInfer`` and ``ModelStreamInfer``, as over HTTP the routes that
run an exchange are (the probes, metadata and repository calls are not). Each one continues the caller's
``traceparent``/``tracestate`` (and ``baggage``) metadata entries and runs in a server span named as
OpenTelemetry's RPC conventions name it, ``inference.GRPCInferenceService/ModelInfer``, with ``rpc.system``
(``grpc``), ``rpc.service``, ``rpc.method`` and ``rpc.grpc.status_code``; its status is an error for the codes
those conventions count as the server's (UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE,
DATA_LOSS), and unset for the others (a NOT_FOUND or INVALID_ARGUMENT is the caller's doing). The span is
current while the call runs, so user code and log lines see it.

Below it is what an HTTP request's server span has: one span per stage and a generating API's
``modelserve.stream``, and on the span itself the wait for a slot (``modelserve.queue.duration``), the time
from the model's return to the answer (``modelserve.encode.duration``), the request id and a user error's
event. The API's own wrappers (`modelserve.tracing.Tracing.instrument`) make them for the request that
`modelserve.tracing` holds in its private ``_traced``, which only its own routes, jobs and batches set: this
module sets it too, for each gRPC call. That seam is checked once, when the server starts (`TracedCalls`);
without it gRPC calls keep their server spans, with one warning that what is below them is missing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from modelserve import tracing

logger = logging.getLogger("modelserve")

#: The methods traced: those that run an API.
TRACED = frozenset({"ModelInfer", "ModelStreamInfer"})
#: The codes that OpenTelemetry's RPC conventions make a server span's error.
SERVER_ERRORS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
#: The metadata entries a trace is continued from (W3C trace context and baggage).
PROPAGATED = frozenset({"traceparent", "tracestate", "baggage"})

Unary = Callable[[Any, Any], Awaitable[Any]]
Streaming = Callable[[AsyncIterator[Any], Any], AsyncIterator[Any]]


def _seam() -> tuple[ContextVar[Any], Callable[[Any], Any]] | None:
    """`modelserve.tracing`'s ``_traced`` and ``_Traced``, when they are as this module expects."""
    traced = getattr(tracing, "_traced", None)
    made = getattr(tracing, "_Traced", None)
    fields = set(getattr(made, "__slots__", ()))
    if isinstance(traced, ContextVar) and isinstance(made, type) and {"span", "returned", "route"} <= fields:
        return traced, made
    logger.warning(
        "tracing: modelserve.tracing is not as modelserve.grpc expects; gRPC calls get their server spans "
        "without their stage spans and their queue and encode durations"
    )
    return None


def _peer(context: Any) -> dict[str, Any]:
    """``network.peer.address`` and ``.port`` of a call from its peer (``ipv4:127.0.0.1:50312``)."""
    peer = context.peer() or ""
    family, _, rest = peer.partition(":")
    address, _, port = rest.rpartition(":")
    if family not in ("ipv4", "ipv6") or not port.isdigit():
        return {}
    return {"network.peer.address": address.strip("[]"), "network.peer.port": int(port)}


class TracedCalls:
    """Wraps the traced methods of a service (`TRACED`) in their server spans."""

    def __init__(self, service: str, host: str, port: int) -> None:
        self.tracer = tracing.install().tracer
        self.service = service
        self.host = host
        self.port = port
        self.seam = _seam()

    def wrap(self, method: str, function: Any, streaming: bool) -> Any:
        """`function` (a method of the servicer) in its server span when `method` is traced, else itself."""
        if method not in TRACED:
            return function
        return self.stream(method, function) if streaming else self.unary(method, function)

    def _start(self, method: str, context: Any) -> trace.Span:
        carrier = {}
        for key, value in context.invocation_metadata() or ():
            if key in PROPAGATED and isinstance(value, str):
                carrier[key] = value
        span = self.tracer.start_span(
            f"{self.service}/{method}",
            context=propagate.extract(carrier),
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": self.service, "rpc.method": method},
        )
        if span.is_recording():  # the rest only for a sampled call
            span.set_attributes({"server.address": self.host, "server.port": self.port, **_peer(context)})
        return span

    def _end(self, span: trace.Span, context: Any, error: BaseException | None) -> None:
        code = context.code()
        if not isinstance(code, grpc.StatusCode):  # None: the method returned, or raised without aborting
            if error is None or isinstance(error, GeneratorExit):
                code = grpc.StatusCode.OK
            elif isinstance(error, BaseException) and not isinstance(error, Exception):
                code = grpc.StatusCode.CANCELLED  # the client went away, or the deadline passed
            else:
                code = grpc.StatusCode.UNKNOWN
                span.record_exception(error)
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        if code in SERVER_ERRORS:
            details = context.details()
            if isinstance(details, bytes):
                details = details.decode(errors="replace")
            span.set_status(Status(StatusCode.ERROR, f"{code.name}: {details}" if details else code.name))
        span.end()

    @staticmethod
    def _encoded(span: trace.Span, state: Any) -> None:
        """``modelserve.encode.duration``: from the model's return until its answer is made (the last answer's,
        in a stream), as an HTTP request's span has it until its answer's first byte."""
        if state is not None and state.returned:
            span.set_attribute("modelserve.encode.duration", (time.time_ns() - state.returned) / 1e9)
            state.returned = 0

    def unary(self, method: str, function: Unary) -> Unary:
        seam = self.seam

        async def traced(request: Any, context: Any) -> Any:
            span = self._start(method, context)
            if span.is_recording():
                message = request[0] if type(request) is tuple else request  # (message, size): `server.sized`
                span.set_attribute("modelserve.api", message.model_name)
            state = seam[1](span) if seam is not None else None
            token = otel_context.attach(trace.set_span_in_context(span))
            state_token = seam[0].set(state) if seam is not None else None
            error: BaseException | None = None
            try:
                answer = await function(request, context)
                self._encoded(span, state)
                return answer
            except BaseException as exc:
                error = exc
                raise
            finally:
                if state_token is not None:
                    seam[0].reset(state_token)  # type: ignore[index]  # set only with the seam
                otel_context.detach(token)
                self._end(span, context, error)

        return traced

    def stream(self, method: str, function: Streaming) -> Streaming:
        seam = self.seam

        async def traced(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            span = self._start(method, context)
            state = seam[1](span) if seam is not None else None
            answers = function(requests, context)
            error: BaseException | None = None
            try:
                while True:
                    # The span is current while the servicer makes each answer, not across the yield: the
                    # stream may be closed from another context, where a context token cannot be reset.
                    token = otel_context.attach(trace.set_span_in_context(span))
                    state_token = seam[0].set(state) if seam is not None else None
                    try:
                        answer = await answers.__anext__()
                        self._encoded(span, state)
                    except StopAsyncIteration:
                        break
                    finally:
                        if state_token is not None:
                            seam[0].reset(state_token)  # type: ignore[index]  # set only with the seam
                        otel_context.detach(token)
                    yield answer
            except BaseException as exc:
                error = exc
                raise
            finally:
                await answers.aclose()  # type: ignore[attr-defined]  # the servicer's is an async generator
                self._end(span, context, error)

        return traced
