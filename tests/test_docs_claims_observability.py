"""What docs/observability.md (its metrics and its logs) and docs/containers.md promise, held to a real server
where no other test held it: the metrics tables, the OpenMetrics answer Prometheus gets, in-flight requests of
a batched API, values a user metric refuses, the keys of a JSON line, which stream a line goes to, the log
level and the access lines, a server that drains, and the image's health check."""

from __future__ import annotations

import json
import math
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelserve import cli, container
from tests.conftest import REPO, Server, write_project
from tests.deploy.test_container import instructions, manifests
from tests.test_metrics import parse, value

OBSERVABILITY = (REPO / "docs" / "observability.md").read_text(encoding="utf-8")
CONTAINERS = (REPO / "docs" / "containers.md").read_text(encoding="utf-8")


def says(page: str, phrase: str) -> bool:
    """Whether `page` has `phrase`, however its lines are wrapped."""
    return " ".join(phrase.split()) in " ".join(page.split())


MODEL = """
import asyncio
import logging
import threading

from modelserve import logger

#: Opened by the `opener` API: until then every batch of `held` waits.
GATE = threading.Event()


class Scored:
    def __init__(self, config, metrics_client):
        self.metrics = metrics_client

    def predict(self, inputs):
        if "call" in inputs:
            getattr(self.metrics, inputs["call"])(inputs["name"], float(inputs["value"]))
        if inputs.get("log"):
            logging.info("user info line")
            extra = {"exc_info": "mine", "stack_info": "s", "trace_id": "t", "span_id": "u", "logger": "l"}
            logger.info("extras", extra={**extra, "request_id": "r", "api": "a", "rows": 3})
            try:
                raise ValueError("logged on purpose")
            except ValueError:
                logger.exception("failed here", extra={"exc_info": "mine"})
            print("printed as is", flush=True)
        return {"ok": True}


class Held:
    def predict(self, batch):
        GATE.wait(30)
        return [{"size": len(batch)} for _ in batch]


class Opener:
    def predict(self, inputs):
        GATE.set()
        return {"open": True}


class Slow:
    async def predict(self, inputs):
        await asyncio.sleep(inputs["seconds"])
        return {"slept": inputs["seconds"]}


class Job:
    async def handle_async(self, payload):
        await asyncio.sleep(60)
"""

CONFIG = """
apis:
  - name: scored
    handler: {path: model.py, class: Scored}
  - name: held
    handler: {path: model.py, class: Held}
    max_concurrency: 1
    max_queue_length: 8
    batching: {max_batch_size: 2}
  - name: opener
    handler: {path: model.py, class: Opener}
"""


class SplitServer(Server):
    """A server whose stdout goes to `out_path` and stderr to the log file (`log`)."""

    def _streams(self) -> tuple[Any, Any]:
        self.out_path = self.log_path.with_suffix(".out")
        self._out = open(self.out_path, "wb")  # noqa: SIM115 - closed in stop()
        return self._out, self._log

    @property
    def out(self) -> str:
        return self.out_path.read_text(encoding="utf-8", errors="replace")

    def stop(self, *args: Any, **kwargs: Any) -> int:
        code = super().stop(*args, **kwargs)
        self._out.close()
        return code


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SplitServer]:
    folder = tmp_path_factory.mktemp("observability")
    project = write_project(folder / "project", {"model.py": MODEL, "modelserve.yaml": CONFIG})
    server = SplitServer(project, "--log-format", "json", log_dir=folder)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def scrape(server: Server, accept: str | None = None) -> httpx.Response:
    answer = httpx.get(server.url + "/metrics", headers={"accept": accept} if accept else {})
    assert answer.status_code == 200
    return answer


def eventually(read: Callable[[], Any], timeout: float = 10) -> Any:
    """What `read` returns once it is truthy (a line written after the answer was sent, say)."""
    deadline = time.monotonic() + timeout
    while True:
        found = read()
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


# ---------------------------------------------------------------------------------------------------
# docs/observability.md: metrics


def metric_rows() -> list[tuple[list[str], str, str]]:
    """(names, type, labels) of each row of the two tables of "Built-in metrics"."""
    section = OBSERVABILITY[OBSERVABILITY.index("### Built-in metrics") : OBSERVABILITY.index("Latency histograms")]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            rows.append((re.findall(r"`([a-z_]+)`", cells[0]), cells[1], cells[2]))
    return rows


