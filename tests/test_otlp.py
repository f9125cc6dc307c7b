"""modelserve/_otlp.py writes what the SDK's OTLP encoder writes: for every kind of span modelserve (and user code)
makes, its bytes parse to the message `encode_spans` builds; and the export falls back to the SDK's own
encoder when the exporter is not as modelserve expects."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry import trace  # noqa: E402 - after the skips
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState  # noqa: E402

from modelserve import _otlp, tracing  # noqa: E402


def spans() -> list[ReadableSpan]:
    """Spans of every shape, made by the SDK itself: a server span continuing a remote parent (a trace state,
    attributes of every type, an exception event, an error status), a batch span with links, a consumer span
    that is OK, a stage written finished, a span of another scope and a name outside ASCII."""
    exported = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "otlp-test", "process.pid": 7}))
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracer = provider.get_tracer("modelserve", "1.2.3")
    remote = SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        True,
        TraceFlags(1),
        TraceState([("a", "1"), ("b", "2")]),
    )
    attributes: dict[str, Any] = {
        "text": "é and ü",
        "negative": -(2**40),
        "zero": 0,
        "yes": True,
        "no": False,
        "ratio": 0.25,
        "names": ["x", "y"],
        "numbers": (1, -2, 3),
        "flags": [True, False],
        "long": "x" * 300,
    }
    server = tracer.start_span(
        "POST /iris", context=trace.set_span_in_context(trace.NonRecordingSpan(remote)), kind=SpanKind.SERVER
    )
    server.set_attributes(attributes)
    server.record_exception(ValueError("no good"), attributes={"modelserve.stage": "predict"})
    server.add_event("cancelled")
    server.set_status(Status(StatusCode.ERROR, "HTTP 500"))
    server.end()
    batch = tracer.start_span(
        "modelserve.batch",
        context=trace.set_span_in_context(trace.INVALID_SPAN),
        links=[Link(remote, {"n": 1}), Link(server.get_span_context())],
    )
    batch.end()
    job = tracer.start_span("modelserve.job", kind=SpanKind.CONSUMER)
    job.set_status(Status(StatusCode.OK))
    job.end()
    user = provider.get_tracer("user.code").start_span("ünïcode span", kind=SpanKind.CLIENT)
    user.end()
    made = list(exported.get_finished_spans())
    first = made[0]
    stage = ReadableSpan(
        "modelserve.stage.predict",
        SpanContext(first.context.trace_id, 0x1234, False, TraceFlags(1), first.context.trace_state),
        first.context,
        resource=first.resource,
        start_time=time.time_ns() - 1000,
        end_time=time.time_ns(),
        instrumentation_scope=first.instrumentation_scope,
    )
    return [*made, stage]


def parsed(data: bytes) -> ExportTraceServiceRequest:
    message = ExportTraceServiceRequest()
    message.ParseFromString(data)
    return message


def test_each_span_is_encoded_as_the_sdk_encodes_it() -> None:
    for span in spans():
        assert _otlp.same_as_sdk([span]), span.name


def test_a_batch_is_grouped_by_resource_and_scope_as_the_sdk_groups_it() -> None:
    batch = spans()
    assert _otlp.same_as_sdk(batch)
    message = parsed(_otlp.encode(batch))
    (resource_spans,) = message.resource_spans
    assert [scope.scope.name for scope in resource_spans.scope_spans] == ["modelserve", "user.code"]
    assert sum(len(scope.spans) for scope in resource_spans.scope_spans) == len(batch)


def test_a_span_encoded_again_from_the_made_once_parts_is_the_same_message() -> None:
    batch = spans()
    first = _otlp.encode(batch)  # fills the made-once names and string attributes
    assert _otlp.encode(batch) == first
    assert _otlp.same_as_sdk(batch)


def test_a_made_once_int_attribute_is_not_given_to_a_bool_of_the_same_value() -> None:
    tracer = TracerProvider().get_tracer("modelserve")
    made = []
    for value in (1, True, 0, False, 1):
        span = tracer.start_span("flag", attributes={"modelserve.flag": value})
        span.end()
        made.append(span)
    for span in made:
        assert _otlp.same_as_sdk([span])
    (one, true) = (parsed(_otlp.encode([span])) for span in made[:2])
    assert one.resource_spans[0].scope_spans[0].spans[0].attributes[0].value.int_value == 1
    assert true.resource_spans[0].scope_spans[0].spans[0].attributes[0].value.bool_value is True


def test_the_made_once_parts_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_otlp, "_pairs", {})
    monkeypatch.setattr(_otlp, "_names", {})
    monkeypatch.setattr(_otlp, "_KEYS_KEPT", 2)
    tracer = TracerProvider().get_tracer("modelserve")
    made = []
    for index in range(5):  # a per-request value and name: each new, past the bound
        span = tracer.start_span(f"span {index}", attributes={"url.path": f"/predict/{index}"})
        span.end()
        made.append(span)
    for span in made:
        assert _otlp.same_as_sdk([span])
    assert len(_otlp._pairs) == 2 and len(_otlp._names) == 2


def test_the_spans_checked_at_start_are_encoded_as_the_sdk_encodes_them() -> None:
    assert _otlp.same_as_sdk(tracing._sample_spans())


def test_an_exporter_not_as_expected_keeps_its_own_encoder(caplog: pytest.LogCaptureFixture) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter: Any = OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
    assert isinstance(tracing._encoded_here(exporter), tracing._EncodedHere)
    del exporter._client  # an exporter of another version, without the client modelserve sends through
    with caplog.at_level(logging.WARNING, logger="modelserve"):
        assert tracing._encoded_here(exporter) is exporter
    assert "not as modelserve expects" in caplog.text
