"""OpenTelemetry tracing through a real server, exported by the real OTLP/HTTP exporter to a receiver of the
test's own (`tests.tracing.receiver`): the span tree of a request, a batch, a stream, a V2 infer and a job."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import write_project
from tests.tracing.receiver import Receiver, Span, children, client_span, env

MODEL = """
import time

from opentelemetry import propagate, trace

from modelserve import logger


def seen():
    context = trace.get_current_span().get_span_context()
    headers = {}
    propagate.inject(headers)  # what a call to another service would carry
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x"), **headers}


class Stages:
    def preprocess(self, inputs):
        return inputs

    def predict(self, inputs):
        secret_local = "s3cr3t-" + "local"
        if inputs.get("fail"):
            raise ValueError("no good")
        logger.info("predicting")
        return {"in_predict": seen()}

    def postprocess(self, result):
        return result


class AsyncModel:
    async def predict(self, inputs):
        return {"in_predict": seen()}


class Batched:
    def predict(self, batch):
        time.sleep(0.05)
        return [{"n": len(batch), "in_batch": seen()} for _ in batch]


class Streams:
    def predict(self, inputs):
        for index in range(10_000):
            yield {"chunk": index}
            time.sleep(0.01)


class Echo:
    def predict(self, inputs):
        return dict(inputs)


class Answers:
    def predict(self, inputs):
        from starlette.responses import PlainTextResponse

        return PlainTextResponse("made by user code", status_code=201)


class Queued:
    async def handle_async(self, payload):
        return {}
"""

PROJECT = """
apis:
  - name: stages
    handler: {path: model.py, class: Stages}
  - name: asyncmodel
    handler: {path: model.py, class: AsyncModel}
  - name: batched
    handler: {path: model.py, class: Batched}
    batching: {max_batch_size: 2, max_wait_ms: 2000}
  - name: streams
    handler: {path: model.py, class: Streams}
  - name: echo
    handler: {path: model.py, class: Echo}
  - name: answers
    handler: {path: model.py, class: Answers}
  - name: queued
    kind: async
    handler: {path: model.py, class: Queued}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any, receiver: Receiver) -> Any:
    root = write_project(tmp_path_factory.mktemp("traced"), {"modelserve.yaml": PROJECT, "model.py": MODEL})
    server = start_server_module(root, "--log-format", "json", env=env(receiver))
    server.wait_ready()
    return server


def server_span(receiver: Receiver, trace_id: str, route: str) -> Span:
    return receiver.wait_for(
        lambda spans: next(
            (s for s in spans if s.trace_id == trace_id and s.kind == 2 and s.attributes["http.route"] == route),
            None,
        )
    )


def test_a_request_continues_the_callers_trace_with_a_span_per_stage(server: Any, receiver: Receiver) -> None:
    headers, trace_id, parent_id = client_span()
    answer = httpx.post(f"{server.url}/stages", json={"x": 1}, headers={**headers, "X-Request-ID": "traced-1"})
    assert answer.status_code == 200
    assert answer.headers["traceparent"].split("-")[1] == trace_id
    span = server_span(receiver, trace_id, "/stages")
    assert span.parent_id == parent_id
    assert span.name == "POST /stages"
    assert span.attributes["http.request.method"] == "POST"
    assert span.attributes["url.path"] == "/stages"
    assert span.attributes["http.response.status_code"] == 200
    assert span.attributes["modelserve.request_id"] == "traced-1"
    assert span.attributes["modelserve.api"] == "stages"
    assert span.status == 0
    # the answer names the server span; user code ran with it current and would propagate it
    assert answer.headers["traceparent"].split("-")[2] == span.span_id
    seen = answer.json()["in_predict"]
    assert (seen["trace_id"], seen["span_id"]) == (trace_id, span.span_id)
    assert seen["traceparent"].split("-")[1:3] == [trace_id, span.span_id]

    def tree(spans: list[Span]) -> Any:
        names = {s.name for s in children(spans, span)}
        wanted = {"modelserve.stage.preprocess", "modelserve.stage.predict", "modelserve.stage.postprocess"}
        return names if wanted <= names else None

    names = receiver.wait_for(tree)
    assert len(names) == 3  # the queue wait and the encoding are attributes of the server span, not spans
    assert 0 <= span.attributes["modelserve.encode.duration"] < (span.end - span.start) / 1e9
    assert span.attributes.get("modelserve.queue.duration", 0) >= 0  # a call that waited for nothing has none
    stages = {s.name: s for s in children(receiver.trace(trace_id), span)}
    assert stages["modelserve.stage.preprocess"].end <= stages["modelserve.stage.predict"].start
    assert stages["modelserve.stage.predict"].end <= stages["modelserve.stage.postprocess"].start
    assert span.start <= stages["modelserve.stage.preprocess"].start
    assert stages["modelserve.stage.postprocess"].end <= span.end
    # the JSON log line user code wrote carries the trace id
    line = receiver.wait_for(
        lambda _: next((line for line in server.log.splitlines() if '"predicting"' in line and trace_id in line), None)
    )
    assert json.loads(line)["trace_id"] == trace_id