def test_the_metrics_tables_give_each_family_its_type_and_labels(served: Server) -> None:
    """Every series carries the labels its row names (`modelserve_auth_failures_total` has no `api`: "every
    series has the label api" said otherwise), and every family has its row's type."""
    assert httpx.post(served.url + "/scored", json={}).status_code == 200
    families = parse(scrape(served).text)
    rows = metric_rows()
    assert len(rows) == 17
    for names, kind, labels in rows:
        expected = set() if "--workers" in labels else set(re.findall(r"`([a-z_]+)`", labels))
        for name in names:
            family = families.get(name) or families.get(name.removesuffix("_total"))
            if family is None:
                assert name == "modelserve_spans_dropped_total"  # with tracing on only
                continue
            wanted = kind.split()[0]
            if kind.startswith("counter, gauges"):  # the process row
                wanted = "counter" if name.endswith("_total") else "gauge"
            assert family.type == wanted, (name, family.type, kind)
            for sample in family.samples:
                assert set(sample.labels) - {"le"} == expected, (name, sample)


def test_prometheus_gets_openmetrics_on_every_scrape_tracing_or_not(served: Server) -> None:
    """The page said Prometheus asks for OpenMetrics only with --enable-feature=exemplar-storage: the Accept it
    quotes is the one Prometheus 2.42 sends with no flag at all, and it gets OpenMetrics (no tracing here)."""
    (accept,) = re.findall(r"`Accept: ([^`]+)`", OBSERVABILITY)
    answer = scrape(served, accept)
    assert answer.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    text = answer.text
    assert text.endswith("# EOF\n")
    assert "# TYPE modelserve_requests counter\n" in text
    assert re.search(r"^modelserve_requests_total\{", text, re.MULTILINE)
    assert "_created" not in text
    plain = scrape(served)  # curl's Accept: */*
    assert plain.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "# EOF" not in plain.text


def test_a_batched_api_counts_the_requests_it_admitted_as_in_flight(served: Server) -> None:
    """`modelserve_requests_in_flight` said "at most max_concurrency": a batched API (max_concurrency 1,
    max_batch_size 2) has (1 + 1) x 2 requests in flight, the rest waiting."""
    answers: list[int] = []

    def call() -> None:
        answers.append(httpx.post(served.url + "/held", json={"x": 1}, timeout=60).status_code)

    threads = [threading.Thread(target=call) for _ in range(6)]
    for thread in threads:
        thread.start()
    try:

        def counts() -> tuple[float, float] | None:
            families = parse(scrape(served).text)
            found = (
                value(families, "modelserve_requests_in_flight", api="held"),
                value(families, "modelserve_requests_waiting", api="held"),
            )
            return found if found == (4, 2) else None

        assert eventually(counts) == (4, 2)
    finally:
        assert httpx.post(served.url + "/opener", json={}).status_code == 200
        for thread in threads:
            thread.join(60)
    assert answers == [200] * 6
    assert "`(max_concurrency + 1) × max_batch_size`" in OBSERVABILITY


@pytest.mark.parametrize(
    ("call", "number"), [("increment", "nan"), ("increment", "inf"), ("histogram", "nan"), ("histogram", "-inf")]
)
def test_a_user_metric_refuses_a_value_that_would_stay_in_it_for_good(served: Server, call: str, number: str) -> None:
    """`increment("hits", nan)` was taken: the counter read NaN from then on (a histogram's _sum the same)."""
    name = f"poisoned_{call}_{number.strip('-')}"
    answer = httpx.post(served.url + "/scored", json={"call": call, "name": name, "value": number})
    assert answer.status_code == 500
    kind = "counter" if call == "increment" else call
    assert eventually(lambda: f"{kind} {name!r} can only" in served.log)  # the log says why
    families = parse(scrape(served).text)
    for family in families.values():
        for sample in family.samples:
            assert not sample.name.startswith(name) or math.isfinite(sample.value), sample
    assert httpx.post(served.url + "/scored", json={"call": call, "name": name, "value": "2"}).status_code == 200
    families = parse(scrape(served).text)
    assert value(families, f"{name}_total" if call == "increment" else f"{name}_sum") == 2


def test_a_gauge_takes_nan(served: Server) -> None:
    answer = httpx.post(served.url + "/scored", json={"call": "gauge", "name": "unknown", "value": "nan"})
    assert answer.status_code == 200
    assert math.isnan(value(parse(scrape(served).text), "unknown"))


