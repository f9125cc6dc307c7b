"""docs/observability.md's "Traces" section (up to "What tracing costs") held to a real server that exports
over OTLP/HTTP to a loopback receiver (`tests.tracing.receiver`): the exporter's variables (the traces
endpoint, the headers, the sampler, the resource, a gRPC endpoint's TLS), a collector that is down, the server
span's attributes and status (4xx, 5xx, a client that left, a stream cut at its timeout, a refused WebSocket),
user code's spans and log lines, a batch's sampling, the headers a trace is continued from (the global
propagator's), and the spans a worker of ``--workers N`` still holds at its shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import InvalidStatus

from tests.conftest import free_port, write_project
from tests.test_readme import page, section
from tests.tracing.receiver import GrpcReceiver, Receiver, Span, children, client_span, env
from tests.tracing.test_docs import ready

TRACES = section(page("observability.md"), "Traces")

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: echo
            handler: {path: model.py}
          - name: batched
            handler: {path: model.py, class: Batched}
            batching: {max_batch_size: 2, max_wait_ms: 5000}
          - name: endless
            handler: {path: model.py, class: Endless}
            timeout: 0.5
    """,
    "model.py": """
        from opentelemetry import trace
        from starlette.exceptions import HTTPException

        from modelserve import logger


        class Model:
            def predict(self, inputs):
                secret_local = "s3cr3t-" + "local"
                if inputs.get("fail"):
                    raise ValueError("no good")
                if inputs.get("status"):  # an answer of user code's choosing
                    raise HTTPException(inputs["status"], "as you asked")
                if inputs.get("started"):  # a long call: says it began, then takes its time
                    import pathlib
                    import time

                    pathlib.Path(inputs["started"]).touch()
                    time.sleep(1)
                if inputs.get("child"):
                    with trace.get_tracer(__name__).start_as_current_span("user work") as span:
                        span.set_attribute("user.step", 1)
                        logger.info("inside my span")
                logger.info("predicting")
                return inputs


        class Batched:
            def predict(self, batch):
                return [{"size": len(batch)} for _ in batch]


        class Endless:
            def predict(self, inputs):
                import time

                while True:
                    yield {"tick": 1}
                    time.sleep(0.02)
    """,
}


class HeaderReceiver(Receiver):
    """`Receiver`, keeping the headers of each export it was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.headers: list[dict[str, str]] = []
        handler = self.server.RequestHandlerClass
        sent = self.headers

        class Handler(handler):  # type: ignore[valid-type,misc]
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                sent.append({key.lower(): value for key, value in self.headers.items()})
                super().do_POST()

        self.server.RequestHandlerClass = Handler


@pytest.fixture(scope="module")
def collector() -> Iterator[HeaderReceiver]:
    collector = HeaderReceiver()
    yield collector
    collector.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any, collector: HeaderReceiver) -> Any:
    """A server whose exporter's settings are each one of the page's variables: the traces endpoint (the
    general one names a port where nothing listens), headers, a ratio sampler that keeps no new trace, a
    resource that names the service, and an ``OTEL_TRACES_EXPORTER`` that modelserve does not read."""
    down = Receiver()
    down.close()
    variables = {
        **env(collector),
        "OTEL_EXPORTER_OTLP_ENDPOINT": down.endpoint,
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.endpoint + "/v1/traces",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=k3y,x-tenant=docs",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0",
        "OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attributes,service.version=2.5,deployment.environment=prod",
        "OTEL_TRACES_EXPORTER": "console",  # not read: the spans still go to the OTLP collector
    }
    del variables["OTEL_SERVICE_NAME"]
    root = write_project(tmp_path_factory.mktemp("claims"), PROJECT)
    server = start_server_module(root, "--log-format", "json", env=variables)
    server.wait_ready()
    return server


def dropped(url: str) -> float:
    """``modelserve_spans_dropped_total`` of the server at `url`."""
    families = text_string_to_metric_families(httpx.get(url + "/metrics").text)
    return sum(s.value for f in families for s in f.samples if s.name == "modelserve_spans_dropped_total")


def server_span(receiver: Receiver, trace_id: str) -> Span:
    return receiver.wait_for(lambda spans: next((s for s in spans if s.trace_id == trace_id and s.kind == 2), None))


def ids(answer: httpx.Response) -> tuple[str, str, str]:
    """(trace id, span id, flags) of the answer's ``traceparent``."""
    version, trace_id, span_id, flags = answer.headers["traceparent"].split("-")
    assert version == "00"
    return trace_id, span_id, flags


