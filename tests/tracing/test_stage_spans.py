"""A stage span (`Tracing._finished`): written finished straight to modelserve's own batch processor when the
tracer provider is the one modelserve set up, and through the tracer of a provider that is not (an embedding
program's); either way the same child of the same parent, with the stage's own times."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from modelserve.tracing import Tracing, _Batches


def check_stage(tracing: Tracing, exported: InMemorySpanExporter, flush: object) -> None:
    parent = tracing.tracer.start_span("POST /stages")
    tracing._finished("modelserve.stage.predict", parent, 1_000, 2_000)
    parent.end()
    if callable(flush):
        flush()
    stage = next(span for span in exported.get_finished_spans() if span.name == "modelserve.stage.predict")
    context = parent.get_span_context()
    assert stage.parent is not None and stage.parent.span_id == context.span_id
    assert stage.context is not None and stage.context.trace_id == context.trace_id
    assert stage.context.span_id != context.span_id and stage.context.trace_flags.sampled
    assert (stage.start_time, stage.end_time) == (1_000, 2_000)


def test_with_modelserves_processor_a_stage_span_is_handed_to_it_finished() -> None:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    batches = _Batches(exported)
    provider.add_span_processor(batches)
    tracing = Tracing(provider)
    assert tracing._direct is batches
    try:
        check_stage(tracing, exported, batches.force_flush)
    finally:
        batches.shutdown()


def test_with_a_provider_of_the_program_a_stage_span_goes_through_its_tracer() -> None:
    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracing = Tracing(provider)
    assert tracing._direct is None
    check_stage(tracing, exported, None)
