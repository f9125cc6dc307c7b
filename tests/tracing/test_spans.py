"""modelserve/_spans.py: a server span made without the SDK's span behaves as the SDK's does for user code, is
sampled as the SDK's samplers decide, is encoded as the SDK encodes the same spans, and reaches any exporter."""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry import trace  # noqa: E402 - after the skips
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace import Span as SdkSpan  # noqa: E402
from opentelemetry.sdk.trace import sampling as sdk_sampling  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator  # noqa: E402
from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: E402
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags, TraceState  # noqa: E402

from modelserve import _otlp, tracing  # noqa: E402
from modelserve._spans import Head, LiveSpan, Sampling, ServerSpans  # noqa: E402

SCOPE = InstrumentationScope("modelserve", "1")
RESOURCE = Resource.create({"service.name": "spans-test"})


def owner(sampler: sdk_sampling.Sampler = sdk_sampling.ALWAYS_ON, ended: Any = None) -> ServerSpans:
    return ServerSpans(
        sampler,
        RandomIdGenerator(),
        RESOURCE,
        SCOPE,
        ended if ended is not None else (lambda span: None),
        lambda: Head({"http.route": "/iris", "http.request.method": "POST"}),
    )


def remote(sampled: bool, is_remote: bool = True) -> SpanContext:
    return SpanContext(random.getrandbits(128) or 1, random.getrandbits(64) or 1, is_remote, TraceFlags(int(sampled)))


SAMPLERS = {
    "always_on": sdk_sampling.ALWAYS_ON,
    "always_off": sdk_sampling.ALWAYS_OFF,
    "traceidratio": sdk_sampling.TraceIdRatioBased(0.3),
    "parentbased_always_on": sdk_sampling.ParentBased(sdk_sampling.ALWAYS_ON),
    "parentbased_always_off": sdk_sampling.ParentBased(sdk_sampling.ALWAYS_OFF),
    "parentbased_traceidratio": sdk_sampling.ParentBasedTraceIdRatio(0.3),
    "parentbased, remote unsampled parents sampled": sdk_sampling.ParentBased(
        sdk_sampling.ALWAYS_OFF, remote_parent_not_sampled=sdk_sampling.ALWAYS_ON
    ),
}


@pytest.mark.parametrize("name", SAMPLERS)
def test_the_standard_samplers_decide_as_the_sdk_s_own(name: str) -> None:
    sampler = SAMPLERS[name]
    decide = Sampling(sampler)
    rng = random.Random(7)
    for _ in range(400):
        trace_id = rng.getrandbits(128) or 1
        for parent in (None, remote(True), remote(False), remote(True, False), remote(False, False)):
            context = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent else None
            if parent is not None:
                trace_id = parent.trace_id
            expected = sampler.should_sample(context, trace_id, "POST /iris").decision.is_sampled()
            assert decide(parent, trace_id) is expected, (name, parent, trace_id)
            if parent is None and decide.new_trace is not None:  # made once: the same
                assert decide.new_trace is expected, (name, trace_id)


def test_a_sampler_of_another_kind_is_asked_itself() -> None:
    class EveryOther(sdk_sampling.Sampler):
        def __init__(self) -> None:
            self.asked: list[Any] = []

        def should_sample(self, parent_context: Any, trace_id: int, name: str, *args: Any, **kwargs: Any) -> Any:
            attributes = args[1] if len(args) > 1 else kwargs.get("attributes")
            self.asked.append((name, dict(attributes or {})))
            decision = sdk_sampling.Decision.RECORD_AND_SAMPLE if len(self.asked) % 2 else sdk_sampling.Decision.DROP
            return sdk_sampling.SamplingResult(decision, {"sampler.says": "yes"})

        def get_description(self) -> str:
            return "EveryOther"

    sampler = EveryOther()
    assert Sampling(sampler)(None, 5) is None and Sampling(sampler).new_trace is None
    spans = owner(sampler)
    first, second = spans.start("POST /iris", tracing._NEW_TRACE), spans.start("POST /iris", tracing._NEW_TRACE)
    assert sampler.asked == [("POST /iris", {"http.route": "/iris", "http.request.method": "POST"})] * 2
    assert first.sampled and first.is_recording() and first.all_attributes()["sampler.says"] == "yes"
    assert not second.sampled and not second.is_recording()


