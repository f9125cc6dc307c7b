"""OpenTelemetry tracing: a server span per request, children for its stages, a span per batch and per job.

Everything that touches OpenTelemetry is here, and this module is imported only when tracing is on
(``--tracing``, ``tracing: true`` in modelserve.yaml, or ``MODELSERVE_TRACING=1``). Off, nothing is wrapped
and the request path is the one it always was: `install` is what turns it on, and it works by wrapping, at
build time, what a request goes through:

- the route handlers of the exchanges (`traced_routes`): the server span (HTTP semantic conventions), the
  caller's ``traceparent``/``tracestate`` continued, ``traceparent`` on the answer, the span current while
  the request runs (user code sees it, in worker threads too: they run in a copy of the request's context);
- an API's `Api.call` (`instrument`): the wait for a slot (``modelserve.queue``), a user error recorded as
  a span event (its type, message and traceback text, never its locals), a stream's lifetime
  (``modelserve.stream``), the encoding of the answer (``modelserve.encode``);
- an API's stage timer: one span per stage (``modelserve.stage.<name>``), made when the stage returns from
  the time it took, so that no stage runs a line more than before;
- a `Batcher` (its ``entry`` and ``trace`` hooks): each waiting request remembers its span, and the batch
  runs in a span of its own (a new trace, ``modelserve.batch``) *linked* to each of them;
- a job (`job_context` when submitted, `job` when run): the submit's span context and time are stored with
  the job, and whichever process runs it continues that trace: ``modelserve.job.queue`` (the time it
  waited) and ``modelserve.job`` (its run, the stages below it).

Spans go to an OTLP/HTTP exporter (protobuf) in a batch span processor, configured by the standard
``OTEL_*`` variables (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER``...).
An exporter that fails (a bad endpoint, the collector down) never fails a request: its spans are dropped,
counted in ``modelserve_spans_dropped_total`` and warned about once.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from modelserve import context as request_context
from modelserve.errors import HTTPError, LoadError, UserCodeError, install_hint

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - exercised by the install-hint test in a venv without it
    raise LoadError(
        f"tracing needs opentelemetry-sdk and its OTLP exporter ({exc.name} is missing). "
        f"Install it with: {install_hint('tracing')}"
    ) from None

if TYPE_CHECKING:
    from starlette.types import Message, Receive, Scope, Send

    from modelserve.api import Api
    from modelserve.batching import Batcher
    from modelserve.jobs.base import ClaimedJob
    from modelserve.metrics import Metrics
    from modelserve.server import ModelServer

logger = logging.getLogger("modelserve")

#: The instrumentation scope of every span modelserve makes.
SCOPE = "modelserve"
#: The request (or job) being traced in this context: what the wrappers below share about it.
_traced: ContextVar[_Traced | None] = ContextVar("modelserve_traced", default=None)
_W3C = TraceContextTextMapPropagator()
_lock = threading.Lock()
_installed: Tracing | None = None


class _Traced:
    """What the wrappers of one request or job share: its span, when its call began and returned."""

    __slots__ = ("span", "called", "staged", "returned")

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.called = 0
        self.staged = False
        self.returned = 0


def install() -> Tracing:
    """Turn tracing on in this process (once; each worker process of ``--workers N`` installs its own).

    The tracer provider is the global one when the embedding program already set one; otherwise modelserve
    sets one: the resource from ``OTEL_SERVICE_NAME`` (default ``modelserve``) and ``OTEL_RESOURCE_ATTRIBUTES``,
    the sampler from ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG``, and an OTLP/HTTP exporter (its
    endpoint from ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) in a
    `BatchSpanProcessor` (``OTEL_BSP_*``).
    """
    global _installed
    with _lock:
        if _installed is None:
            _installed = Tracing(_provider())
            request_context.tracing = _installed
        return _installed


def _provider() -> trace.TracerProvider:
    existing = trace.get_tracer_provider()
    if isinstance(existing, TracerProvider):
        return existing  # the embedding program's own
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as exc:
        raise LoadError(
            f"tracing needs the OTLP/HTTP exporter ({exc.name} is missing). Install it with: {install_hint('tracing')}"
        ) from None
    from modelserve import __version__

    attributes: dict[str, Any] = {
        "service.name": os.environ.get("OTEL_SERVICE_NAME") or "modelserve",
        "service.version": __version__,
        "process.pid": os.getpid(),  # which worker of --workers N made the span
    }
    provider = TracerProvider(resource=Resource.create(attributes))
    # The exporter logs every failed try (a line per retry, per batch): `_Counted` warns once and counts instead.
    quiet = logging.getLogger("opentelemetry.exporter.otlp.proto.http")
    if quiet.level == logging.NOTSET:
        quiet.setLevel(logging.CRITICAL)
    provider.add_span_processor(BatchSpanProcessor(_Counted(OTLPSpanExporter())))
    trace.set_tracer_provider(provider)
    return provider


class _Counted(SpanExporter):
    """The exporter, counting the spans it could not deliver (warned about once per process)."""

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self.dropped = 0
        self._warned = False

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        try:
            result = self.exporter.export(spans)
        except Exception:  # an exporter must not raise; one that does loses its batch, as a failure would
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.dropped += len(spans)
            if not self._warned:
                self._warned = True
                logger.warning(
                    "tracing: %d span(s) could not be exported (is the collector at OTEL_EXPORTER_OTLP_ENDPOINT "
                    "up?); spans that cannot be exported are dropped and counted in "
                    "modelserve_spans_dropped_total, and requests go on",
                    len(spans),
                )
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


def dropped_spans() -> int:
    """Spans this process could not export so far."""
    provider = trace.get_tracer_provider()
    processor = getattr(provider, "_active_span_processor", None)
    total = 0
    for one in getattr(processor, "_span_processors", ()):
        exporter = getattr(one, "span_exporter", None)
        if isinstance(exporter, _Counted):
            total += exporter.dropped
    return total


class Tracing:
    """The tracer and the wrappers that trace a server's requests, batches and jobs."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        from modelserve import __version__

        self.tracer = provider.get_tracer(SCOPE, __version__)

    # --------------------------------------------------------------------------------------------
    # build time

    def instrument(self, server: ModelServer) -> None:
        """Trace `server`'s APIs (their calls and stages) and count its dropped spans; before its routes are
        built (an exchange reads ``api.call`` once, when it is made)."""
        for api in server.apis.values():
            self._instrument_api(api)
        _count_dropped(server.metrics)
        from modelserve.metrics import has_exemplar_seam

        children = [api.metrics.latency for api in server.apis.values()]
        if not server.metrics.multiprocess and not all(has_exemplar_seam(child) for child in children):
            logger.warning(
                "tracing: this prometheus-client's histograms are not as modelserve expects; the request "
                "latency histogram carries no exemplars (traces are not affected)"
            )

    def traced_routes(self, table: list[Any]) -> None:
        """Wrap, in place, every route handler of `table` (`modelserve.http.routing.Route`s) that runs an exchange
        (an API's call, a job's route) in its server span."""
        for route in table:
            route.handlers = {
                method: _TracedRoute(handler, self, route.path)
                if getattr(handler, "writes_access_line", False)
                else handler
                for method, handler in route.handlers.items()
            }

    def _instrument_api(self, api: Api) -> None:
        from modelserve.api import Stream

        call = api.call
        tracer = self.tracer

        async def traced_call(value: Any, ctx: request_context.RequestContext, **options: Any) -> Any:
            span = trace.get_current_span()
            span.set_attribute("modelserve.request_id", ctx.request_id)
            traced = _traced.get()
            if traced is not None:  # else a call that no route or job of ours traces (gRPC): no spans of ours
                traced.called, traced.staged = time.time_ns(), False
            try:
                result = await call(value, ctx, **options)
            except UserCodeError as exc:
                _record_user_error(span, exc)
                raise
            except HTTPError as exc:
                span.set_status(Status(StatusCode.ERROR, f"{exc.status_code}: {exc.message}"))
                raise
            if traced is None or not span.is_recording():  # not sampled: no child of it is either
                return result
            if isinstance(result, Stream):
                _trace_stream(tracer, result)
            else:
                traced.returned = time.time_ns()
            return result

        api.call = traced_call  # type: ignore[method-assign]  # on the instance: the exchanges read it there
        timer = api.metrics.stage_timer

        def traced_timer(name: str, seconds: float) -> None:
            timer(name, seconds)
            if name == "job":  # a job's whole run, which its own span already covers
                return
            traced = _traced.get()
            if traced is None or not traced.span.is_recording():  # nothing of ours traces it, or not sampled
                return
            end = time.time_ns()
            start = end - int(seconds * 1e9)
            if not traced.staged:
                traced.staged = True
                if traced.called and start > traced.called:
                    tracer.start_span("modelserve.queue", start_time=traced.called).end(end_time=start)
            span = tracer.start_span(
                "modelserve.stage." + name, start_time=start, attributes={"modelserve.stage": name}
            )
            span.end(end_time=end)

        api.metrics.stage_timer = traced_timer  # type: ignore[method-assign]  # read when the pipeline is built

    def instrument_batcher(self, batcher: Batcher) -> None:
        """Each request waiting in `batcher` remembers its span; each batch runs in a span linked to them."""
        batcher.entry = _linked_entry()
        batcher.trace = self._batch_call

    def _batch_call(self, batcher: Batcher, batch: Sequence[Any], call: Callable[[list[Any]], Any]) -> Any:
        """`call` (the batcher's own) wrapped in the span of one batch: a new trace, linked to every request."""
        tracer = self.tracer
        links = [Link(entry.link) for entry in batch if getattr(entry, "link", None) is not None]
        attributes: dict[str, Any] = {"modelserve.api": batcher.name, "modelserve.batch.size": len(batch)}

        def start() -> trace.Span:
            return tracer.start_span(
                "modelserve.batch", context=otel_context.Context(), links=links, attributes=attributes
            )

        if batcher.sync_call is None:

            async def run_async(items: list[Any]) -> Any:
                span = start()
                token = _traced.set(_Traced(span))  # the batch's own: not the request that happened to dispatch it
                try:
                    with trace.use_span(span, end_on_exit=True, record_exception=False):
                        try:
                            return await call(items)
                        except BaseException as exc:
                            _record_error(span, exc)
                            raise
                finally:
                    _traced.reset(token)

            return run_async

        def run(items: list[Any]) -> Any:
            span = start()
            token = _traced.set(_Traced(span))
            try:
                with trace.use_span(span, end_on_exit=True, record_exception=False):
                    try:
                        return call(items)
                    except BaseException as exc:
                        _record_error(span, exc)
                        raise
            finally:
                _traced.reset(token)

        return run

    # --------------------------------------------------------------------------------------------
    # jobs

    def job_context(self) -> str:
        """What a job stores of the request that submitted it: its trace context and the time, one line."""
        carrier: dict[str, str] = {}
        _W3C.inject(carrier)
        return " ".join([str(time.time_ns()), carrier.get("traceparent", "-"), carrier.get("tracestate", "")]).rstrip()

    def job(self, run: Coroutine[Any, Any, None], job: ClaimedJob, api: str) -> Coroutine[Any, Any, None]:
        """`run` (one job's run) in the span of the job, continuing the trace of its submit when it has one."""
        tracer = self.tracer

        async def traced() -> None:
            submitted, parent = _parse_job_context(job.trace)
            claimed = time.time_ns()
            attributes: dict[str, Any] = {
                "modelserve.api": api,
                "modelserve.job_id": job.id,
                "modelserve.job.attempts": job.attempts,
            }
            if submitted is not None:
                queue = tracer.start_span(
                    "modelserve.job.queue", context=parent, start_time=min(submitted, claimed), attributes=attributes
                )
                queue.end(end_time=claimed)
            span = tracer.start_span("modelserve.job", context=parent, kind=SpanKind.CONSUMER, attributes=attributes)
            token = _traced.set(_Traced(span))
            try:
                with trace.use_span(span, end_on_exit=True, record_exception=False):
                    await run
            finally:
                _traced.reset(token)

        return traced()

    # --------------------------------------------------------------------------------------------
    # logs

    @staticmethod
    def log_ids() -> tuple[str, str] | None:
        """(trace id, span id) in hex of the span current here, for log lines; None outside one."""
        span_context = trace.get_current_span().get_span_context()
        if not span_context.is_valid:
            return None
        return format(span_context.trace_id, "032x"), format(span_context.span_id, "016x")