@pytest.mark.parametrize("exists", [True, False], ids=["an-old-folder", "a-missing-folder"])
def test_a_server_of_one_process_leaves_out_an_inherited_multiprocess_folder(
    start_server: Any, tmp_path: Path, exists: bool
) -> None:
    """A PROMETHEUS_MULTIPROC_DIR in the environment (an image made for gunicorn) made one process add up that
    folder's files (an old folder's counts with its own), and a missing folder failed at start, with a traceback."""
    folder = tmp_path / "multiproc"
    if exists:
        folder.mkdir()
    project = write_project(tmp_path / "p", {"model.py": MODEL, "modelserve.yaml": CONFIG})
    server = start_server(project, env={"PROMETHEUS_MULTIPROC_DIR": str(folder)})
    server.wait_ready()
    for _ in range(3):
        assert httpx.post(server.url + "/scored", json={}).status_code == 200
    assert value(parse(scrape(server).text), "modelserve_requests_total", api="scored", code="200") == 3
    assert not exists or not list(folder.iterdir())  # counted in memory: nothing written there
    assert f"PROMETHEUS_MULTIPROC_DIR={folder} is left out" in server.log
    assert says(OBSERVABILITY, "the CLI leaves out a `PROMETHEUS_MULTIPROC_DIR` it inherits")


# ---------------------------------------------------------------------------------------------------
# docs/observability.md: logs


@pytest.fixture(scope="module")
def logged(served: SplitServer) -> tuple[list[dict[str, Any]], str]:
    """The JSON lines of stderr written for one request that logs, and the whole of stdout."""
    request_id = "logged-1"
    answer = httpx.post(served.url + "/scored", json={"log": True}, headers={"x-request-id": request_id})
    assert answer.status_code == 200
    assert eventually(lambda: f'"request_id":"{request_id}"' in served.out)  # the access line, once written

    def lines() -> list[dict[str, Any]]:
        return [line for line in json_lines(served.log) if line.get("request_id") == request_id]

    assert len(eventually(lambda: len(lines()) >= 3 and lines())) == 3  # logging.info, extras, failed here
    return lines(), served.out


def test_extra_keys_named_as_modelserve_s_keys_are_renamed_on_every_line(logged: Any) -> None:
    """`extra={"exc_info": ...}` was written as `exc_info`, and lost to the traceback of a logger.exception."""
    lines, _ = logged
    (extras,) = [line for line in lines if line["message"] == "extras"]
    assert extras["logger"] == "modelserve.user" and extras["api"] == "scored"
    for key, given in {"exc_info": "mine", "stack_info": "s", "trace_id": "t", "span_id": "u", "logger": "l"}.items():
        assert extras["extra_" + key] == given
    assert (extras["extra_request_id"], extras["extra_api"], extras["rows"]) == ("r", "a", 3)
    assert not {"exc_info", "stack_info", "trace_id", "span_id"} & set(extras)
    (failed,) = [line for line in lines if line["message"] == "failed here"]
    assert "ValueError: logged on purpose" in failed["exc_info"]
    assert failed["extra_exc_info"] == "mine"


def test_access_lines_go_to_stdout_and_every_other_line_to_stderr(served: SplitServer, logged: Any) -> None:
    """The page said "errors and warnings go to stderr": INFO lines (loading, user code's) do too."""
    lines, out = logged
    (info,) = [line for line in lines if line["message"] == "user info line"]
    assert (info["levelname"], info["logger"]) == ("INFO", "root")
    loading = [line for line in json_lines(served.log) if line["message"] == "api 'scored' is loading (model_class)"]
    assert [line["levelname"] for line in loading] == ["INFO"]
    assert not [line for line in json_lines(served.log) if line["logger"] == "modelserve.access"]
    assert "printed as is\n" in out  # print() as is, on stdout
    on_stdout = json_lines(out)
    assert on_stdout and {line["logger"] for line in on_stdout} == {"modelserve.access"}
    assert [line["status"] for line in on_stdout if line.get("request_id") == "logged-1"] == [200]