def traced(server: Any, path: str = "/echo", **options: Any) -> tuple[httpx.Response, str, str]:
    """A request of a sampled caller: (the answer, its trace id, the caller's span id)."""
    headers, trace_id, caller = client_span()
    answer = httpx.post(server.url + path, headers={**headers, **options.pop("headers", {})}, **options)
    return answer, trace_id, caller


def test_the_traces_endpoint_headers_and_resource_reach_the_collector(server: Any, collector: HeaderReceiver) -> None:
    answer, trace_id, caller = traced(server, json={})
    assert answer.status_code == 200
    span = server_span(collector, trace_id)  # sent to the whole URL of the traces endpoint, not the general one
    assert span.parent_id == caller
    assert all(sent["x-api-key"] == "k3y" and sent["x-tenant"] == "docs" for sent in collector.headers)
    # what OTEL_RESOURCE_ATTRIBUTES names is used in place of modelserve's defaults
    assert span.service == "from-attributes"
    assert span.resource["service.version"] == "2.5"
    assert span.resource["deployment.environment"] == "prod"
    assert isinstance(span.resource["process.pid"], int)
    assert "`OTEL_TRACES_EXPORTER` is not read" in TRACES


def test_the_ratio_sampler_keeps_no_new_trace_and_follows_the_caller(server: Any, collector: HeaderReceiver) -> None:
    new = httpx.post(server.url + "/echo", json={})
    new_trace, _, new_flags = ids(new)
    assert new_flags == "00"
    unsampled_trace = "5" * 32
    refused = httpx.post(server.url + "/echo", json={}, headers={"traceparent": f"00-{unsampled_trace}-{'6' * 16}-00"})
    assert ids(refused)[0] == unsampled_trace and ids(refused)[2] == "00"
    kept, trace_id, caller = traced(server, json={})
    assert ids(kept)[0] == trace_id and ids(kept)[2] == "01"
    assert server_span(collector, trace_id).parent_id == caller
    # spans are exported in the order they end: the ones before it would have come by now
    assert not collector.trace(new_trace) and not collector.trace(unsampled_trace)


def attributes_listed() -> list[str]:
    """The server span's attributes as the page lists them."""
    text = re.search(r"its attributes(.*?)\(`client\.port`", TRACES, flags=re.DOTALL)
    assert text is not None
    names = re.findall(r"`([a-z_.]+)`", text.group(1))
    assert "http.route" in names and "url.query" in names
    return names


def test_the_server_span_has_the_attributes_the_page_lists(server: Any, collector: HeaderReceiver) -> None:
    answer, trace_id, _ = traced(
        server, "/echo?verbose=1", json={}, headers={"User-Agent": "claims/1", "X-Request-ID": "claims-1"}
    )
    assert answer.status_code == 200
    span = server_span(collector, trace_id)
    assert span.name == "POST /echo"
    assert set(attributes_listed()) <= set(span.attributes)
    assert "client.port" not in span.attributes
    assert span.attributes["url.query"] == "verbose=1"
    assert span.attributes["user_agent.original"] == "claims/1"
    assert span.attributes["server.port"] == server.port and span.attributes["client.address"] == "127.0.0.1"
    assert span.attributes["modelserve.request_id"] == "claims-1" == answer.headers["x-request-id"]
    assert span.attributes["modelserve.api"] == "echo"
    assert span.status == 0 and "error.type" not in span.attributes


def test_a_4xx_and_a_5xx_set_the_server_span_s_error_status(server: Any, collector: HeaderReceiver) -> None:
    refused, refused_trace, _ = traced(server, content=b"{not json", headers={"Content-Type": "application/json"})
    failed, failed_trace, _ = traced(server, json={"fail": True})
    assert (refused.status_code, failed.status_code) == (400, 500)
    client_error = server_span(collector, refused_trace)
    assert client_error.attributes["http.response.status_code"] == 400
    assert client_error.status == 2 and client_error.attributes["error.type"] == "400"
    server_error = server_span(collector, failed_trace)
    assert server_error.attributes["http.response.status_code"] == 500
    assert server_error.status == 2 and server_error.attributes["error.type"] == "500"
    ((name, event),) = server_error.events
    assert name == "exception"
    assert event["exception.type"] == "ValueError" and event["exception.message"] == "no good"
    assert "ValueError" in event["exception.stacktrace"] and event["modelserve.stage"] == "predict"
    assert "s3cr3t-local" not in repr(collector.trace(failed_trace))