def _parse_job_context(stored: str | None) -> tuple[int | None, otel_context.Context | None]:
    """(submit time in ns, the submit's context) from what `Tracing.job_context` stored (None, None: nothing)."""
    if not stored:
        return None, None
    parts = stored.split(" ")
    try:
        submitted = int(parts[0])
    except ValueError:
        return None, None
    carrier = {"traceparent": parts[1] if len(parts) > 1 else "-"}
    if len(parts) > 2:
        carrier["tracestate"] = parts[2]
    return submitted, _W3C.extract(carrier)


def _linked_entry() -> type:
    from modelserve.batching import _Entry

    class LinkedEntry(_Entry):
        """A request waiting for its batch, with the span context of its request (for the batch's link)."""

        __slots__ = ("link",)

        def __init__(self, item: Any, future: Any, arrived: float) -> None:
            super().__init__(item, future, arrived)
            span_context = trace.get_current_span().get_span_context()
            self.link = span_context if span_context.is_valid else None

    return LinkedEntry


def _record_error(span: trace.Span, exc: BaseException) -> None:
    if isinstance(exc, UserCodeError):
        _record_user_error(span, exc)
    else:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, type(exc).__name__))


def _record_user_error(span: trace.Span, exc: UserCodeError) -> None:
    """A failure of user code as a span event: its type, message and traceback text (never its locals)."""
    error = exc.error if exc.error is not None else exc
    span.record_exception(error, attributes={"modelserve.stage": exc.stage})
    span.set_status(Status(StatusCode.ERROR, exc.detail))