def test_log_level_warning_leaves_the_access_lines_out(start_server: Any, tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", {"model.py": MODEL, "modelserve.yaml": CONFIG})
    server = start_server(project, "--log-level", "warning")
    server.wait_ready()
    assert httpx.post(server.url + "/scored", json={}).status_code == 200
    assert httpx.get(server.url + "/nowhere").status_code == 404
    assert server.stop() == 0
    assert "modelserve.access" not in server.log and "uvicorn.access" not in server.log
    assert '"POST /scored' not in server.log and '"GET /nowhere' not in server.log
    assert says(OBSERVABILITY, "Access lines are INFO lines: `--log-level warning` (or above) leaves them out too.")


def test_a_websocket_session_has_its_access_line_once_it_ends(start_server: Any) -> None:
    from websockets.sync.client import connect

    server = start_server(REPO / "tests" / "data" / "truss" / "websocket_endpoint", "--log-format", "json")
    server.wait_ready()
    with connect(f"ws://127.0.0.1:{server.port}/v1/websocket") as session:
        session.send("hi")
        assert session.recv() == "hi pong"
    assert server.stop() == 0
    (line,) = [line for line in json_lines(server.log) if line.get("path") == "/v1/websocket"]
    assert (line["logger"], line["method"], line["status"], line["api"]) == ("modelserve.access", "GET", 101, "model")
    assert says(OBSERVABILITY, "and WebSocket sessions, once they end: `GET` with status 101")


# ---------------------------------------------------------------------------------------------------
# docs/containers.md (and the readiness section of docs/observability.md)


def test_a_draining_server_refuses_probes_and_then_gives_running_jobs_their_own_wait(
    start_server: Any, tmp_path: Path
) -> None:
    """At SIGTERM the probes are refused (the pages said /readyz answers 503 while draining) while the request in
    flight is answered; the running job's wait begins once the requests have finished, after theirs."""
    config = """
        jobs: {store: memory}
        apis:
          - name: slow
            handler: {path: model.py, class: Slow}
          - name: job
            kind: async
            handler: {path: model.py, class: Job}
    """
    project = write_project(tmp_path / "p", {"model.py": MODEL, "modelserve.yaml": config})
    server = start_server(project, "--graceful-timeout", "3")
    server.wait_ready()
    job = httpx.post(server.url + "/job", json={}).json()["id"]
    running = eventually(lambda: httpx.get(f"{server.url}/job/{job}").json()["status"] == "in_progress")
    assert running
    answer: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: answer.append(httpx.post(server.url + "/slow", json={"seconds": 1.5}, timeout=30))
    )
    thread.start()

    def in_flight() -> bool:
        return value(parse(scrape(server).text), "modelserve_requests_in_flight", api="slow") == 1

    assert eventually(in_flight)
    server.process.send_signal(signal.SIGTERM)
    assert eventually(lambda: "Waiting for connections to close" in server.log)  # uvicorn closed its socket
    for probe in ("/readyz", "/healthz"):
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.url + probe)
    thread.join(30)
    assert answer[0].status_code == 200
    assert server.wait_exit() == 0
    log = server.log
    answered = log.index('"POST /slow HTTP/1.1" 200')
    assert answered < log.index("api 'job': waiting up to 3.0 s for 1 running job(s)")
    assert says(CONTAINERS, "At SIGTERM the server stops listening at once while its in-flight requests finish")
    assert says(OBSERVABILITY, "the server stops listening at once, while its requests finish")


def test_the_health_check_probes_the_port_the_dockerfile_was_written_for(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", {"model.py": "class Model:\n    def predict(self, x):\n        return x\n"})
    default = container.dockerfile(project)
    assert f"'http://127.0.0.1:{cli.DEFAULT_PORT}/healthz'" in instructions(default, "HEALTHCHECK")[0]
    assert f"`http://127.0.0.1:{cli.DEFAULT_PORT}/healthz`" in CONTAINERS
    moved = container.dockerfile(project, port=8080)
    assert "'http://127.0.0.1:8080/healthz'" in instructions(moved, "HEALTHCHECK")[0]
    assert json.loads(instructions(moved, "ENTRYPOINT")[0])[-2:] == ["--port", "8080"]


def test_the_grace_period_outlasts_the_pre_stop_sleep_and_the_graceful_timeout() -> None:
    documents = {doc["kind"]: doc for doc in manifests()}
    pod = documents["Deployment"]["spec"]["template"]["spec"]
    (server,) = pod["containers"]
    command = server["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > float(command[1]) + cli.DEFAULT_GRACE
