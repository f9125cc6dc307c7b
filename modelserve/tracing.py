"""OpenTelemetry tracing: a server span per request, children for its stages, a span per batch and per job.

Everything that touches OpenTelemetry is here, and this module is imported only when tracing is on
(``--tracing``, ``tracing: true`` in modelserve.yaml, or ``MODELSERVE_TRACING=1``). Off, nothing is wrapped
and the request path is the one it always was: `install` is what turns it on, and it works by wrapping, at
build time, what a request goes through:

- the route handlers of the exchanges (`traced_routes`): the server span (HTTP semantic conventions), the
  caller's ``traceparent``/``tracestate`` continued, ``traceparent`` on the answer, the span current while
  the request runs (user code sees it, in worker threads too: they run in a copy of the request's context);
- an API's `Api.call` (`instrument`): the wait for a slot (``modelserve.queue.duration`` on the server
  span), a user error recorded as a span event (its type, message and traceback text, never its locals), a
  stream's lifetime (``modelserve.stream``), the encoding of the answer (``modelserve.encode.duration``);
- an API's stage timer: one span per stage (``modelserve.stage.<name>``), made when the stage returns from
  the time it took, so that no stage runs a line more than before;
- a `Batcher` (its ``entry`` and ``trace`` hooks): each waiting request remembers its span, and the batch
  runs in a span of its own (a new trace, ``modelserve.batch``) *linked* to each of them;
- a job (`job_context` when submitted, `job` when run): the submit's span context and time are stored with
  the job, and whichever process runs it continues that trace: ``modelserve.job.queue`` (the time it
  waited) and ``modelserve.job`` (its run, the stages below it);
- a WebSocket session (`websocket`, called by `modelserve.http.websocket`): a server span for the session,
  continuing the handshake's ``traceparent``, and a ``modelserve.websocket.message`` span per message handled.

Spans go to an OTLP exporter (HTTP/protobuf, or gRPC with ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``) through
`_Batches`, a batch span processor configured by the standard ``OTEL_BSP_*`` variables, and the exporter by
the other standard ``OTEL_*`` ones (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_SERVICE_NAME``...). A span that
cannot be exported (the queue full, a bad endpoint, the collector down) never fails a request: it is dropped,
counted in ``modelserve_spans_dropped_total`` and warned about once.

What a traced request costs is measured by ``benchmarks/tracing_cost.py`` and ``tracing_inprocess.py``. The
Python SDK's span object costs ~40-50 us to make and its OTLP encoder ~17-80 us a span on the 2-core machine,
so with modelserve's own provider a route's server span is `modelserve._spans.LiveSpan` (its stages kept as
they are, written by `modelserve._otlp`), a stage span of any other span is made as a finished
`ReadableSpan` (~4 us, `Tracing._finished`), the queue wait and the encoding are attributes of the server
span, not spans, and the OTLP/HTTP export encodes with `modelserve._otlp` (`_EncodedHere`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from modelserve import context as request_context
from modelserve.errors import ConfigError, HTTPError, LoadError, UserCodeError, install_hint

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor, TracerProvider
    from opentelemetry.sdk.trace import Tracer as SdkTracer
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from modelserve import _spans
    from modelserve._spans import Head, LiveSpan, ServerSpans
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
_traced: ContextVar[_Traced | LiveSpan | None] = ContextVar("modelserve_traced", default=None)
_W3C = TraceContextTextMapPropagator()
_lock = threading.Lock()
_installed: Tracing | None = None
#: The parent context of a request that names none: a new trace (cheaper than extracting from no headers).
_NEW_TRACE = otel_context.Context()
#: ``OTEL_EXPORTER_OTLP_PROTOCOL`` values: the module of the exporter of each, and the logger it writes to.
EXPORTERS = {
    "http/protobuf": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
}


class _Traced:
    """What the wrappers of one request or job share: its span, when its call began and returned."""

    __slots__ = ("span", "called", "staged", "returned", "route")

    def __init__(self, span: trace.Span, route: bool = False) -> None:
        self.span = span
        self.called = 0
        self.staged = False
        self.returned = 0
        #: Whether a route's server span (which names the request id from the answer's header itself).
        self.route = route


def install() -> Tracing:
    """Turn tracing on in this process (once; each worker process of ``--workers N`` installs its own).

    The tracer provider is the global one when the embedding program already set one; otherwise modelserve
    sets one: the resource from ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` (where they name no
    ``service.name``, ``modelserve``; no ``service.version``, modelserve's), the sampler from
    ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG``, and the OTLP exporter of ``OTEL_EXPORTER_OTLP_PROTOCOL``
    (``http/protobuf``, the default, or ``grpc``; its endpoint from ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) behind a batch span processor (``OTEL_BSP_*``).
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
    exporter = _exporter()
    from modelserve import __version__

    # modelserve's defaults yield to what the environment names (OTEL_SERVICE_NAME, or ``service.name`` and
    # ``service.version`` in OTEL_RESOURCE_ATTRIBUTES), as the SDK's own resource lets them
    given = OTELResourceDetector().detect().attributes
    defaults = {"service.name": "modelserve", "service.version": __version__}
    attributes: dict[str, Any] = {key: value for key, value in defaults.items() if key not in given}
    attributes["process.pid"] = os.getpid()  # which worker of --workers N made the span
    provider = TracerProvider(resource=_Resource(Resource.create(attributes)))
    provider.add_span_processor(_Batches(exporter))
    trace.set_tracer_provider(provider)
    return provider


class _Resource(Resource):
    """The process's resource, its hash computed once: the SDK's OTLP encoder groups the spans of each batch by
    their resource, hashing it for every span, and the SDK's hash is a JSON dump of its attributes (~10 us a
    span on the 2-core machine, a fifth of the encoding)."""

    def __init__(self, resource: Resource) -> None:
        super().__init__(resource.attributes, resource.schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return other is self or super().__eq__(other)


def _exporter() -> SpanExporter:
    """The OTLP exporter of ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or ``OTEL_EXPORTER_OTLP_PROTOCOL``."""
    import importlib

    variable = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
    protocol = os.environ.get(variable, "").strip()
    if not protocol:
        variable = "OTEL_EXPORTER_OTLP_PROTOCOL"
        protocol = os.environ.get(variable, "").strip() or "http/protobuf"
    module_name = EXPORTERS.get(protocol.lower())
    if module_name is None:
        raise ConfigError(
            f"{variable}={protocol!r} is not a protocol modelserve exports spans with: use one of "
            + ", ".join(EXPORTERS)
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise LoadError(
            f"tracing with {variable}={protocol} needs the OTLP {protocol} exporter ({exc.name} is missing). "
            f"Install it with: {install_hint('tracing')}"
        ) from None
    # The exporter logs every failed try (a line per retry, per batch): `_Batches` warns once and counts instead.
    quiet = logging.getLogger(module_name.rsplit(".", 1)[0])
    if quiet.level == logging.NOTSET:
        quiet.setLevel(logging.CRITICAL)
    exporter: SpanExporter = module.OTLPSpanExporter()
    return _encoded_here(exporter) if module_name == EXPORTERS["http/protobuf"] else exporter


class _EncodedHere(SpanExporter):
    """The OTLP/HTTP exporter with its spans encoded by `modelserve._otlp` (about half the time of the SDK's
    encoder, which a traced request pays for in the export thread) and sent by the exporter's own client: its
    endpoint, headers, compression, timeout and retries."""

    def __init__(self, exporter: SpanExporter, client: Any) -> None:
        self.exporter = exporter
        self.client = client

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from modelserve import _otlp

        try:
            data = _otlp.encode(spans)
        except Exception:  # a value `_otlp` has no form for: the SDK's encoder, the reference, decides
            return self.exporter.export(spans)
        result = self.client.export(data)
        return SpanExportResult.SUCCESS if getattr(result, "success", False) else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


def _encoded_here(exporter: SpanExporter) -> SpanExporter:
    """`exporter` (the SDK's OTLP/HTTP one) as `_EncodedHere`, when its private client is there and `_otlp`'s
    bytes mean what the SDK's encoder gives for spans like modelserve's; else itself, with one warning."""
    from modelserve import _otlp

    client = getattr(exporter, "_client", None)
    if callable(getattr(client, "export", None)) and _otlp.same_as_sdk(_sample_spans()):
        return _EncodedHere(exporter, client)
    logger.warning(
        "tracing: this OTLP/HTTP exporter is not as modelserve expects; spans are encoded by its own encoder "
        "(about twice the CPU time per span)"
    )
    return exporter


def _sample_spans() -> list[ReadableSpan | LiveSpan]:
    """A server span of a remote parent with every kind of attribute value, an event, a link and an error
    status, and a stage span below it, as the SDK's spans and as modelserve's own (`LiveSpan`, of a remote
    parent and of a new trace): what `_encoded_here` checks `modelserve._otlp` on."""
    remote = SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True, TraceFlags(1), TraceState([("k", "v")])
    )
    mine = SpanContext(remote.trace_id, 0x1111111111111111, False, TraceFlags(1), remote.trace_state)
    scope = InstrumentationScope(SCOPE, "0")
    resource = Resource.create({"service.name": "modelserve"})
    attributes: dict[str, Any] = {"s": "text", "i": -3, "f": 0.5, "b": False, "list": ["a", "b"], "ints": [1, 2]}
    server = ReadableSpan(
        "POST /check",
        mine,
        remote,
        resource=resource,
        attributes=attributes,
        events=[Event("exception", {"exception.type": "ValueError"}, timestamp=2)],
        links=[Link(remote, {"n": 1})],
        kind=SpanKind.SERVER,
        status=Status(StatusCode.ERROR, "HTTP 500"),
        start_time=1,
        end_time=4,
        instrumentation_scope=scope,
    )
    stage = SpanContext(remote.trace_id, 0x2222222222222222, False, TraceFlags(1), remote.trace_state)
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    # modelserve's own server span, with its stages (`modelserve._spans`), continuing the remote caller's trace
    owner = ServerSpans(ALWAYS_ON, RandomIdGenerator(), resource, scope, lambda span: None, lambda: Head(attributes))
    live = owner.start("POST /live", trace.set_span_in_context(trace.NonRecordingSpan(remote)))
    live.record_exception(ValueError("bad"), {"modelserve.stage": "predict"})
    live.set_status(Status(StatusCode.ERROR, "HTTP 500"))
    live.stage("predict", 1e-8, live.start_time + 10)
    live.end()
    new = owner.start("GET /new", _NEW_TRACE)  # a new trace
    new.stage("preprocess", 5e-9, new.start_time + 5)
    new.end()
    return [
        live,
        new,
        server,
        ReadableSpan(
            "modelserve.stage.predict",
            stage,
            mine,
            resource=resource,
            start_time=2,
            end_time=3,
            instrumentation_scope=scope,
        ),
    ]


def _setting(name: str, default: int) -> int:
    """A positive whole number from the environment (``OTEL_BSP_*``); `default` when unset or not one."""
    text = os.environ.get(name, "").strip()
    try:
        value = int(text)
    except ValueError:
        if text:
            logger.warning("tracing: %s=%r is not a whole number; %d is used", name, text, default)
        return default
    return value if value > 0 else default


class _Batches(SpanProcessor):
    """Ended spans exported in batches by a thread of its own, and the spans it could not export counted.

    The SDK's `BatchSpanProcessor` does the same, but drops the spans that find its queue full with a log line
    each and no count. Here a span is dropped when ``OTEL_BSP_MAX_QUEUE_SIZE`` spans wait already (default
    8192) or when the exporter fails its batch (the collector down); both are counted in `dropped`, and each
    cause is warned about once per process. A batch is exported when ``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` spans
    wait (default 2048: a quarter of as many exports as the SDK's 512, each holding the GIL a while, for the
    same spans) or every ``OTEL_BSP_SCHEDULE_DELAY`` ms (default 5000).
    """

    def __init__(self, exporter: SpanExporter) -> None:
        self.exporter = exporter
        self.max_queue = _setting("OTEL_BSP_MAX_QUEUE_SIZE", 8192)
        self.batch = min(_setting("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 2048), self.max_queue)
        self.delay = _setting("OTEL_BSP_SCHEDULE_DELAY", 5000) / 1000
        #: How long the shutdown waits for the last export (a collector that never answers must not hold the exit).
        self.timeout = _setting("OTEL_BSP_EXPORT_TIMEOUT", 30000) / 1000
        #: Ended spans: the SDK's `ReadableSpan`s and modelserve's `LiveSpan`s (a server span with its stages).
        self.queue: deque[Any] = deque()
        #: How many spans the queue holds (a `LiveSpan` counts with its stages).
        self.pending = 0
        #: Spans dropped so far: the queue full, or their batch failed to export.
        self.dropped = 0
        self._warned: set[str] = set()
        #: Where the spans go, for the warning of a failed export: the URL the exporter was given (the SDK's
        #: exporters keep it, privately), else the variable that names it.
        inner = exporter.exporter if isinstance(exporter, _EncodedHere) else exporter
        endpoint = getattr(inner, "_endpoint", None)
        self.endpoint = endpoint if isinstance(endpoint, str) and endpoint else "OTEL_EXPORTER_OTLP_ENDPOINT"
        self._stopped = False
        self._start()
        os.register_at_fork(after_in_child=self._start)  # a forked worker exports with a thread of its own

    def _start(self) -> None:
        """The export thread, and what it shares (new in a forked child: the parent's may be held there)."""
        self.queue.clear()
        self.pending = 0
        self._queueing = threading.Lock()
        self._counting = threading.Lock()
        self._exporting = threading.Lock()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._work, name="modelserve-spans", daemon=True)
        self._thread.start()

    def on_start(self, span: Any, parent_context: otel_context.Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is not None and context.trace_flags.sampled:
            self.add(span)

    def add(self, span: ReadableSpan | LiveSpan) -> None:
        """Queue an ended, sampled span for export (or count it dropped when the queue is full)."""
        size = 1 + len(span.stages) if type(span) is LiveSpan else 1  # len(span), in line
        with self._queueing:
            if self.pending + size > self.max_queue:
                full = None
            else:
                self.queue.append(span)
                self.pending += size
                full = self.pending >= self.batch
        if full is None:
            self._drop(size, "full")
        elif full and not self._wake.is_set():
            self._wake.set()

    def _drop(self, count: int, why: str) -> None:
        with self._counting:
            self.dropped += count
            if why in self._warned:
                return
            self._warned.add(why)
        if why == "full":
            logger.warning(
                "tracing: spans are made faster than they are exported (%d wait already, OTEL_BSP_MAX_QUEUE_SIZE); "
                "spans that find the queue full are dropped and counted in modelserve_spans_dropped_total, and "
                "requests go on (sample fewer with OTEL_TRACES_SAMPLER_ARG)",
                self.max_queue,
            )
        else:
            logger.warning(
                "tracing: %d span(s) could not be exported (is the collector at %s up?); spans that cannot be "
                "exported are dropped and counted in modelserve_spans_dropped_total, and requests go on",
                count,
                self.endpoint,
            )

    def _work(self) -> None:
        while not self._stopped:
            full = self._wake.wait(self.delay)
            self._wake.clear()
            self._export(full)
        self._export()  # what the shutdown left

    def _export(self, full_only: bool = False) -> None:
        """Export what waits now, a batch at a time; with `full_only` (a full batch woke the thread), full batches
        only: the rest waits for the next full batch or the schedule's delay. (Draining the queue whenever a
        batch filled exported every few spans that came during the last export, one POST each: at one
        connection, four in ten samples of the process were the export thread's HTTP client.)"""
        queue = self.queue
        least = self.batch if full_only else 1
        ours = isinstance(self.exporter, _EncodedHere)
        with self._exporting:
            while self.pending >= least:
                batch: list[Any] = []
                size = 0
                with self._queueing:  # a batch of `self.batch` spans, or a server span's stages more
                    while queue and size < self.batch:
                        span = queue.popleft()
                        batch.append(span)
                        size += len(span) if type(span) is LiveSpan else 1
                    self.pending -= size
                try:  # another exporter than modelserve's own takes the SDK's spans only
                    result = self.exporter.export(batch if ours else _spans.readable(batch))
                except Exception:  # an exporter must not raise; one that does loses its batch, as a failure would
                    result = SpanExportResult.FAILURE
                if result is not SpanExportResult.SUCCESS:
                    self._drop(size, "failed")

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._wake.set()
        self._thread.join(self.timeout)
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export what waits now, waited for at most `timeout_millis` (the export goes on in a thread of its
        own: a collector that never answers must not hold the caller, the server's shutdown)."""
        flushing = threading.Thread(target=self._export, name="modelserve-spans-flush", daemon=True)
        flushing.start()
        flushing.join(timeout_millis / 1000)
        return not flushing.is_alive()


def dropped_spans() -> int:
    """Spans this process could not export so far (the queue full, or the exporter failing)."""
    provider = trace.get_tracer_provider()
    processor = getattr(provider, "_active_span_processor", None)
    return sum(one.dropped for one in getattr(processor, "_span_processors", ()) if isinstance(one, _Batches))


class Tracing:
    """The tracer and the wrappers that trace a server's requests, batches and jobs."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        from modelserve import __version__

        self.tracer = provider.get_tracer(SCOPE, __version__)
        # A finished child span (a stage) is handed to modelserve's own processor as a `ReadableSpan` when the
        # provider is the one modelserve set up (`_provider`): ~4 us instead of the SDK's ~40 us for a span it
        # starts and ends. An embedding program's provider gets spans through its tracer (`_finished`).
        processors = getattr(getattr(provider, "_active_span_processor", None), "_span_processors", ())
        ours = [one for one in processors if isinstance(one, _Batches)]
        self._direct = ours[0] if len(ours) == len(processors) == 1 and isinstance(self.tracer, SdkTracer) else None
        self._resource = provider.resource if isinstance(provider, TracerProvider) else None
        self._scope = InstrumentationScope(SCOPE, __version__)
        self._ids = getattr(self.tracer, "id_generator", None)
        #: The server spans of modelserve's own provider, made without the SDK's span (`modelserve._spans`);
        #: None with an embedding program's provider, whose tracer makes them.
        self.spans: ServerSpans | None = None
        sampler = getattr(self.tracer, "sampler", None)
        if self._direct is not None and self._ids is not None and sampler is not None and self._resource is not None:
            # the tracer's own scope, so that its spans and these are grouped as one in an export
            scope = getattr(self.tracer, "_instrumentation_scope", None)
            self._scope = scope if isinstance(scope, InstrumentationScope) else self._scope
            self.spans = ServerSpans(sampler, self._ids, self._resource, self._scope, self._direct.add, _Heads())

    def _finished(self, name: str, parent: trace.Span, start: int, end: int) -> None:
        """A child of `parent` (a recording span) from `start` to `end` (ns since the epoch), ended already."""
        if self._direct is None or self._ids is None:
            with trace.use_span(parent, end_on_exit=False):
                self.tracer.start_span(name, start_time=start).end(end_time=end)
            return
        parent_context = parent.get_span_context()
        # As the SDK makes a child of a sampled local parent: its trace, flags and state, a new span id.
        context = SpanContext(
            parent_context.trace_id,
            self._ids.generate_span_id(),
            False,
            parent_context.trace_flags,
            parent_context.trace_state,
        )
        self._direct.add(
            ReadableSpan(
                name,
                context,
                parent_context,
                resource=self._resource,
                start_time=start,
                end_time=end,
                instrumentation_scope=self._scope,
            )
        )

    # --------------------------------------------------------------------------------------------
    # build time

    def instrument(self, server: ModelServer) -> None:
        """Trace `server`'s APIs (their calls and stages) and count its dropped spans; before its routes are
        built (an exchange reads ``api.call`` once, when it is made)."""
        for api in server.apis.values():
            self._instrument_api(api)
        _count_dropped(server.metrics)
        _flushed_at_close(server)
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
        global _PROPAGATED
        _PROPAGATED = _propagated_headers()
        for route in table:
            route.handlers = {
                method: (_TracedRoute if self.spans is None else _LiveRoute)(handler, self, route.path)
                if getattr(handler, "writes_access_line", False)
                else handler
                for method, handler in route.handlers.items()
            }

    def _instrument_api(self, api: Api) -> None:
        from modelserve.api import Stream

        call = api.call
        tracer = self.tracer

        async def traced_call(value: Any, ctx: request_context.RequestContext, **options: Any) -> Any:
            traced = _traced.get()
            if isinstance(traced, LiveSpan):  # a route's own server span (the usual case, so its steps are in line)
                if traced.recording:  # what its end reads (a span that is not recorded reads nothing)
                    traced.called = time.time_ns()
                    traced.request_id = ctx.request_id
                try:
                    result = await call(value, ctx, **options)
                except HTTPError as exc:  # UserCodeError among them
                    _record_failure(traced, exc)
                    raise
                if traced.recording:  # not sampled: no child of it is either
                    if isinstance(result, Stream):
                        _trace_stream(tracer, result)
                    else:
                        traced.returned = time.time_ns()
                return result
            if traced is not None:
                traced.called, traced.staged = time.time_ns(), False
                span = traced.span
            else:  # a call that no route or job of ours traces (gRPC): no spans of ours
                span = trace.get_current_span()
            if traced is None or not traced.route:
                span.set_attribute("modelserve.request_id", ctx.request_id)
            try:
                result = await call(value, ctx, **options)
            except HTTPError as exc:  # UserCodeError among them
                _record_failure(span, exc)
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
        finished = self._finished

        def traced_timer(name: str, seconds: float) -> None:
            timer(name, seconds)
            if name == "job":  # a job's whole run, which its own span already covers
                return
            traced = _traced.get()
            if isinstance(traced, LiveSpan):  # a route's own server span: the stage is kept as it is (`_spans`)
                if traced.recording and not traced.end_time:  # `LiveSpan.stage`, in line (a call less a stage)
                    traced.stages.append((name, seconds, time.time_ns()))
                return
            if traced is None or not traced.span.is_recording():  # nothing of ours traces it, or not sampled
                return
            end = time.time_ns()
            start = end - int(seconds * 1e9)
            if not traced.staged:
                traced.staged = True
                if traced.called and start > traced.called:  # the wait for a slot and a worker thread
                    traced.span.set_attribute("modelserve.queue.duration", (start - traced.called) / 1e9)
            finished("modelserve.stage." + name, traced.span, start, end)

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
    # WebSockets

    def websocket(self, scope: Scope, route: str, api: str, request_id: str) -> WebSocketTrace:
        """The server span of a WebSocket session, begun at its handshake (`modelserve.http.websocket`)."""
        return WebSocketTrace(self, scope, route, api, request_id)

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


def _record_failure(span: trace.Span, exc: HTTPError) -> None:
    """A call that failed, on its span: user code's failure as an event (`_record_user_error`), a refusal (a 4xx
    among them, and a call its client left, 499) as the span's status with its code and message."""
    if isinstance(exc, UserCodeError):
        _record_user_error(span, exc)
    else:
        span.set_status(Status(StatusCode.ERROR, f"{exc.status_code}: {exc.message}"))


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


def _flushed_at_close(server: ModelServer) -> None:
    """Have `server`'s close (the app's shutdown) export the spans that wait, once everything it closes has
    ended its spans: a worker of ``--workers N`` is ended by uvicorn's re-raised SIGTERM once its app has shut
    down, before the provider's own flush at the interpreter's exit could run, and lost the spans of its last
    ``OTEL_BSP_SCHEDULE_DELAY``. Waited for at most ``OTEL_BSP_EXPORT_TIMEOUT`` ms."""
    import asyncio

    close = server.close
    timeout = _setting("OTEL_BSP_EXPORT_TIMEOUT", 30000)

    async def close_then_flush() -> None:
        try:
            await close()
        finally:
            flush = getattr(trace.get_tracer_provider(), "force_flush", None)
            if callable(flush):
                await asyncio.to_thread(flush, timeout)

    server.close = close_then_flush  # type: ignore[method-assign]  # on the instance: the app's lifespan reads it


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
        self.latency = api.metrics.latency if api is not None else None
        from modelserve.metrics import Exemplars

        #: The exemplars of the API's latency histogram (one per bucket a second).
        self.exemplars = Exemplars(self.latency) if self.latency is not None else None
        #: What every request of this route has in common, copied into each span's attributes.
        self.attributes: dict[str, Any] = {"http.route": route}
        if api is not None:
            self.attributes["modelserve.api"] = api.name

    @property
    def __self__(self) -> object:
        return getattr(self.handler, "__self__", None)

    @property
    def __func__(self) -> object:
        return getattr(self.handler, "__func__", None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        method = scope["method"]  # HEAD too, on a GET route
        span = self.tracer.start_span(
            f"{method} {self.route}",
            context=_parent(scope),
            kind=SpanKind.SERVER,
            attributes=_server_attributes(scope, self.attributes, method),
        )
        traced = _Traced(span, route=True)
        token = otel_context.attach(trace.set_span_in_context(span))
        traced_token = _traced.set(traced)
        status = 0
        answered: dict[str, Any] = {}  # the attributes the answer tells, set with the status at the end (one lock)

        async def traced_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", ()))
                for key, value in headers:
                    if key == b"x-request-id":
                        answered["modelserve.request_id"] = value.decode("latin-1")
                headers += _trace_headers(span.get_span_context())
                message = {**message, "headers": headers}
                if traced.returned:  # the time from the result to the answer's first byte
                    answered["modelserve.encode.duration"] = (time.time_ns() - traced.returned) / 1e9
            await send(message)

        try:
            await self.handler(scope, receive, traced_send)
        except BaseException as exc:
            _record_error(span, exc)
            raise
        finally:
            _traced.reset(traced_token)
            otel_context.detach(token)
            _end_server_span(span, status, answered)
            context = span.get_span_context()
            if self.exemplars is not None and context.trace_flags.sampled:
                now = time.perf_counter()
                self.exemplars.offer(now - started, now, context.trace_id)


class _LiveRoute(_TracedRoute):
    """`_TracedRoute` with modelserve's own server span (`modelserve._spans.LiveSpan`): the same span, its
    attributes, status, events and stages, at a fraction of the SDK span's cost (see that module)."""

    def __init__(
        self, handler: Callable[[Scope, Receive, Send], Awaitable[None]], tracing: Tracing, route: str
    ) -> None:
        super().__init__(handler, tracing, route)
        assert tracing.spans is not None
        self.spans = tracing.spans
        #: The span's name for each method ("POST /iris"), made once.
        self.names: dict[str, str] = {}
        #: Whether the handler is an exchange (`modelserve.http.exchange.exchange_route`), which asks the span for
        #: the answer's headers as it writes them (`_ANSWERING`); other handlers' answers go through a wrapped
        #: send. (The wrapped send cost a traced request ~1.3 us more: a coroutine per message and the closure.)
        self.answering = getattr(getattr(handler, "__func__", None), "honours_answering", False) is True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]  # HEAD too, on a GET route
        name = self.names.get(method)
        if name is None:
            name = self.names.setdefault(method, f"{method} {self.route}")
        # One pass over the headers for the caller's context and the user agent (`_parent` and `_Heads` each
        # made one)
        carrier = agent = None
        for key, value in scope["headers"]:
            if key == b"user-agent":
                if agent is None:
                    agent = value
            elif key in _PROPAGATED:
                if carrier is None:
                    carrier = {}
                carrier[key.decode("latin-1")] = value.decode("latin-1")
        parent = propagate.extract(carrier) if carrier is not None else _NEW_TRACE
        span = self.spans.start(name, parent, scope, self.attributes, method, agent)
        token = otel_context.attach(span.in_context(parent))
        traced_token = _traced.set(span)
        if self.answering:  # the exchange adds the span's headers to the answer itself: no wrapped send
            scope[_ANSWERING] = span.answering
        else:
            send = _answered_send(send, span)
        try:
            await self.handler(scope, receive, send)
        except BaseException as exc:
            _record_error(span, exc)
            raise
        finally:
            _traced.reset(traced_token)
            otel_context.detach(token)
            if span.recording:
                attributes = span.attributes
                if span.request_id is not None:
                    attributes["modelserve.request_id"] = span.request_id
                status = span.answered
                if status:
                    attributes["http.response.status_code"] = status
                    if status >= 400:  # a 4xx too (`_end_server_span`)
                        attributes["error.type"] = str(status)
                        span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
                span.end()
                if self.exemplars is not None and span.sampled:  # the request's time from its span's own clock
                    seconds = (span.end_time - span.start_time) / 1e9
                    self.exemplars.offer(seconds, time.perf_counter(), span.trace_id)


def _answered_send(send: Send, span: LiveSpan) -> Send:
    """`send` telling `span` of the answer and adding the headers that name it (for a handler that is not an
    exchange: see `_LiveRoute.answering`)."""

    async def traced_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = message.get("headers", ())
            request_id = None
            if span.request_id is None:  # refused before its call: the id its answer names
                for key, value in headers:
                    if key == b"x-request-id":
                        request_id = value.decode("latin-1")
            # A new list (the headers may be a Response's own), in the message (made for this send)
            message["headers"] = [*headers, *span.answering(message["status"], request_id)]
        await send(message)

    return traced_send


def _propagated_headers() -> frozenset[bytes]:
    """The request headers that the global propagator reads (``OTEL_PROPAGATORS``, or the embedding program's
    ``propagate.set_global_textmap``), as ASGI names them; W3C trace context's and baggage where it names none."""
    fields = getattr(propagate.get_global_textmap(), "fields", None) or ()
    return frozenset(field.lower().encode("latin-1") for field in fields) or _W3C_HEADERS


def _parent(scope: Scope) -> otel_context.Context:
    """The caller's context from a request's headers that the global propagator reads (`_PROPAGATED`); a new
    trace without them."""
    carrier = None
    for key, value in scope["headers"]:
        if key in _PROPAGATED:
            if carrier is None:
                carrier = {}
            carrier[key.decode("latin-1")] = value.decode("latin-1")
    return propagate.extract(carrier) if carrier is not None else _NEW_TRACE


class _Heads:
    """A server span's first attributes (`_server_attributes`) as a `modelserve._spans.Head`, made once for
    requests alike (route, method, path, query, scheme, HTTP version, server, client address, user agent) and
    shared by their spans, so that they are made and encoded once (the first `_HEADS_KEPT` kinds of request)."""

    def __init__(self) -> None:
        self.made: dict[tuple[Any, ...], Head] = {}

    def __call__(self, scope: Scope, common: dict[str, Any], method: str, agent: bytes | None) -> Head:
        """The first attributes of a request to the route of `common`, with `method`, whose first
        ``user-agent`` header is `agent` (found by the route in its one pass over the headers)."""
        client = scope.get("client")
        alike = (
            id(common),  # a route's own, held by the route as long as it serves
            method,
            scope["path"],
            scope.get("query_string"),
            scope.get("scheme"),
            scope.get("http_version"),
            scope.get("server"),
            client[0] if client else None,
            agent,
        )
        head = self.made.get(alike)
        if head is None:
            head = Head(_server_attributes(scope, common, method))
            if len(self.made) < _HEADS_KEPT:
                self.made[alike] = head
        return head


#: How many kinds of request `_Heads` keeps the first attributes of.
_HEADS_KEPT = 1024


def _server_attributes(scope: Scope, common: dict[str, Any], method: str) -> dict[str, Any]:
    """A server span's attributes (OpenTelemetry's HTTP semantic conventions), known when the request arrives.

    One dict given to `start_span`: the SDK checks each attribute once, where `set_attribute` after the start
    takes a lock each time. ``client.port`` (opt-in in the conventions) is left out."""
    attributes = {
        **common,
        "http.request.method": method,
        "url.path": scope["path"],
        "url.scheme": scope.get("scheme", "http"),
        "network.protocol.version": scope.get("http_version", "1.1"),
    }
    query = scope.get("query_string")
    if query:
        attributes["url.query"] = query.decode("latin-1")
    server = scope.get("server")
    if server:
        attributes["server.address"], attributes["server.port"] = server[0], server[1]
    client = scope.get("client")
    if client:
        attributes["client.address"] = client[0]
    for key, value in scope["headers"]:
        if key == b"user-agent":
            attributes["user_agent.original"] = value.decode("latin-1")
            break
    return attributes


def _trace_headers(context: SpanContext) -> list[tuple[bytes, bytes]]:
    """``traceparent`` (and ``tracestate``) naming the span of `context`, for the answer."""
    if not context.is_valid:
        return []
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    headers = [(b"traceparent", parent.encode("latin-1"))]
    if context.trace_state:
        headers.append((b"tracestate", context.trace_state.to_header().encode("latin-1")))
    return headers


def _end_server_span(span: trace.Span, status: int, attributes: dict[str, Any] | None = None) -> None:
    """End a server span with the status of its answer: an error (and ``error.type``) from 400 on. A 4xx too,
    though OpenTelemetry's HTTP conventions leave a server span's status unset for one: a refused request shows
    as that request's failure in a trace view (docs/observability.md, "Errors")."""
    attributes = attributes if attributes is not None else {}
    if status:
        attributes["http.response.status_code"] = status
        if status >= 400:
            attributes["error.type"] = str(status)
            span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
    if attributes:
        span.set_attributes(attributes)
    span.end()


class WebSocketTrace:
    """The server span of one WebSocket session and a ``modelserve.websocket.message`` span per message it
    handles; `modelserve.http.websocket` calls it at the session's steps.

    The session span continues the handshake's ``traceparent`` and is current from the handshake on; the
    accept carries ``traceparent`` (`accepted`). A message's span begins when it arrives (`received`) and ends
    when it is handled (`handled`: the app asks for the next message, or has answered it); it is current
    meanwhile, so the stages that handle it are its children and user code sees it."""

    def __init__(self, tracing: Tracing, scope: Scope, route: str, api: str, request_id: str) -> None:
        self.tracing = tracing
        common = {"http.route": route, "modelserve.api": api, "modelserve.request_id": request_id}
        self.span = tracing.tracer.start_span(
            f"GET {route}",
            context=_parent(scope),
            kind=SpanKind.SERVER,
            attributes=_server_attributes(scope, common, "GET"),
        )
        self.traced = _Traced(self.span)
        self.context = trace.set_span_in_context(self.span)
        self._token = otel_context.attach(self.context)
        self._traced_token = _traced.set(self.traced)
        self.message: trace.Span | None = None
        self.messages = 0

    def accepted(self, message: Message) -> Message:
        """The accept, with ``traceparent`` naming the session's span among its headers."""
        headers = [*message.get("headers", ()), *_trace_headers(self.span.get_span_context())]
        return {**message, "headers": headers}

    def received(self, message: Message) -> None:
        """A message arrived: its span begins (ending the one before, if it was not handled) and is current."""
        self.handled()
        self.messages += 1
        if not self.span.is_recording():
            return
        data = message.get("bytes")
        size = len(data) if data is not None else len((message.get("text") or "").encode("utf-8"))
        attributes = {"modelserve.websocket.message.type": "bytes" if data is not None else "text"}
        attributes["modelserve.websocket.message.size"] = size  # type: ignore[assignment]
        self.message = self.tracing.tracer.start_span(
            "modelserve.websocket.message", context=self.context, attributes=attributes
        )
        otel_context.attach(trace.set_span_in_context(self.message))  # undone by `handled` or the session's end
        _traced.set(_Traced(self.message))

    def handled(self) -> None:
        """The message being handled was: its span ends, and the session's span is current again."""
        if self.message is None:
            return
        self.message.end()
        self.message = None
        otel_context.attach(self.context)
        _traced.set(self.traced)

    def end(self, status: int, error: BaseException | None = None) -> None:
        """The session ended with `status` (101 as it should, 499 left by its client, else an error's);
        called where the span began (the context it attached is given back there)."""
        self.handled()
        _traced.reset(self._traced_token)
        otel_context.detach(self._token)
        if error is not None:
            _record_error(self.span, error)
        self.span.set_attribute("modelserve.websocket.messages", self.messages)
        _end_server_span(self.span, status)


#: ``modelserve.http._asgi.ANSWERING`` (a layer above this one: tests/tracing/test_tracing.py checks they match).
_ANSWERING = "modelserve.answering"
#: The headers of W3C trace context and baggage (the default ``OTEL_PROPAGATORS``, ``tracecontext,baggage``).
_W3C_HEADERS = frozenset({b"traceparent", b"tracestate", b"baggage"})
#: The request headers a trace is continued from: those the global propagator reads, learned when the routes
#: are built (`Tracing.traced_routes`).
_PROPAGATED = _W3C_HEADERS