def _trace_stream(tracer: trace.Tracer, stream: Any) -> None:
    """A span from the stream's first chunk asked to its close, with its chunks counted."""
    span = tracer.start_span("modelserve.stream")
    next_chunk, close = stream.next, stream.aclose
    chunks = 0

    async def traced_next() -> Any:
        nonlocal chunks
        try:
            chunk = await next_chunk()
        except HTTPError as exc:
            if isinstance(exc, UserCodeError):
                _record_user_error(span, exc)
            raise  # a timeout or a disconnect: the close below tells it as the stream's "cancelled" event
        except BaseException as exc:
            _record_error(span, exc)
            raise
        if chunk is not stream.END:
            chunks += 1
        return chunk

    async def traced_close() -> None:
        try:
            await close()
        finally:
            if span.is_recording():
                span.set_attribute("modelserve.stream.chunks", chunks)
                if stream.ctx.cancelled:
                    span.add_event("cancelled", {"modelserve.reason": stream.ctx.reason or "disconnect"})
                    span.set_status(Status(StatusCode.ERROR, f"cancelled: {stream.ctx.reason or 'disconnect'}"))
                span.end()

    stream.next = traced_next
    stream.aclose = traced_close


def _count_dropped(metrics: Metrics) -> None:
    from prometheus_client import Counter

    owner = None if metrics.multiprocess else metrics.registry
    counter = Counter(
        "modelserve_spans_dropped", "Trace spans that could not be exported (the collector down)", registry=owner
    )
    counted = 0

    def refresh() -> None:
        nonlocal counted
        now = dropped_spans()
        if now > counted:
            counter.inc(now - counted)
            counted = now

    metrics.add_refresher(refresh)