def test_a_request_without_traceparent_starts_a_trace(server: Any, receiver: Receiver) -> None:
    answer = httpx.post(f"{server.url}/asyncmodel", json={})
    trace_id = answer.headers["traceparent"].split("-")[1]
    span = server_span(receiver, trace_id, "/asyncmodel")
    assert span.parent_id == ""
    assert answer.json()["in_predict"]["span_id"] == span.span_id


def test_a_user_error_is_a_span_event_without_locals(server: Any, receiver: Receiver) -> None:
    answer = httpx.post(f"{server.url}/stages", json={"fail": True})
    assert answer.status_code == 500
    trace_id = answer.headers["traceparent"].split("-")[1]
    span = server_span(receiver, trace_id, "/stages")
    assert span.status == 2
    assert span.attributes["http.response.status_code"] == 500
    (event,) = [attributes for name, attributes in span.events if name == "exception"]
    assert event["exception.type"] == "ValueError"
    assert event["exception.message"] == "no good"
    assert event["modelserve.stage"] == "predict"
    assert "s3cr3t-local" not in repr(receiver.trace(trace_id))


def test_a_refused_request_sets_the_span_status(server: Any, receiver: Receiver) -> None:
    answer = httpx.post(f"{server.url}/stages", content=b"{not json", headers={"Content-Type": "application/json"})
    assert answer.status_code == 400
    span = server_span(receiver, answer.headers["traceparent"].split("-")[1], "/stages")
    assert span.status == 2 and span.attributes["error.type"] == "400"  # a 4xx too (docs/observability.md)
    assert span.attributes["http.response.status_code"] == 400
    assert span.attributes["modelserve.request_id"] == answer.headers["x-request-id"]  # refused before its call


def test_the_answer_carries_the_callers_tracestate(server: Any, receiver: Receiver) -> None:
    headers, trace_id, parent_id = client_span()
    answer = httpx.post(f"{server.url}/echo", json={}, headers={**headers, "tracestate": "vendor=abc,other=1"})
    assert answer.status_code == 200
    assert answer.headers["tracestate"] == "vendor=abc,other=1"
    span = server_span(receiver, trace_id, "/echo")
    assert answer.headers["traceparent"] == f"00-{trace_id}-{span.span_id}-01"
    assert span.parent_id == parent_id


@pytest.mark.parametrize(
    "route",
    [
        "/answers",  # a user's own Response: an answer of the exchange that sends itself
        "/queued",  # a job's submit: a route of its own around the exchange, its answer through a wrapped send
    ],
)
def test_every_kind_of_answer_names_its_span(server: Any, receiver: Receiver, route: str) -> None:
    answer = httpx.post(f"{server.url}{route}", json={})
    assert answer.status_code == {"/answers": 201, "/queued": 200}[route], answer.text
    trace_id, span_id = answer.headers["traceparent"].split("-")[1:3]
    span = server_span(receiver, trace_id, route)
    assert span.span_id == span_id
    assert span.attributes["http.response.status_code"] == answer.status_code
    assert span.attributes["modelserve.request_id"] == answer.headers["x-request-id"]


def test_the_exchanges_answering_key_is_tracings() -> None:
    from modelserve import tracing
    from modelserve.http import _asgi

    assert tracing._ANSWERING == _asgi.ANSWERING


def test_a_batch_is_one_span_linked_to_each_request(server: Any, receiver: Receiver) -> None:
    answers: list[httpx.Response] = []

    def post() -> None:
        answers.append(httpx.post(f"{server.url}/batched", json={}, timeout=30))

    threads = [threading.Thread(target=post) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [answer.json()["n"] for answer in answers] == [2, 2]
    requests = [server_span(receiver, a.headers["traceparent"].split("-")[1], "/batched") for a in answers]
    batch = receiver.wait_for(
        lambda spans: next((s for s in spans if s.name == "modelserve.batch" and len(s.links) == 2), None)
    )
    assert sorted(batch.links) == sorted((r.trace_id, r.span_id) for r in requests)
    assert batch.attributes["modelserve.batch.size"] == 2
    assert batch.parent_id == "" and batch.trace_id not in {r.trace_id for r in requests}
    # the batched predict ran with the batch span current, not one request's
    assert {answer.json()["in_batch"]["span_id"] for answer in answers} == {batch.span_id}


def test_a_stream_cancelled_by_its_client(server: Any, receiver: Receiver) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(
            b"POST /streams HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\n\r\n{}"
        )
        head = b""
        while head.count(b'"chunk"') < 2:
            head += sock.recv(65536)
    traceparent = next(
        line.split(b":", 1)[1].strip().decode()
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"traceparent")
    )
    trace_id = traceparent.split("-")[1]
    span = server_span(receiver, trace_id, "/streams")
    assert span.status == 2  # the answer had begun (200) when its client left
    stream = receiver.wait_for(
        lambda spans: next((s for s in children(spans, span) if s.name == "modelserve.stream"), None)
    )
    assert stream.attributes["modelserve.stream.chunks"] >= 2
    assert [name for name, _ in stream.events] == ["cancelled"]
    assert stream.status == 2


