"""Real OTLP receivers for the tracing tests: a loopback HTTP server (`Receiver`) and a loopback gRPC server
(`GrpcReceiver`, OpenTelemetry's own TraceService) that decode what the exporters send with OpenTelemetry's own
protobuf messages (`opentelemetry-proto`), and the spans they received."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry import propagate
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.trace import TracerProvider


@dataclass
class Span:
    """One received span, its ids in hex as a trace back-end shows them."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    service: str
    attributes: dict[str, Any]
    status: int  # 0 unset, 1 ok, 2 error
    status_message: str
    events: list[tuple[str, dict[str, Any]]]
    links: list[tuple[str, str]]  # (trace id, span id)
    start: int
    end: int
    resource: dict[str, Any] = field(default_factory=dict)


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class Receiver:
    """``POST /v1/traces`` on 127.0.0.1; `spans` grows as the exporters post."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.posts = 0
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                assert self.path == "/v1/traces", self.path
                assert self.headers["Content-Type"] == "application/x-protobuf"
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _add(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        Span(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            service=str(resource.get("service.name")),
                            attributes=_attributes(span.attributes),
                            status=span.status.code,
                            status_message=span.status.message,
                            events=[(event.name, _attributes(event.attributes)) for event in span.events],
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                            start=span.start_time_unix_nano,
                            end=span.end_time_unix_nano,
                            resource=resource,
                        )
                    )
        with self._changed:
            self.spans.extend(received)
            self.posts += 1
            self._changed.notify_all()

    def wait_for(self, found: Callable[[list[Span]], Any], timeout: float = 20) -> Any:
        """Wait until `found(spans)` is truthy (the exporters post every 50 ms in the tests); its value."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                value = found(list(self.spans))
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    names = sorted({span.name for span in self.spans})
                    raise AssertionError(f"not received within {timeout} s; spans so far: {names}")
                self._changed.wait(left)

    def trace(self, trace_id: str) -> list[Span]:
        return [span for span in self.spans if span.trace_id == trace_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class GrpcReceiver(Receiver):
    """OTLP over gRPC on 127.0.0.1: ``TraceService/Export`` as `opentelemetry-proto` declares it."""

    def __init__(self) -> None:  # in place of `Receiver`'s HTTP server
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        self.spans = []
        self.posts = 0
        self._changed = threading.Condition()
        receiver = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:  # noqa: N802 - the service's name
                receiver._add(request)
                return ExportTraceServiceResponse()

        self.grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.grpc_server)
        port = self.grpc_server.add_insecure_port("127.0.0.1:0")
        self.grpc_server.start()
        self.endpoint = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self.grpc_server.stop(0)


def env(receiver: Receiver, service: str = "modelserve-test") -> dict[str, str]:
    """The environment of a server that exports to `receiver`, quickly (every 50 ms)."""
    return {
        "MODELSERVE_TRACING": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": service,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_TRACES_SAMPLER": "always_on",
    }


def children(spans: list[Span], parent: Span) -> Iterator[Span]:
    return (span for span in spans if span.parent_id == parent.span_id and span.trace_id == parent.trace_id)


def client_span() -> tuple[dict[str, str], str, str]:
    """A caller's span made by the OpenTelemetry SDK in this process, as an instrumented client sends it:
    (the headers it injects, its trace id, its span id)."""
    tracer = TracerProvider().get_tracer("test-client")
    with tracer.start_as_current_span("client call") as span:
        headers: dict[str, str] = {}
        propagate.inject(headers)
        context = span.get_span_context()
    return headers, format(context.trace_id, "032x"), format(context.span_id, "016x")