def test_a_live_span_continues_its_caller_s_trace_and_names_itself_in_traceparent() -> None:
    caller = SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True, TraceFlags(1), TraceState([("k", "v")])
    )
    span = owner().start("POST /iris", trace.set_span_in_context(trace.NonRecordingSpan(caller)))
    context = span.get_span_context()
    assert context.trace_id == caller.trace_id and context.span_id != caller.span_id and not context.is_remote
    assert context.trace_flags.sampled and context.trace_state == caller.trace_state
    assert span.parent == caller
    assert span.traceparent() == f"00-{caller.trace_id:032x}-{context.span_id:016x}-01".encode()
    unsampled = owner(sdk_sampling.ParentBased(sdk_sampling.ALWAYS_ON)).start(
        "POST /iris", trace.set_span_in_context(trace.NonRecordingSpan(remote(False)))
    )
    assert unsampled.traceparent().endswith(b"-00") and not unsampled.is_recording()


@pytest.mark.parametrize("baggage", [False, True])
def test_a_live_span_s_context_is_the_api_s(baggage: bool) -> None:
    from opentelemetry import baggage as otel_baggage
    from opentelemetry import context as otel_context

    parent = otel_baggage.set_baggage("tenant", "a") if baggage else otel_context.Context()
    span = owner().start("POST /iris", parent)
    made = span.in_context(parent)
    assert made == trace.set_span_in_context(span, parent)  # what the API's own call gives
    assert trace.get_current_span(made) is span
    assert otel_baggage.get_baggage("tenant", made) == ("a" if baggage else None)


def test_the_answer_s_headers_tell_the_span_of_it() -> None:
    caller = SpanContext(1, 2, True, TraceFlags(1), TraceState([("k", "v")]))
    span = owner().start("POST /iris", trace.set_span_in_context(trace.NonRecordingSpan(caller)))
    span.returned = span.start_time  # its call returned as it began
    assert span.answering(503, "refused-1") == [(b"traceparent", span.traceparent()), (b"tracestate", b"k=v")]
    assert span.answered == 503 and span.request_id == "refused-1"
    assert span.attributes["modelserve.encode.duration"] >= 0
    unsampled = owner(sdk_sampling.ALWAYS_OFF).start("POST /iris", tracing._NEW_TRACE)
    assert unsampled.answering(200, "id") == [(b"traceparent", unsampled.traceparent())]
    assert unsampled.request_id is None and not unsampled.attributes  # a span that records nothing learns nothing