def test_a_stream_that_timed_out_has_a_cancelled_event_and_an_error_status(
    server: Any, collector: HeaderReceiver
) -> None:
    headers, trace_id, _ = client_span()
    chunks = b""
    with httpx.stream("POST", server.url + "/endless", json={}, headers=headers) as answer:
        assert answer.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):  # the server cuts it at its timeout (docs/streaming.md)
            for chunk in answer.iter_bytes():
                chunks += chunk
    assert b"tick" in chunks
    span = server_span(collector, trace_id)
    stream = collector.wait_for(
        lambda spans: next((s for s in children(spans, span) if s.name == "modelserve.stream"), None)
    )
    assert stream.attributes["modelserve.stream.chunks"] >= 1
    assert [name for name, _ in stream.events] == ["cancelled"]
    assert stream.events[0][1]["modelserve.reason"] == "timeout"
    assert stream.status == 2


def test_a_call_its_client_left_is_an_error_with_no_status_code(
    server: Any, collector: HeaderReceiver, tmp_path: Path
) -> None:
    headers, trace_id, _ = client_span()
    started = tmp_path / "started"
    body = json.dumps({"started": str(started)}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(
            b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"traceparent: {headers['traceparent']}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        deadline = time.monotonic() + 30
        while not started.exists():  # the call runs: the client leaves now
            assert time.monotonic() < deadline
            time.sleep(0.01)
    span = server_span(collector, trace_id)
    assert "http.response.status_code" not in span.attributes  # nothing was answered (the access line's 499)
    assert span.status == 2


@pytest.mark.parametrize("status", [422, 503])
def test_a_status_user_code_raises_is_an_error_from_400_on(server: Any, collector: HeaderReceiver, status: int) -> None:
    answer, trace_id, _ = traced(server, json={"status": status})
    assert answer.status_code == status
    span = server_span(collector, trace_id)
    assert span.attributes["http.response.status_code"] == status
    assert span.status == 2
    assert span.attributes["error.type"] == str(status)


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": "00-not-a-trace-01", "tracestate": "vendor=1"},  # malformed: a trace of its own
        # B3's headers, which the default propagators (W3C's) do not read
        {"X-B3-TraceId": "4bf92f3577b34da6a3ce929d0e0e4736", "X-B3-SpanId": "00f067aa0ba902b7", "X-B3-Sampled": "1"},
    ],
    ids=["malformed-traceparent", "b3"],
)
def test_headers_the_propagators_do_not_read_start_a_trace(server: Any, headers: dict[str, str]) -> None:
    answer = httpx.post(server.url + "/echo", json={}, headers=headers)
    assert answer.status_code == 200
    trace_id, span_id, _ = ids(answer)
    assert trace_id != "4bf92f3577b34da6a3ce929d0e0e4736" and int(trace_id, 16) and int(span_id, 16)
    assert "tracestate" not in answer.headers
    assert "A caller whose headers the propagators do not read gets a trace of its own" in " ".join(TRACES.split())


def test_the_answer_carries_the_callers_tracestate(server: Any, collector: HeaderReceiver) -> None:
    answer, trace_id, _ = traced(server, json={}, headers={"tracestate": "vendor=abc"})
    span = server_span(collector, trace_id)
    assert answer.headers["traceparent"] == f"00-{trace_id}-{span.span_id}-01"
    assert answer.headers["tracestate"] == "vendor=abc"


