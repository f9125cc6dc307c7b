"""GET /metrics after known traffic, parsed with prometheus-client's parser; the metrics_client; workers."""

from __future__ import annotations

import asyncio
import logging
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_exposition
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.values import MutexValue

import modelserve
from modelserve.metrics import Exemplars, _forget_dead_workers, has_exemplar_seam
from tests.conftest import free_port, write_project

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def parse(text: str) -> dict[str, Any]:
    """{family name: family} of an exposition."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict[str, Any], sample: str, **labels: str) -> float:
    """The value of one sample (by sample name and labels); 0 when it is absent."""
    family_name = sample
    for suffix in ("_total", "_count", "_sum", "_bucket"):
        if sample.endswith(suffix) and sample[: -len(suffix)] in families:
            family_name = sample[: -len(suffix)]
    for found in families[family_name].samples:
        if found.name == sample and found.labels == labels:
            return float(found.value)
    return 0.0


async def scrape(client: httpx.AsyncClient) -> dict[str, Any]:
    answer = await client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(answer.text)


@pytest.fixture
async def client_of() -> AsyncIterator[Any]:
    clients: list[httpx.AsyncClient] = []

    async def make(app: Any) -> httpx.AsyncClient:
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
        clients.append(client)
        await app.server.wait_loaded()
        return client

    yield make
    for client in clients:
        await client.aclose()


@pytest.fixture
def error_log() -> Iterator[list[str]]:
    """Messages of the records of the ``modelserve`` logger (whatever logging config an earlier test left)."""
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Keep(logging.ERROR)
    log = logging.getLogger("modelserve")
    log.addHandler(handler)
    yield messages
    log.removeHandler(handler)


# ---------------------------------------------------------------------------------------------------
# built-in metrics


class Staged:
    """A sync preprocess (timed in a worker thread), an async predict that can fail, a sync postprocess."""

    def load(self) -> None:
        time.sleep(0.02)

    def preprocess(self, inputs: dict[str, Any]) -> dict[str, Any]:
        return inputs

    async def predict(self, inputs: dict[str, Any]) -> dict[str, Any]:
        if inputs.get("fail"):
            raise RuntimeError("asked to fail")
        return inputs

    def postprocess(self, result: dict[str, Any]) -> dict[str, Any]:
        return result


async def test_requests_by_code_and_stage_latency_after_known_traffic(client_of: Any) -> None:
    client = await client_of(modelserve.create_app(handler=Staged, name="staged"))
    for _ in range(3):
        assert (await client.post("/staged", json={"x": 1})).status_code == 200
    for _ in range(2):
        assert (await client.post("/staged", json={"fail": True})).status_code == 500
    bad = await client.post("/staged", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400

    families = await scrape(client)
    assert value(families, "modelserve_requests_total", api="staged", code="200") == 3
    assert value(families, "modelserve_requests_total", api="staged", code="500") == 2
    assert value(families, "modelserve_requests_total", api="staged", code="400") == 1
    assert value(families, "modelserve_request_duration_seconds_count", api="staged") == 6
    assert value(families, "modelserve_request_duration_seconds_bucket", api="staged", le="+Inf") == 6
    # the 400 never reached a stage; the failing predicts are not timed; postprocess ran after 3 predicts
    for stage, count in {"preprocess": 5, "predict": 3, "postprocess": 3}.items():
        assert value(families, "modelserve_stage_duration_seconds_count", api="staged", stage=stage) == count
    assert value(families, "modelserve_stage_duration_seconds_sum", api="staged", stage="predict") > 0
    assert value(families, "modelserve_model_load_seconds", api="staged") >= 0.02
    assert value(families, "modelserve_requests_in_flight", api="staged") == 0
    # a second scrape does not count anything twice
    again = await scrape(client)
    assert value(again, "modelserve_requests_total", api="staged", code="200") == 3
    assert value(again, "modelserve_stage_duration_seconds_count", api="staged", stage="preprocess") == 5


async def test_every_built_in_family_exists_and_no_created_series(client_of: Any) -> None:
    client = await client_of(modelserve.create_app(handler=Staged, name="staged"))
    answer = await client.get("/metrics")
    families = parse(answer.text)
    expected = {
        "modelserve_requests": "counter",
        "modelserve_request_duration_seconds": "histogram",
        "modelserve_stage_duration_seconds": "histogram",
        "modelserve_requests_in_flight": "gauge",
        "modelserve_requests_waiting": "gauge",
        "modelserve_queue_full": "counter",
        "modelserve_requests_cancelled": "counter",
        "modelserve_jobs": "counter",
        "modelserve_jobs_queue_depth": "gauge",
        "modelserve_model_load_seconds": "gauge",
        "modelserve_batch_size": "histogram",
        "modelserve_batch_wait_seconds": "histogram",
    }
    assert {name: families[name].type for name in expected} == expected
    assert "_created" not in answer.text


async def test_process_platform_and_build_info(client_of: Any) -> None:
    client = await client_of(modelserve.create_app(handler=Staged, name="staged"))
    families = await scrape(client)
    assert value(families, "process_resident_memory_bytes") > 0
    assert value(families, "process_open_fds") > 0
    assert families["process_cpu_seconds"].type == "counter"
    assert families["python_info"].samples[0].labels["version"] == platform.python_version()
    (build,) = families["modelserve_build_info"].samples
    assert build.value == 1
    assert build.labels["version"] == modelserve.__version__
    assert build.labels["python"] == platform.python_version()
    assert set(build.labels["runtimes"].split(",")) <= {"onnx", "tensorflow"}
    assert "onnx" in build.labels["runtimes"]  # onnxruntime is installed for the tests


def _otlp() -> Any:
    """tests/tracing's OTLP receiver; skips where OpenTelemetry (the `tracing` extra) is not installed, as in the
    floors' venv."""
    return pytest.importorskip("tests.tracing.receiver")


