"""Where spans go: the OTLP gRPC exporter (``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``) to a gRPC receiver built on
OpenTelemetry's own TraceService, a protocol modelserve has no exporter for refused, and the spans that a full
queue drops counted in ``modelserve_spans_dropped_total``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, free_port, write_project
from tests.tracing.receiver import GrpcReceiver, Span, children, client_span, env

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: stages
            handler: {path: model.py, class: Stages}
    """,
    "model.py": """
        class Stages:
            def preprocess(self, inputs):
                return inputs

            def predict(self, inputs):
                return {"got": inputs}
    """,
}


def dropped(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "modelserve_spans_dropped_total"
    )


def test_spans_go_to_a_grpc_collector(tmp_path: Path, start_server: Any) -> None:
    receiver = GrpcReceiver()
    try:
        root = write_project(tmp_path, PROJECT)
        server = start_server(root, env={**env(receiver), "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
        server.wait_ready()
        headers, trace_id, parent_id = client_span()
        answer = httpx.post(f"{server.url}/stages", json={"x": 1}, headers=headers)
        assert answer.status_code == 200

        def tree(spans: list[Span]) -> Any:
            root = next((s for s in spans if s.trace_id == trace_id and s.parent_id == parent_id), None)
            names = sorted(s.name for s in children(spans, root)) if root is not None else []
            return (root, names) if len(names) == 2 else None

        span, names = receiver.wait_for(tree)
        assert span.name == "POST /stages" and span.kind == 2 and span.service == "modelserve-test"
        assert span.attributes["http.response.status_code"] == 200
        assert names == ["modelserve.stage.predict", "modelserve.stage.preprocess"]
        assert receiver.posts >= 1
    finally:
        receiver.close()


def test_a_protocol_without_an_exporter_is_refused(tmp_path: Path) -> None:
    root = write_project(tmp_path, PROJECT)
    environment = {**os.environ, "MODELSERVE_TRACING": "1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}
    done = subprocess.run(
        [sys.executable, "-m", "modelserve", str(root), "--port", str(free_port())],
        env=environment,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "OTEL_EXPORTER_OTLP_PROTOCOL='http/json'" in done.stderr
    assert "http/protobuf, grpc" in done.stderr


def test_spans_a_full_queue_drops_are_counted(tmp_path: Path, start_server: Any) -> None:
    # A collector that takes the connection and never answers: the first batch's export waits on it, and the
    # spans that follow find the queue (two spans) full.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        root = write_project(tmp_path, PROJECT)
        settings = {
            "MODELSERVE_TRACING": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{silent.getsockname()[1]}",
            "OTEL_TRACES_SAMPLER": "always_on",
            "OTEL_BSP_MAX_QUEUE_SIZE": "2",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_EXPORTER_OTLP_TIMEOUT": "60",
        }
        server = start_server(root, env=settings)
        server.wait_ready()
        for _ in range(8):  # three spans each: the server span and two stages
            assert httpx.post(f"{server.url}/stages", json={"x": 1}).status_code == 200
        # 24 spans: at most two in the export that waits and two queued; the others were dropped, and counted
        assert dropped(server.url) >= 24 - 4
        deadline = time.monotonic() + 30
        while "faster than they are exported" not in server.log:
            assert time.monotonic() < deadline, server.log
            time.sleep(0.05)
        assert httpx.post(f"{server.url}/stages", json={"x": 2}).status_code == 200
        assert server.log.count("faster than they are exported") == 1
        server.stop(signal.SIGKILL)  # its exporter waits on the silent collector
    finally:
        silent.close()