def test_each_worker_exports_the_spans_it_holds_at_its_shutdown(
    tmp_path: Path, start_server: Any, receiver: Receiver
) -> None:
    variables = {
        **env(receiver, "workers-claims"),
        "OTEL_BSP_SCHEDULE_DELAY": "600000",  # no export on the schedule: only the shutdown's
        "OTEL_RESOURCE_ATTRIBUTES": "service.name=not-this-one",  # OTEL_SERVICE_NAME wins
    }
    server = start_server(write_project(tmp_path, PROJECT), "--workers", "2", env=variables)
    server.wait_ready(consecutive=5)
    traces = [ids(httpx.post(server.url + "/echo", json={}))[0] for _ in range(6)]
    assert server.stop() == 0
    for trace_id in traces:
        assert server_span(receiver, trace_id).service == "workers-claims"
    assert "at its shutdown\nexports those still waiting" in TRACES


def log_line(server: Any, message: str, trace_id: str) -> dict[str, Any]:
    """The JSON log line of `message` written in the trace of `trace_id` (written before the answer was sent)."""
    lines = [json.loads(line) for line in server.log.splitlines() if line.startswith("{")]
    (line,) = [line for line in lines if line["message"] == message and line.get("trace_id") == trace_id]
    return line


def test_user_code_s_spans_are_children_of_the_current_one_and_its_log_lines_name_them(
    server: Any, collector: HeaderReceiver
) -> None:
    answer, trace_id, _ = traced(server, json={"child": True})
    assert answer.status_code == 200
    span = server_span(collector, trace_id)
    mine = collector.wait_for(lambda spans: next((s for s in children(spans, span) if s.name == "user work"), None))
    assert mine.attributes["user.step"] == 1 and mine.service == span.service  # the same exporter and resource
    assert log_line(server, "predicting", trace_id)["span_id"] == span.span_id
    assert log_line(server, "inside my span", trace_id)["span_id"] == mine.span_id


def test_a_collector_that_is_down_costs_one_warning_that_names_it(tmp_path: Path, start_server: Any) -> None:
    down = Receiver()
    down.close()
    traces_endpoint = down.endpoint + "/v1/traces"
    variables = {**env(down), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces_endpoint, "OTEL_EXPORTER_OTLP_TIMEOUT": "1"}
    server = start_server(write_project(tmp_path, PROJECT), "--log-format", "json", env=variables)
    server.wait_ready()
    for _ in range(3):
        assert httpx.post(server.url + "/echo", json={}).status_code == 200
    deadline = time.monotonic() + 30
    while not dropped(server.url):
        assert time.monotonic() < deadline, server.log
        time.sleep(0.05)
    assert httpx.post(server.url + "/echo", json={}).status_code == 200
    server.stop()  # its last spans fail too, at the shutdown
    lines = [json.loads(line) for line in server.log.splitlines() if line.startswith("{")]
    (warning,) = [line for line in lines if line["levelname"] != "INFO"]  # the exporter's own lines left out
    assert warning["levelname"] == "WARNING" and traces_endpoint in warning["message"]
    assert "modelserve_spans_dropped_total" in warning["message"]