class _TracedRoute:
    """A route handler that runs an exchange, in the server span of each of its requests.

    It shows the handler's ``__self__`` and ``__func__`` (as `modelserve.http.access` does): the API keys
    and the OpenAPI document find the endpoint of a route through them."""

    writes_access_line = True

    def __init__(
        self, handler: Callable[[Scope, Receive, Send], Awaitable[None]], tracing: Tracing, route: str
    ) -> None:
        self.handler = handler
        self.tracer = tracing.tracer
        self.route = route
        endpoint = getattr(handler, "__self__", None)
        api = getattr(endpoint, "api", None)
        self.api: Api | None = api
        self.latency = api.metrics.latency if api is not None else None

    @property
    def __self__(self) -> object:
        return getattr(self.handler, "__self__", None)

    @property
    def __func__(self) -> object:
        return getattr(self.handler, "__func__", None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        carrier = {}
        for key, value in scope["headers"]:
            if key in _PROPAGATED:
                carrier[key.decode("latin-1")] = value.decode("latin-1")
        started = time.perf_counter()
        method = scope["method"]  # HEAD too, on a GET route
        span = self.tracer.start_span(
            f"{method} {self.route}",
            context=propagate.extract(carrier),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "http.route": self.route, "url.path": scope["path"]},
        )
        if span.is_recording():  # the rest only for a sampled request
            span.set_attributes(self._attributes(scope))
        traced = _Traced(span)
        token = otel_context.attach(trace.set_span_in_context(span))
        traced_token = _traced.set(traced)
        status = 0

        async def traced_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", ()))
                for key, value in headers:
                    if key == b"x-request-id":
                        span.set_attribute("modelserve.request_id", value.decode("latin-1"))
                answer: dict[str, str] = {}
                _W3C.inject(answer)
                headers += [(key.encode("latin-1"), value.encode("latin-1")) for key, value in answer.items()]
                message = {**message, "headers": headers}
                if traced.returned:
                    encoded = self.tracer.start_span("modelserve.encode", start_time=traced.returned)
                    encoded.end()
            await send(message)

        try:
            await self.handler(scope, receive, traced_send)
        except BaseException as exc:
            _record_error(span, exc)
            raise
        finally:
            _traced.reset(traced_token)
            otel_context.detach(token)
            if status:
                span.set_attribute("http.response.status_code", status)
                if status >= 400:
                    span.set_attribute("error.type", str(status))
                    span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
            span.end()
            if self.latency is not None and span.get_span_context().trace_flags.sampled:
                from modelserve.metrics import set_exemplar

                set_exemplar(
                    self.latency, time.perf_counter() - started, format(span.get_span_context().trace_id, "032x")
                )

    def _attributes(self, scope: Scope) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            "url.scheme": scope.get("scheme", "http"),
            "network.protocol.version": scope.get("http_version", "1.1"),
        }
        if self.api is not None:
            attributes["modelserve.api"] = self.api.name
        query = scope.get("query_string")
        if query:
            attributes["url.query"] = query.decode("latin-1")
        server = scope.get("server")
        if server:
            attributes["server.address"], attributes["server.port"] = server[0], server[1]
        client = scope.get("client")
        if client:
            attributes["client.address"], attributes["client.port"] = client[0], client[1]
        for key, value in scope["headers"]:
            if key == b"user-agent":
                attributes["user_agent.original"] = value.decode("latin-1")
                break
        return attributes


#: The request headers a trace is continued from (W3C trace context and baggage).
_PROPAGATED = frozenset({b"traceparent", b"tracestate", b"baggage"})