def test_user_code_sets_attributes_events_and_status_as_on_the_sdk_s_span(caplog: pytest.LogCaptureFixture) -> None:
    span = owner().start("POST /iris", tracing._NEW_TRACE)
    span.set_attribute("user.count", 3)
    span.set_attribute("user.tags", ["a", "b"])
    span.set_attribute("http.route", "/changed")  # one it started with: both kept as one dict from here
    span.set_attribute("user.odd", object())  # type: ignore[arg-type]  # kept as the SDK keeps it
    span.set_attributes({"user.ratio": 0.5})
    span.add_event("checkpoint", {"n": 1})
    span.record_exception(ValueError("no good"), {"modelserve.stage": "predict"})
    span.set_status(Status(StatusCode.ERROR, "HTTP 500"))
    span.set_status(StatusCode.UNSET)  # ignored, as the SDK ignores it
    span.update_name("POST /renamed")
    attributes = span.all_attributes()
    assert attributes["user.count"] == 3 and tuple(attributes["user.tags"]) == ("a", "b")
    assert attributes["http.route"] == "/changed" and attributes["http.request.method"] == "POST"
    assert attributes["user.ratio"] == 0.5
    reference = TracerProvider().get_tracer("reference").start_span("reference")
    assert isinstance(reference, SdkSpan)
    reference.set_attribute("user.odd", object())  # type: ignore[arg-type]
    assert ("user.odd" in attributes, attributes.get("user.odd")) == (
        "user.odd" in (reference.attributes or {}),
        (reference.attributes or {}).get("user.odd"),
    )
    assert [event.name for event in span.events] == ["checkpoint", "exception"]
    exception = span.events[1].attributes or {}
    assert exception["exception.type"] == "ValueError" and exception["exception.message"] == "no good"
    assert exception["modelserve.stage"] == "predict" and "ValueError: no good" in str(
        exception["exception.stacktrace"]
    )
    assert span.status is not None and span.status.status_code is StatusCode.ERROR
    span.end()
    span.set_attribute("after.end", 1)  # an ended span takes nothing more
    assert "after.end" not in span.all_attributes() and not span.is_recording() and span.name == "POST /renamed"
    assert _otlp.same_as_sdk([span])


def test_user_code_sees_the_live_span_as_current_and_its_own_spans_are_children() -> None:
    span = owner().start("POST /iris", tracing._NEW_TRACE)
    with trace.use_span(span, end_on_exit=False):
        assert trace.get_current_span() is span
        child = TracerProvider().get_tracer("user").start_span("user work")
    assert isinstance(child, SdkSpan) and child.parent == span.get_span_context()


def test_a_live_span_reaches_another_exporter_as_the_sdk_s_spans_and_counts_with_its_stages() -> None:
    class Kept(SpanExporter):
        def __init__(self) -> None:
            self.spans: list[ReadableSpan] = []
            self.exported = threading.Event()

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            self.spans += spans
            self.exported.set()
            return SpanExportResult.SUCCESS

    exporter = Kept()
    batches = tracing._Batches(exporter)
    try:
        span = owner(ended=batches.add).start("POST /iris", tracing._NEW_TRACE)
        span.stage("predict", 0.002, span.start_time + 3_000_000)
        span.stage("postprocess", 0.001, span.start_time + 4_000_000)
        span.end(span.start_time + 5_000_000)
        assert batches.pending == 3  # the server span and its two stages
        batches.force_flush()
        assert all(type(one) is ReadableSpan for one in exporter.spans)
        server, predict, post = exporter.spans
        assert server.name == "POST /iris" and server.attributes == {
            "http.route": "/iris",
            "http.request.method": "POST",
        }
        assert [predict.name, post.name] == ["modelserve.stage.predict", "modelserve.stage.postprocess"]
        assert predict.parent == server.context and post.parent == server.context
        assert predict.start_time == span.start_time + 1_000_000 and predict.end_time == span.start_time + 3_000_000
        assert _otlp.same_as_sdk([span])
    finally:
        batches.shutdown()


def test_spans_that_find_the_queue_full_are_counted_as_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")

    class Nowhere(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    batches = tracing._Batches(Nowhere())
    try:
        spans = owner(ended=batches.add)
        for _ in range(3):  # three spans each: the first fits, the others are dropped whole
            span = spans.start("POST /iris", tracing._NEW_TRACE)
            span.stage("predict", 0.001, span.start_time + 2_000_000)
            span.stage("postprocess", 0.001, span.start_time + 3_000_000)
            span.end()
        assert batches.pending == 3 and batches.dropped == 6
    finally:
        batches.shutdown()


def test_a_span_that_is_not_sampled_is_not_exported() -> None:
    ended: list[LiveSpan] = []
    span = owner(sdk_sampling.ALWAYS_OFF, ended.append).start("POST /iris", tracing._NEW_TRACE)
    span.set_attribute("user.count", 1)
    span.stage("predict", 0.001, span.start_time + 1)
    span.end()
    assert not ended and not span.stages and not span.all_attributes()