def test_a_v2_infer_has_its_server_span(server: Any, receiver: Receiver) -> None:
    headers, trace_id, parent_id = client_span()
    tensor = {"name": "x", "datatype": "INT32", "shape": [2], "data": [1, 2]}
    answer = httpx.post(f"{server.url}/v2/models/echo/infer", json={"inputs": [tensor]}, headers=headers)
    assert answer.status_code == 200
    span = server_span(receiver, trace_id, "/v2/models/echo/infer")
    assert span.parent_id == parent_id
    assert span.name == "POST /v2/models/echo/infer"
    assert receiver.wait_for(lambda spans: any(s.name == "modelserve.stage.predict" for s in children(spans, span)))


def test_a_collector_that_is_down_fails_no_request(tmp_path: Path, start_server: Any) -> None:
    root = write_project(tmp_path, {"modelserve.yaml": PROJECT, "model.py": MODEL})
    down = Receiver()
    down.close()  # a port where nothing listens any more
    server = start_server(root, env={**env(down), "OTEL_EXPORTER_OTLP_TIMEOUT": "1"})
    server.wait_ready()
    for _ in range(3):
        assert httpx.post(f"{server.url}/asyncmodel", json={}).status_code == 200
    deadline = time.monotonic() + 30
    while "could not be exported" not in server.log:
        assert time.monotonic() < deadline, server.log
        time.sleep(0.05)
    dropped = 0.0
    while not dropped:
        assert time.monotonic() < deadline
        text = httpx.get(f"{server.url}/metrics").text
        dropped = sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "modelserve_spans_dropped_total"
        )
    assert httpx.post(f"{server.url}/asyncmodel", json={}).status_code == 200
    assert server.log.count("could not be exported") == 1


def test_tracing_off_imports_nothing_of_it_and_answers_no_traceparent(tmp_path: Path) -> None:
    script = """
import sys
import httpx
import modelserve

class Echo:
    def predict(self, inputs):
        return inputs

async def main():
    app = modelserve.create_app(handler=Echo, name="echo")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        await app.server.wait_loaded()
        answer = await client.post("/echo", json={}, headers={"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    assert answer.status_code == 200 and "traceparent" not in answer.headers, answer.headers
    loaded = sorted(name for name in sys.modules if name == "modelserve.tracing" or name.startswith("opentelemetry"))
    assert not loaded, loaded

import asyncio
asyncio.run(main())
print("ok")
"""
    environment = {key: value for key, value in os.environ.items() if key != "MODELSERVE_TRACING"}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=environment, capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


def test_each_worker_exports_its_own_spans(tmp_path: Path, start_server: Any, receiver: Receiver) -> None:
    root = write_project(tmp_path, {"modelserve.yaml": PROJECT, "model.py": MODEL})
    server = start_server(root, "--workers", "2", env=env(receiver, "two-workers"))
    server.wait_ready(consecutive=20)
    deadline = time.monotonic() + 30
    pids: set[int] = set()
    while len(pids) < 2:  # a new connection per request: both workers end up serving
        assert time.monotonic() < deadline, f"spans of workers {pids} only"
        trace_id = httpx.post(f"{server.url}/asyncmodel", json={}).headers["traceparent"].split("-")[1]
        span = server_span(receiver, trace_id, "/asyncmodel")
        assert span.service == "two-workers"
        pids.add(span.resource["process.pid"])


def test_a_client_instrumented_by_opentelemetry_httpx_is_the_parent(server: Any, receiver: Receiver) -> None:
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    with httpx.Client() as client:
        HTTPXClientInstrumentor.instrument_client(client, tracer_provider=provider)
        answer = client.post(f"{server.url}/stages", json={"x": 1})
    assert answer.status_code == 200
    (sent,) = exported.get_finished_spans()
    trace_id, client_id = format(sent.context.trace_id, "032x"), format(sent.context.span_id, "016x")
    span = server_span(receiver, trace_id, "/stages")
    assert span.parent_id == client_id
    assert answer.headers["traceparent"].split("-")[1:3] == [trace_id, span.span_id]
