"""modelserve/_otlp.py writes a route's server span (`LiveSpan`) and its stages as the SDK's encoder writes the
same spans, whatever their shape: parents and trace states, attributes set since the start of every type and
length, lengths that take several bytes, caches full, ids from the provider's own generator."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from opentelemetry import trace  # noqa: E402 - after the skips
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import sampling  # noqa: E402
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator  # noqa: E402
from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: E402
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags, TraceState  # noqa: E402

from modelserve import _otlp, tracing  # noqa: E402
from modelserve._spans import Head, LiveSpan, ServerSpans  # noqa: E402

SCOPE = InstrumentationScope("modelserve", "1")
RESOURCE = Resource.create({"service.name": "otlp-live-test"})
HEAD = Head({"http.route": "/iris", "http.request.method": "POST", "server.port": 8888})


def owner(ids: IdGenerator | None = None) -> ServerSpans:
    return ServerSpans(sampling.ALWAYS_ON, ids or RandomIdGenerator(), RESOURCE, SCOPE, lambda span: None, lambda: HEAD)


PARENTS: dict[str, SpanContext | None] = {
    "new trace": None,
    "remote parent": SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, True, TraceFlags(1)),
    "remote parent with a trace state": SpanContext(
        0x4BF92F3577B34DA6A3CE929D0E0E4736,
        0x00F067AA0BA902B7,
        True,
        TraceFlags(1),
        TraceState([("vendor", "x" * 200), ("b", "2")]),  # a state field of a two-byte length
    ),
    "local parent": SpanContext(0x1, 0x2, False, TraceFlags(1)),
}


def span_of(parent: SpanContext | None, spans: ServerSpans | None = None) -> LiveSpan:
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent else tracing._NEW_TRACE
    return (spans or owner()).start("POST /iris", context)


def parsed(data: bytes) -> ExportTraceServiceRequest:
    message = ExportTraceServiceRequest()
    message.ParseFromString(data)
    return message


@pytest.mark.parametrize("parent", PARENTS)
@pytest.mark.parametrize("failed", [False, True])
def test_a_live_span_of_each_shape_is_encoded_as_the_sdk_encodes_it(parent: str, failed: bool) -> None:
    span = span_of(PARENTS[parent])
    values: dict[str, Any] = {
        "modelserve.request_id": f"{random.getrandbits(128):032x}",
        "modelserve.queue.duration": 0.000125,
        "http.response.status_code": 500 if failed else 200,
        "user.flag": True,
        "user.tags": ["a", "b"],
        "user.text": "é" * 150,  # a text of a two-byte length, in a pair and a value of two-byte lengths
        "user.negative": -(2**40),
    }
    span.set_attributes(values)
    if failed:
        span.record_exception(ValueError("no good"), {"modelserve.stage": "predict"})
        span.set_status(Status(StatusCode.ERROR, "HTTP 500"))
    for name in ("preprocess", "predict", "postprocess"):
        span.stage(name, 0.0002, span.start_time + 1_000_000)
    span.end()
    assert _otlp.same_as_sdk([span])
    assert _otlp.same_as_sdk([span, span_of(PARENTS[parent])])  # a batch: the parts made once reused
    (server,) = [one for one in parsed(_otlp.encode([span])).resource_spans[0].scope_spans[0].spans if one.kind == 2]
    assert {item.key: item.value.string_value for item in server.attributes}["user.text"] == "é" * 150


def test_a_span_of_more_than_16_kib_has_lengths_of_three_bytes() -> None:
    span = span_of(PARENTS["remote parent"])
    span.set_attribute("user.document", "d" * 20_000)
    span.stage("predict", 0.001, span.start_time + 2_000_000)
    span.end()
    assert _otlp.same_as_sdk([span])
    spans = parsed(_otlp.encode([span])).resource_spans[0].scope_spans[0].spans
    assert [len(item.value.string_value) for item in spans[0].attributes if item.key == "user.document"] == [20_000]


def test_the_made_once_parts_of_live_spans_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    for cache in ("_stages", "_floats", "_texts", "_ints", "_names"):
        monkeypatch.setattr(_otlp, cache, {})
    monkeypatch.setattr(_otlp, "_KEYS_KEPT", 2)
    spans = owner()
    for index in range(5):  # a new stage name, key, text length and status code each time, past the bound
        span = span_of(PARENTS["new trace"], spans)
        span.update_name(f"POST /iris/{index}")
        span.set_attributes(
            {f"user.ratio.{index}": index / 3, "user.id": "i" * (index + 1), "http.response.status_code": 200 + index}
        )
        span.stage(f"stage {index}", 0.001, span.start_time + 2_000_000)
        span.stage("predict", 0.001, span.start_time + 3_000_000)
        span.end()
        assert _otlp.same_as_sdk([span])
    assert len(_otlp._stages) <= 2 and all(len(made) <= 2 for made in _otlp._stages.values())
    assert [len(_otlp._floats), len(_otlp._texts), len(_otlp._ints), len(_otlp._names)] == [2, 2, 2, 2]


def test_a_stage_s_id_is_the_provider_s_id_generator_s() -> None:
    class Counting(IdGenerator):
        def __init__(self) -> None:
            self.next = itertools.count(0x100)

        def generate_span_id(self) -> int:
            return next(self.next)

        def generate_trace_id(self) -> int:
            return 0xABC

    span = span_of(None, owner(Counting()))  # its own id: 0x100
    for name in ("preprocess", "predict"):
        span.stage(name, 0.001, span.start_time + 2_000_000)
    span.end()
    written = parsed(_otlp.encode([span])).resource_spans[0].scope_spans[0].spans
    assert [int.from_bytes(one.span_id, "big") for one in written] == [0x100, 0x101, 0x102]
    assert [int.from_bytes(one.parent_span_id, "big") for one in written[1:]] == [0x100, 0x100]
    assert {int.from_bytes(one.trace_id, "big") for one in written} == {0xABC}


def test_stages_of_random_ids_have_ids_of_their_own() -> None:
    span = span_of(PARENTS["remote parent with a trace state"])
    for index in range(50):
        span.stage(f"stage {index % 3}", 0.001, span.start_time + 2_000_000)
    span.end()
    written = parsed(_otlp.encode([span])).resource_spans[0].scope_spans[0].spans
    ids = {one.span_id for one in written}
    assert len(ids) == 51 and bytes(8) not in ids
    assert all(one.trace_state == "vendor=" + "x" * 200 + ",b=2" for one in written)
