"""modelserve's batch span processor (`modelserve.tracing._Batches`): a full batch wakes the export thread, which
exports full batches only; what is left waits for the next full batch, the schedule's delay or a flush."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from modelserve.tracing import _Batches


class HeldFirst(SpanExporter):
    """Records the size of each batch; the first export waits until released."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.exporting = threading.Event()
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.sizes.append(len(spans))
        if len(self.sizes) == 1:
            self.exporting.set()
            self.release.wait(30)
        return SpanExportResult.SUCCESS


def test_spans_that_come_during_an_export_wait_for_a_full_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # never, in this test
    exporter = HeldFirst()
    batches = _Batches(exporter)
    provider = TracerProvider()
    provider.add_span_processor(batches)
    tracer = provider.get_tracer("test")

    def spans(count: int) -> None:
        for _ in range(count):
            tracer.start_span("request").end()

    try:
        spans(4)  # a full batch: the thread wakes and exports it
        assert exporter.exporting.wait(30)
        spans(2)  # while that export runs
        exporter.release.set()
        with batches._exporting:  # the export thread's pass is over
            assert exporter.sizes == [4]
            assert len(batches.queue) == 2  # not sent alone, one POST for two spans
        spans(2)  # a full batch again, the two that waited first
        deadline = time.monotonic() + 30
        while exporter.sizes == [4] and time.monotonic() < deadline:
            time.sleep(0.01)
        with batches._exporting:
            assert exporter.sizes == [4, 4] and not batches.queue
        spans(1)
        batches.force_flush()  # a flush sends what waits, full or not
        assert exporter.sizes == [4, 4, 1]
    finally:
        exporter.release.set()
        batches.shutdown()