def test_openmetrics_answers_carry_exemplars_with_the_trace_id_when_tracing_is_on(
    tmp_path: Path, start_server: Any
) -> None:
    otlp = _otlp()
    receiver = otlp.Receiver()
    try:
        project = write_project(
            tmp_path / "p", {"model.py": "class Model:\n    def predict(self, inputs):\n        return {}\n"}
        )
        server = start_server(project, env=otlp.env(receiver))
        server.wait_ready()
        traces = {httpx.post(server.url + "/", json={}).headers["traceparent"].split("-")[1] for _ in range(3)}
        plain = httpx.get(server.url + "/metrics")
        assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "trace_id" not in plain.text  # the Prometheus text format has no exemplars
        answer = httpx.get(server.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert answer.headers["content-type"].startswith("application/openmetrics-text")
        families = {family.name: family for family in openmetrics_families(answer.text)}
        exemplars = [
            sample.exemplar
            for sample in families["modelserve_request_duration_seconds"].samples
            if sample.exemplar is not None
        ]
        assert exemplars
        assert {exemplar.labels["trace_id"] for exemplar in exemplars} <= traces
    finally:
        receiver.close()


class Held:
    """An async predict that waits until the test lets it go; `started` is set once it runs."""

    started: asyncio.Event
    release: asyncio.Event

    async def predict(self, inputs: Any) -> Any:
        Held.started.set()
        await Held.release.wait()
        return "done"


async def until(condition: Any, timeout: float = 5) -> None:
    """Let the event loop run until `condition()` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


async def test_in_flight_waiting_and_queue_full(client_of: Any) -> None:
    Held.started, Held.release = asyncio.Event(), asyncio.Event()
    app = modelserve.create_app(handler=Held, name="held", max_concurrency=1, max_queue_length=1)
    client = await client_of(app)
    running = asyncio.create_task(client.post("/held", content=b""))
    await Held.started.wait()
    waiting = asyncio.create_task(client.post("/held", content=b""))
    await until(lambda: app.server.apis["held"].limiter.waiting == 1)
    refused = await client.post("/held", content=b"")
    assert refused.status_code == 503

    families = await scrape(client)
    assert value(families, "modelserve_requests_in_flight", api="held") == 1
    assert value(families, "modelserve_requests_waiting", api="held") == 1
    assert value(families, "modelserve_queue_full_total", api="held") == 1
    assert value(families, "modelserve_requests_total", api="held", code="503") == 1

    Held.release.set()
    assert [(await running).status_code, (await waiting).status_code] == [200, 200]
    families = await scrape(client)
    assert value(families, "modelserve_requests_in_flight", api="held") == 0
    assert value(families, "modelserve_requests_waiting", api="held") == 0
    assert value(families, "modelserve_requests_total", api="held", code="200") == 2


class Slow:
    async def predict(self, inputs: Any) -> Any:
        await asyncio.sleep(30)


async def test_a_timeout_is_counted_as_cancelled(client_of: Any) -> None:
    client = await client_of(modelserve.create_app(handler=Slow, name="slow", timeout=0.05))
    assert (await client.post("/slow", content=b"")).status_code == 504
    families = await scrape(client)
    assert value(families, "modelserve_requests_cancelled_total", api="slow", reason="timeout") == 1
    assert value(families, "modelserve_requests_total", api="slow", code="504") == 1


# ---------------------------------------------------------------------------------------------------
# metrics_client


class Recorder:
    """Calls the metrics_client as each request says: {"call": "increment", "name": ..., "value": ..., "tags": ...}."""

    def __init__(self, metrics_client: modelserve.MetricsClient) -> None:
        self.metrics = metrics_client

    def predict(self, inputs: dict[str, Any]) -> str:
        record = getattr(self.metrics, inputs["call"])
        record(inputs["name"], inputs.get("value", 1), tags=inputs.get("tags"))
        return "ok"


async def test_metrics_client_values_reach_metrics_with_tags_as_labels(client_of: Any) -> None:
    client = await client_of(modelserve.create_app(handler=Recorder, name="rec"))
    calls = [
        {"call": "increment", "name": "cache_hits", "tags": {"model": "iris"}},
        {"call": "increment", "name": "cache_hits", "value": 2, "tags": {"model": "iris"}},
        {"call": "increment", "name": "cache_hits", "tags": {"model": "wine"}},
        {"call": "gauge", "name": "queue_size", "value": 7},
        {"call": "gauge", "name": "queue_size", "value": 3},
        {"call": "histogram", "name": "tokens", "value": 0.3, "tags": {"kind": "in"}},
        {"call": "histogram", "name": "tokens", "value": 4, "tags": {"kind": "in"}},
    ]
    for call in calls:
        assert (await client.post("/rec", json=call)).status_code == 200
    families = await scrape(client)
    assert families["cache_hits"].type == "counter"
    assert value(families, "cache_hits_total", model="iris") == 3
    assert value(families, "cache_hits_total", model="wine") == 1
    assert value(families, "queue_size") == 3
    assert value(families, "tokens_count", kind="in") == 2
    assert value(families, "tokens_sum", kind="in") == pytest.approx(4.3)
    assert value(families, "tokens_bucket", kind="in", le="0.5") == 1


@pytest.mark.parametrize(
    ("first", "second", "reason"),
    [
        (None, {"call": "increment", "name": "1st_metric"}, "not a valid Prometheus name"),
        (None, {"call": "gauge", "name": "bad-name", "value": 1}, "not a valid Prometheus name"),
        (None, {"call": "increment", "name": "modelserve_requests"}, "is reserved"),
        (None, {"call": "increment", "name": "hits", "tags": {"bad-key": "x"}}, "not a valid Prometheus label"),
        (None, {"call": "gauge", "name": "level", "value": "high"}, "must be a number"),
        (None, {"call": "increment", "name": "hits", "value": -1}, "value >= 0"),
        (
            {"call": "increment", "name": "hits", "tags": {"model": "a"}},
            {"call": "increment", "name": "hits", "tags": {"version": "1"}},
            "first used with tags ['model'] and now with ['version']",
        ),
        ({"call": "increment", "name": "hits"}, {"call": "gauge", "name": "hits", "value": 1}, "is a counter"),
        (
            {"call": "increment", "name": "hits"},
            {"call": "gauge", "name": "hits_total", "value": 1},
            "would write samples named 'hits_total'",
        ),
    ],
)
async def test_a_bad_metric_is_a_500_whose_log_says_why(
    client_of: Any, error_log: list[str], first: dict[str, Any] | None, second: dict[str, Any], reason: str
) -> None:
    client = await client_of(modelserve.create_app(handler=Recorder, name="rec"))
    if first is not None:
        assert (await client.post("/rec", json=first)).status_code == 200
    answer = await client.post("/rec", json=second)
    assert answer.status_code == 500
    assert answer.json()["error"].startswith("internal server error")  # the reason is in the log only
    assert "MetricsError" not in answer.text
    assert any("MetricsError" in message and reason in message for message in error_log), error_log
    # the server goes on serving, and the bad call left nothing behind
    assert (await client.post("/rec", json={"call": "increment", "name": "fine"})).status_code == 200
    families = await scrape(client)
    assert value(families, "fine_total") == 1


# ---------------------------------------------------------------------------------------------------
# several worker processes


def test_workers_share_one_metrics_answer_and_the_directory_is_removed(tmp_path: Path, start_server: Any) -> None:
    project = write_project(
        tmp_path / "p",
        {
            "model.py": """
                import os

                class Model:
                    def __init__(self, metrics_client):
                        self.metrics = metrics_client

                    def predict(self, inputs):
                        self.metrics.increment("served", tags={"kind": "test"})
                        return {"pid": os.getpid()}
            """
        },
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    server = start_server(project, "--workers", "2", "--no-access-log", env={"TMPDIR": str(scratch)})
    server.wait_ready(consecutive=20)
    (metrics_dir,) = scratch.glob("modelserve-metrics-*")
    pids: set[int] = set()
    sent = 0
    deadline = time.monotonic() + 30
    while len(pids) < 2 or sent < 20:  # a new connection per request: both workers end up serving
        assert time.monotonic() < deadline, f"only workers {pids} answered"
        answer = httpx.post(server.url + "/", json={})
        assert answer.status_code == 200
        pids.add(answer.json()["pid"])
        sent += 1

    # Each worker flushes every second: within a few, any worker's answer holds every request.
    deadline = time.monotonic() + 10
    while True:
        families = parse(httpx.get(server.url + "/metrics").text)
        total = value(families, "modelserve_requests_total", api="model", code="200")
        if total == sent or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert total == sent
    assert value(families, "modelserve_request_duration_seconds_count", api="model") == sent
    assert value(families, "modelserve_stage_duration_seconds_count", api="model", stage="predict") == sent
    assert value(families, "served_total", kind="test") == sent
    assert value(families, "modelserve_model_load_seconds", api="model") > 0
    # each worker's process metrics, told apart by pid, whichever worker answered
    memory = {sample.labels["pid"] for sample in families["process_resident_memory_bytes"].samples}
    assert memory == {str(pid) for pid in pids}
    assert server.stop() == 0
    assert not metrics_dir.exists()


def test_live_gauges_of_dead_workers_are_dropped(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"gauge_livesum_{gone.pid}.db"
    alive = tmp_path / f"gauge_livesum_{os.getpid()}.db"
    counter = tmp_path / f"counter_{gone.pid}.db"
    for path in (dead, alive, counter):
        path.write_bytes(b"")
    _forget_dead_workers(str(tmp_path))
    assert not dead.exists()
    assert alive.exists()
    assert counter.exists()  # a dead worker's counts still count


# ---------------------------------------------------------------------------------------------------
# the request path


async def test_the_request_path_calls_no_prometheus_client_and_threads_lose_no_count(
    client_of: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = modelserve.create_app(handler=Staged, name="staged")
    client = await client_of(app)
    assert (await client.post("/staged", json={})).status_code == 200  # first sight of code 200 and each stage
    await scrape(client)
    lookups: list[tuple[Any, ...]] = []
    original = MetricWrapperBase.labels

    def counting_labels(self: Any, *args: Any, **kwargs: Any) -> Any:
        lookups.append(args)
        return original(self, *args, **kwargs)

    def counting_inc(self: Any, amount: float) -> None:
        lookups.append(("inc", amount))

    monkeypatch.setattr(MetricWrapperBase, "labels", counting_labels)
    monkeypatch.setattr(MutexValue, "inc", counting_inc)
    answers = await asyncio.gather(*(client.post("/staged", json={}) for _ in range(20)))
    assert {answer.status_code for answer in answers} == {200}
    assert lookups == []  # no label lookup and no prometheus-client value touched per request
    monkeypatch.undo()

    # sync stages are timed in several worker threads at once, scrapes run meanwhile: nothing is lost
    api_metrics = app.server.apis["staged"].metrics

    def time_stages() -> None:
        for _ in range(2000):
            api_metrics.stage_timer("threaded", 0.003)

    threads = [threading.Thread(target=time_stages) for _ in range(4)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        app.server.metrics.exposition()
    families = await scrape(client)
    assert value(families, "modelserve_stage_duration_seconds_count", api="staged", stage="threaded") == 8000
    assert value(families, "modelserve_stage_duration_seconds_bucket", api="staged", stage="threaded", le="0.0025") == 0
    assert (
        value(families, "modelserve_stage_duration_seconds_bucket", api="staged", stage="threaded", le="0.005") == 8000
    )
    assert value(families, "modelserve_stage_duration_seconds_sum", api="staged", stage="threaded") == pytest.approx(24)


def test_a_real_prometheus_scrapes_it_cleanly_with_exemplars(tmp_path: Path, start_server: Any) -> None:
    """Debian's Prometheus scrapes the server (asking for OpenMetrics, so it stores the exemplars), and its
    promtool finds nothing to say about the text exposition."""
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if prometheus is None or promtool is None:
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    otlp = _otlp()
    receiver = otlp.Receiver()
    process = None
    try:
        model = "class Model:\n    def predict(self, inputs):\n        return {}\n"
        server = start_server(write_project(tmp_path / "p", {"model.py": model}), env=otlp.env(receiver))
        server.wait_ready()
        traces = {httpx.post(server.url + "/", json={}).headers["traceparent"].split("-")[1] for _ in range(5)}
        lint = subprocess.run(
            [promtool, "check", "metrics"],
            input=httpx.get(server.url + "/metrics").text,
            capture_output=True,
            text=True,
        )
        assert (lint.returncode, lint.stdout + lint.stderr) == (0, "")
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s}\n"
            f"scrape_configs: [{{job_name: modelserve, static_configs: [{{targets: ['127.0.0.1:{server.port}']}}]}}]\n"
        )
        web = f"127.0.0.1:{free_port()}"
        process = subprocess.Popen(
            [
                prometheus,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address={web}",
                "--enable-feature=exemplar-storage",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        query: dict[str, Any] = {
            "query": "modelserve_request_duration_seconds_bucket",
            "start": time.time() - 600,
            "end": time.time() + 600,
        }
        deadline = time.monotonic() + 60
        found: set[str] = set()
        while not found:
            assert time.monotonic() < deadline and process.poll() is None, "no exemplar reached Prometheus"
            time.sleep(0.5)
            try:
                answer = httpx.get(f"http://{web}/api/v1/query_exemplars", params=query).json()
            except httpx.TransportError:
                continue
            found = {e["labels"]["trace_id"] for series in answer.get("data") or [] for e in series["exemplars"]}
        assert found <= traces
        (build,) = httpx.get(f"http://{web}/api/v1/query", params={"query": "modelserve_build_info"}).json()["data"][
            "result"
        ]
        assert build["metric"]["version"] == modelserve.__version__
    finally:
        if process is not None:
            process.terminate()
            process.wait(30)
        receiver.close()


def test_an_exemplar_goes_to_the_bucket_of_its_value_and_is_left_out_without_the_private_buckets() -> None:
    registry = CollectorRegistry()
    child = Histogram("latency_seconds", "test", ["api"], buckets=(0.1, 1.0), registry=registry).labels("a")
    assert has_exemplar_seam(child)
    Exemplars(child).offer(0.5, 1.0, int("ab" * 16, 16))
    exposition = openmetrics_exposition(registry).decode()
    assert 'latency_seconds_bucket{api="a",le="1.0"} 0.0 # {trace_id="' + "ab" * 16 + '"} 0.5' in exposition

    class Elsewhere:  # a histogram child of another shape
        def observe(self, value: float) -> None:
            pass

    assert not has_exemplar_seam(Elsewhere())
    Exemplars(Elsewhere()).offer(0.5, 1.0, 1)  # nothing to do, nothing raised


def test_a_route_s_exemplars_are_one_per_bucket_a_second_the_first_at_once() -> None:
    registry = CollectorRegistry()
    child = Histogram("latency_seconds", "test", ["api"], buckets=(0.1, 1.0), registry=registry).labels("a")
    exemplars = Exemplars(child, every=1.0)

    def shown() -> str:
        return openmetrics_exposition(registry).decode()

    exemplars.offer(0.5, 100.0, 0xAB)  # the first in its bucket: at once
    exemplars.offer(0.05, 100.1, 0xCD)  # another bucket: at once too
    exemplars.offer(0.6, 100.5, 0xEF)  # the first bucket again within the second: not kept
    assert f'le="1.0"}} 0.0 # {{trace_id="{0xAB:032x}"}} 0.5' in shown()
    assert f'le="0.1"}} 0.0 # {{trace_id="{0xCD:032x}"}} 0.05' in shown()
    exemplars.offer(0.7, 101.0, 0xEF)  # a second later: it replaces the first
    assert f'le="1.0"}} 0.0 # {{trace_id="{0xEF:032x}"}} 0.7' in shown()
