"""The server span of a traced request, made without the SDK's `Span` (the fast path of `modelserve.tracing`).

The SDK's `Tracer.start_span` costs a traced request ~50 us on the 2-core machine before its span does
anything: the sampler's `SamplingResult`, a `SpanContext`, a lock, its `BoundedAttributes` checking each of
the ~10 attributes a server span starts with, and again at its end. A server span's attributes are
modelserve's own and of known types, and its stage spans are known only when they have ended, so
`LiveSpan` keeps them as they are: a plain dict, and ``(name, start, end)`` for each stage. It implements
`opentelemetry.trace.Span`, so user code sees it as the current span, sets attributes on it, records events
and exceptions (what user code gives is checked as the SDK checks it), and the spans user code starts below
it are its children. At its end it goes to `modelserve.tracing._Batches` as it is: `modelserve._otlp` writes
its OTLP bytes (and its stages') from its fields, and `readable` makes the SDK's `ReadableSpan`s of it for
any other exporter.

`ServerSpans` starts them: the ids as the SDK's `RandomIdGenerator` makes them, and the sampler of the
provider consulted directly (`Sampling`). Used only when the tracer provider is the one modelserve set up;
an embedding program's provider gets the SDK's spans through its tracer, as before.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits, sampling
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.util import types

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
#: The attribute value types that need no check (a sequence is checked as the SDK checks it).
_PLAIN = frozenset({str, int, float, bool})
#: What a stage span's name begins with (then the stage's: ``modelserve.stage.predict``).
STAGE = "modelserve.stage."
_TRACEPARENT_SAMPLED = b"00-%032x-%016x-01"
_TRACEPARENT_NOT_SAMPLED = b"00-%032x-%016x-00"


def _span_key() -> str | None:
    """The key under which OpenTelemetry's API keeps the current span in a `Context`, learned through the API
    itself (``set_span_in_context`` on an empty context); None where that context is not one key holding the
    span (`LiveSpan.in_context` then asks the API each time)."""
    span = trace.NonRecordingSpan(SpanContext(1, 1, False))
    made = trace.set_span_in_context(span, otel_context.Context())
    if len(made) != 1:  # pragma: no cover
        return None
    key = next(iter(made))
    return key if type(key) is str and trace.get_current_span(otel_context.Context({key: span})) is span else None


_SPAN_KEY = _span_key()


class LiveSpan(trace.Span):
    """A server span, live from the request's arrival to its answer; see the module's docstring.

    It is also what the wrappers of `modelserve.tracing` share about the request (``span``, ``called``,
    ``returned``, ``route``: as `modelserve.tracing._Traced`)."""

    #: Always a server span, and always a route's (which names its request id itself).
    kind = SpanKind.SERVER
    route = True

    __slots__ = (
        "name",
        "trace_id",
        "span_id",
        "parent",
        "sampled",
        "recording",
        "trace_state",
        "start_time",
        "end_time",
        "head",
        "attributes",
        "dropped_attributes",
        "events",
        "status",
        "stages",
        "owner",
        "_context",
        "called",
        "returned",
        "request_id",
        "answered",
    )

    def __init__(
        self,
        owner: ServerSpans,
        name: str,
        trace_id: int,
        span_id: int,
        parent: SpanContext | None,
        sampled: bool,
        recording: bool,
        trace_state: TraceState | None,
        head: Head | None,
    ) -> None:
        self.owner = owner
        self.name = name
        self.trace_id = trace_id
        self.span_id = span_id
        #: The caller's span (a ``traceparent``), or None: a new trace.
        self.parent = parent
        self.sampled = sampled
        self.recording = recording
        self.trace_state = trace_state
        self.start_time = time.time_ns()
        self.end_time = 0
        #: The attributes it started with, shared with the spans of like requests (never changed), and the
        #: ones set since: where one of the first is set again, both are merged into `attributes`.
        self.head = head
        self.attributes: dict[str, Any] = {}
        self.dropped_attributes = 0
        self.events: Sequence[Event] = ()  # a list from the first event (most spans have none)
        self.status: Status | None = None
        #: Each stage span, ended: (the stage's name, its seconds, its end in ns since the epoch).
        self.stages: list[tuple[str, float, int]] = []
        self._context: SpanContext | None = None
        self.called = 0
        self.returned = 0
        #: The request's id (`modelserve.tracing` sets it, and the attribute at the span's end).
        self.request_id: str | None = None
        #: The status of the answer, once its first message is sent (0 before).
        self.answered = 0

    @property
    def span(self) -> LiveSpan:
        return self

    # --------------------------------------------------------------------------------------------
    # opentelemetry.trace.Span

    def get_span_context(self) -> SpanContext:
        context = self._context
        if context is None:
            flags = _SAMPLED if self.sampled else _NOT_SAMPLED
            context = SpanContext(self.trace_id, self.span_id, False, flags, self.trace_state)
            self._context = context
        return context

    def is_recording(self) -> bool:
        return self.recording and not self.end_time

    def set_attribute(self, key: str, value: types.AttributeValue) -> None:
        if not self.recording or self.end_time:
            return
        head = self.head
        if head is not None and key in head.attributes:
            self.attributes = {**head.attributes, **self.attributes}
            self.head = head = None
        attributes = self.attributes
        if key not in attributes:
            held = len(attributes) + (len(head.attributes) if head is not None else 0)
            if held >= self.owner.limits.max_span_attributes:  # type: ignore[operator]
                self.dropped_attributes += 1
                return
        if type(value) in _PLAIN and type(key) is str and key and self.owner.limits.max_attribute_length is None:
            attributes[key] = value
            return
        checked = BoundedAttributes(
            attributes={key: value}, max_value_len=self.owner.limits.max_attribute_length, immutable=False
        )  # the SDK's checks: a bad key or value is dropped with its warning
        attributes.update(checked)

    def set_attributes(self, attributes: types.Attributes) -> None:
        for key, value in (attributes or {}).items():
            self.set_attribute(key, value)

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        if not self.recording or self.end_time:
            return
        limits = self.owner.limits
        if limits.max_events is not None and len(self.events) >= limits.max_events:
            return
        checked = BoundedAttributes(
            limits.max_event_attributes, attributes, max_value_len=limits.max_attribute_length, immutable=True
        )
        event = Event(name, checked, timestamp if timestamp is not None else time.time_ns())
        if type(self.events) is list:
            self.events.append(event)
        else:
            self.events = [event]

    def add_link(self, context: SpanContext, attributes: types.Attributes = None) -> None:
        return None  # links are given when a span starts; a server span starts before user code runs

    def update_name(self, name: str) -> None:
        if self.recording and not self.end_time:
            self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if not self.recording or self.end_time:
            return
        if isinstance(status, StatusCode):
            status = Status(status, description)
        if self.status is not None and self.status.status_code is StatusCode.OK:
            return  # OK is final, as in the SDK
        if status.status_code is StatusCode.UNSET:
            return
        self.status = status

    def record_exception(
        self,
        exception: BaseException,
        attributes: types.Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        if not self.recording or self.end_time:
            return
        import traceback

        kind = type(exception)
        module = kind.__module__
        recorded: dict[str, Any] = {
            "exception.type": f"{module}.{kind.__qualname__}" if module and module != "builtins" else kind.__qualname__,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            recorded.update(attributes)
        self.add_event("exception", recorded, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self.end_time:
            return
        stages = self.stages
        if stages and self.called and self.recording:  # the wait for a slot and a worker thread, to the first stage
            name, seconds, end = stages[0]
            first = end - int(seconds * 1e9)
            if first > self.called:
                self.attributes["modelserve.queue.duration"] = (first - self.called) / 1e9
        self.end_time = end_time if end_time is not None else time.time_ns()
        if self.sampled:
            self.owner.ended(self)

    # --------------------------------------------------------------------------------------------

    def traceparent(self) -> bytes:
        """The W3C ``traceparent`` naming this span."""
        # bytes' own %-formatting: ~0.4 us, against ~1.2 for an f-string encoded (2-core machine, in a loop)
        return (_TRACEPARENT_SAMPLED if self.sampled else _TRACEPARENT_NOT_SAMPLED) % (self.trace_id, self.span_id)

    def answering(self, status: int, request_id: str | None) -> list[tuple[bytes, bytes]]:
        """The answer, `status`, is being sent: what the span learns of it, and the headers naming this span that
        it carries (``traceparent``, and ``tracestate`` where the trace has one): the exchange's
        ``modelserve.http._asgi.ANSWERING``."""
        self.answered = status
        if self.recording:
            if self.returned:  # the time from the result to the answer's first byte
                self.attributes["modelserve.encode.duration"] = (time.time_ns() - self.returned) / 1e9
            if self.request_id is None:  # refused before its call: the id its answer names
                self.request_id = request_id
        if self.trace_state:
            state = self.trace_state.to_header().encode("latin-1")
            return [(b"traceparent", self.traceparent()), (b"tracestate", state)]
        return [(b"traceparent", self.traceparent())]

    def in_context(self, parent_context: otel_context.Context) -> otel_context.Context:
        """`parent_context` (the caller's, or empty) with this span current in it: what
        ``trace.set_span_in_context`` gives, made in one step (~0.25 us against ~0.7)."""
        if _SPAN_KEY is None:  # pragma: no cover - an API whose span context is not one key (checked at import)
            return trace.set_span_in_context(self, parent_context)
        if not parent_context:
            return otel_context.Context({_SPAN_KEY: self})
        return otel_context.Context({**parent_context, _SPAN_KEY: self})

    def stage(self, name: str, seconds: float, end: int) -> None:
        """A stage span below this one (``modelserve.stage.<name>``), `seconds` long to `end` (ns since the
        epoch), ended already."""
        if self.recording and not self.end_time:
            self.stages.append((name, seconds, end))

    def all_attributes(self) -> dict[str, Any]:
        """Its attributes, those it started with and those set since."""
        head = self.head
        return self.attributes if head is None else {**head.attributes, **self.attributes}

    def readable(self) -> list[ReadableSpan]:
        """This span and its stages as the SDK's finished spans (for an exporter other than modelserve's own)."""
        owner = self.owner
        context = self.get_span_context()
        spans = [
            ReadableSpan(
                self.name,
                context,
                self.parent,
                resource=owner.resource,
                attributes=self.all_attributes(),
                events=self.events,
                kind=self.kind,
                status=self.status or Status(StatusCode.UNSET),
                start_time=self.start_time,
                end_time=self.end_time,
                instrumentation_scope=owner.scope,
            )
        ]
        for name, seconds, end in self.stages:
            child = SpanContext(self.trace_id, owner.span_id(), False, context.trace_flags, self.trace_state)
            spans.append(
                ReadableSpan(
                    STAGE + name,
                    child,
                    context,
                    resource=owner.resource,
                    start_time=end - int(seconds * 1e9),
                    end_time=end,
                    instrumentation_scope=owner.scope,
                )
            )
        return spans

    def __len__(self) -> int:
        """How many spans it exports: itself and its stages."""
        return 1 + len(self.stages)


class Head:
    """A server span's first attributes (`LiveSpan.head`), shared by the spans of requests alike (the same
    route, method, path, client address and user agent...), and their OTLP bytes, written once
    (`modelserve._otlp`)."""

    __slots__ = ("attributes", "encoded")

    def __init__(self, attributes: dict[str, Any]) -> None:
        self.attributes = attributes
        self.encoded: bytes | None = None


class ServerSpans:
    """Starts `LiveSpan`s for a provider's sampler and id generator, and hands the ended ones to `ended`."""

    def __init__(
        self,
        sampler: sampling.Sampler,
        ids: IdGenerator,
        resource: Resource,
        scope: InstrumentationScope,
        ended: Callable[[LiveSpan], None],
        head: Callable[..., Head],
    ) -> None:
        self.sampler = sampler
        #: ``head(*facts)``: a server span's first attributes, from what `start` is given.
        self.head = head
        self.decide = Sampling(sampler)
        self.ids = ids
        self.random_ids = type(ids) is RandomIdGenerator
        self.resource = resource
        self.scope = scope
        self.ended = ended
        #: The span limits of ``OTEL_SPAN_*``/``OTEL_ATTRIBUTE_*``, as the SDK's provider reads them.
        self.limits = SpanLimits()

    def span_id(self) -> int:
        if self.random_ids:
            span_id = random.getrandbits(64)
            while not span_id:  # pragma: no cover - one chance in 2**64
                span_id = random.getrandbits(64)
            return span_id
        return self.ids.generate_span_id()

    def start(self, name: str, parent_context: otel_context.Context, *facts: Any) -> LiveSpan:
        """The server span of a request whose caller's context is `parent_context` (empty: a new trace), its
        first attributes ``head(*facts)``, asked only for a span that records or a sampler that reads them."""
        parent: SpanContext | None = None
        if parent_context:
            parent = trace.get_current_span(parent_context).get_span_context()
            if not parent.is_valid:
                parent = None
        if parent is not None:
            trace_id = parent.trace_id
        elif self.random_ids:
            trace_id = random.getrandbits(128)
            while not trace_id:  # pragma: no cover
                trace_id = random.getrandbits(128)
        else:
            trace_id = self.ids.generate_trace_id()
        decided = self.decide.new_trace if parent is None else None  # a call less for most requests (~0.35 us)
        if decided is None:
            decided = self.decide(parent, trace_id)
        if decided is not None:
            sampled = recording = decided
            state = parent.trace_state if parent is not None else None
            head = self.head(*facts) if recording else None
        else:  # a sampler of another kind: asked, as the SDK asks it
            head = self.head(*facts)
            attributes = head.attributes
            result = self.sampler.should_sample(parent_context, trace_id, name, SpanKind.SERVER, attributes, None)
            decision = result.decision
            sampled, recording = decision is sampling.Decision.RECORD_AND_SAMPLE, decision is not sampling.Decision.DROP
            state = result.trace_state
            if result.attributes:
                head = Head({**attributes, **result.attributes})
        return LiveSpan(self, name, trace_id, self.span_id(), parent, sampled, recording, state, head)