EMBEDDING = """
import sys

import uvicorn
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import TextMapPropagator, default_getter, default_setter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import modelserve


class OneHeader(TextMapPropagator):
    # a propagator of another format than W3C's (as B3's or Jaeger's): "x-one-trace: <trace id>:<span id>"

    def extract(self, carrier, context=None, getter=default_getter):
        values = getter.get(carrier, "x-one-trace")
        if not values:
            return context if context is not None else Context()
        trace_id, span_id = values[0].split(":")
        caller = SpanContext(int(trace_id, 16), int(span_id, 16), True, TraceFlags(TraceFlags.SAMPLED))
        return trace.set_span_in_context(NonRecordingSpan(caller), context)

    def inject(self, carrier, context=None, setter=default_setter):
        span = trace.get_current_span(context).get_span_context()
        setter.set(carrier, "x-one-trace", f"{span.trace_id:032x}:{span.span_id:016x}")

    @property
    def fields(self):
        return {"x-one-trace"}


propagate.set_global_textmap(OneHeader())


class Echo:
    def predict(self, inputs):
        headers = {}
        propagate.inject(headers)  # what a call to another service would carry
        return headers


app = modelserve.create_app(handler=Echo, name="echo")
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def test_the_trace_is_continued_from_the_headers_of_the_global_propagator(tmp_path: Path, receiver: Receiver) -> None:
    (tmp_path / "program.py").write_text(EMBEDDING, encoding="utf-8")
    port = free_port()
    log = open(tmp_path / "program.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, str(tmp_path / "program.py"), str(port)],
        cwd=tmp_path,
        env={**os.environ, **env(receiver, "embedded")},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while not ready(base):
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "program.log").read_text()
            time.sleep(0.05)
        trace_id, caller = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
        answer = httpx.post(base + "/echo", json={}, headers={"x-one-trace": f"{trace_id}:{caller}"})
        assert answer.status_code == 200
        span = server_span(receiver, trace_id)
        assert span.parent_id == caller and span.service == "embedded"
        assert answer.json() == {"x-one-trace": f"{trace_id}:{span.span_id}"}  # user code's call carries it on
        assert answer.headers["traceparent"] == f"00-{trace_id}-{span.span_id}-01"
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def test_a_refused_websocket_session_has_its_status_code_and_no_error_status(
    tmp_path: Path, start_server: Any, receiver: Receiver
) -> None:
    project = {
        **PROJECT,
        "modelserve.yaml": """
            auth:
              api_keys_env: CLAIMS_KEYS
            apis:
              - name: echo
                handler: {path: model.py}
        """,
    }
    server = start_server(write_project(tmp_path, project), env={**env(receiver), "CLAIMS_KEYS": "k3y"})
    server.wait_ready()
    headers, trace_id, caller = client_span()

    async def refused() -> int:
        url = server.url.replace("http://", "ws://") + "/echo/ws"
        with pytest.raises(InvalidStatus) as raised:
            async with websockets.connect(url, additional_headers=headers):
                pass
        return raised.value.response.status_code

    assert asyncio.run(refused()) == 401
    session = server_span(receiver, trace_id)
    assert session.name == "GET /echo/ws" and session.parent_id == caller
    assert session.attributes["http.response.status_code"] == 401
    assert session.status == 2 and session.attributes["error.type"] == "401"  # a 4xx too


def test_a_batch_is_sampled_as_a_new_trace(server: Any, collector: HeaderReceiver) -> None:
    answers: list[tuple[httpx.Response, str, str]] = []
    threads = [threading.Thread(target=lambda: answers.append(traced(server, "/batched", json={}))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [answer.json() for answer, _, _ in answers] == [{"size": 2}, {"size": 2}]
    spans = [server_span(collector, trace_id) for _, trace_id, _ in answers]
    requests = {(span.trace_id, span.span_id) for span in spans}
    # both requests were kept (their caller's choice); the batch, a new trace, is not (the ratio is 0); it ended
    # before either request's span, and would have been exported with them
    assert not [s for s in collector.spans if s.name == "modelserve.batch" and requests & set(s.links)]
    assert "a tenth of the batches have a span" in " ".join(TRACES.split())


def test_over_grpc_an_endpoint_without_a_scheme_is_a_connection_with_tls(tmp_path: Path, start_server: Any) -> None:
    plain = GrpcReceiver()  # a collector without TLS
    try:
        variables = {
            **env(plain),
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_ENDPOINT": plain.endpoint.removeprefix("http://"),
            "OTEL_EXPORTER_OTLP_TIMEOUT": "1",
        }
        server = start_server(write_project(tmp_path, PROJECT), env=variables)
        server.wait_ready()
        answer = httpx.post(server.url + "/echo", json={})
        assert answer.status_code == 200
        deadline = time.monotonic() + 30
        while not dropped(server.url):  # the TLS handshake fails: the spans are dropped, the requests go on
            assert time.monotonic() < deadline, server.log
            time.sleep(0.05)
        assert plain.posts == 0 and not plain.trace(ids(answer)[0])
        assert "one without a scheme a connection with TLS" in TRACES
    finally:
        plain.close()


@pytest.mark.parametrize("value", ["0", "false", "False", "OFF", "no", " "])
def test_modelserve_tracing_off_values_leave_it_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """`0`, `false`, `no`, `off` in any case, or empty (docs/observability.md, "Turning it on"): `False` and
    `OFF` turned tracing on before."""
    import modelserve

    monkeypatch.setenv("MODELSERVE_TRACING", value)
    root = write_project(tmp_path, {"model.py": "class Model:\n    def predict(self, x):\n        return x\n"})
    assert modelserve.create_app(str(root)).server.project.tracing is False