class Sampling:
    """The decision of the SDK's standard samplers (``OTEL_TRACES_SAMPLER``: always_on, always_off,
    traceidratio and their parentbased_ forms), made without their `SamplingResult` (~4 us a request on the
    2-core machine); None for any other sampler, which `ServerSpans` asks itself.

    The parent-based sampler's delegates are private attributes of the SDK's `ParentBased`: where they are not
    there, it is asked too. `tests/tracing/test_spans.py` compares these decisions with the samplers' own."""

    def __init__(self, sampler: sampling.Sampler) -> None:
        self.root = _fast(sampler)
        self.parented: tuple[Callable[[int], bool], ...] | None = None
        if self.root is None and type(sampler) in _PARENT_BASED:
            delegates = [
                getattr(sampler, name, None)
                for name in ("_root", "_remote_parent_sampled", "_remote_parent_not_sampled")
                + ("_local_parent_sampled", "_local_parent_not_sampled")
            ]
            fast = [_fast(one) for one in delegates]
            if all(one is not None for one in fast):
                self.parented = tuple(fast)  # type: ignore[arg-type]
        first = self.root if self.root is not None else (self.parented[0] if self.parented is not None else None)
        #: The decision for a new trace (no caller's context) where it does not depend on the trace id
        #: (``always_on``, ``parentbased_always_on``...), made once; None where it does, or is asked.
        self.new_trace: bool | None = True if first is _always else False if first is _never else None

    def __call__(self, parent: SpanContext | None, trace_id: int) -> bool | None:
        if self.root is not None:
            return self.root(trace_id)
        parented = self.parented
        if parented is None:
            return None
        if parent is None:
            return parented[0](trace_id)
        sampled = parent.trace_flags.sampled
        if parent.is_remote:
            return (parented[1] if sampled else parented[2])(trace_id)
        return (parented[3] if sampled else parented[4])(trace_id)


#: The SDK's parent-based samplers (``parentbased_traceidratio`` is a class of its own).
_PARENT_BASED = (sampling.ParentBased, sampling.ParentBasedTraceIdRatio)


def _fast(sampler: Any) -> Callable[[int], bool] | None:
    """The decision of a sampler that needs only the trace id, or None."""
    if type(sampler) is sampling.StaticSampler:
        decision = getattr(sampler, "_decision", None)
        if decision is sampling.Decision.RECORD_AND_SAMPLE:
            return _always
        if decision is sampling.Decision.DROP:
            return _never
        return None
    if type(sampler) is sampling.TraceIdRatioBased:
        bound, limit = sampler.bound, sampler.TRACE_ID_LIMIT
        return lambda trace_id: trace_id & limit < bound
    return None


def _always(trace_id: int) -> bool:
    return True


def _never(trace_id: int) -> bool:
    return False


def readable(spans: Sequence[Any]) -> list[ReadableSpan]:
    """`spans` (`ReadableSpan`s and `LiveSpan`s) as `ReadableSpan`s only."""
    out: list[ReadableSpan] = []
    for span in spans:
        if type(span) is LiveSpan:
            out += span.readable()
        else:
            out.append(span)
    return out
