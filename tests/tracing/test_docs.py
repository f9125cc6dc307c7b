"""docs/observability.md's "Traces" section says what is true: its yaml turns tracing on, its walkthrough's
command and curl give the span tree it draws, its snippet continues the trace into another API, and its
benchmark command names the benchmark's options."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from modelserve.config import load_project_config
from tests.conftest import REPO, free_port, write_project
from tests.test_readme import blocks, command_lines, curl_request, page, section
from tests.tracing.receiver import Receiver, Span, children, env

TRACES = section(page("observability.md"), "Traces")


def tree(text: str) -> tuple[str, list[str]]:
    """(the root's name, its children's names) of a span tree drawn in a text block."""
    lines = [line for line in text.splitlines() if line.strip()]
    root = re.split(r"\s{2,}", lines[0].strip())[0]  # a name, then its comment after two spaces or more
    names = [re.sub(r"^[\s│├└─]+", "", line).split()[0] for line in lines[1:] if line.startswith(("├", "└"))]
    return root, names


def ready(base: str) -> bool:
    try:
        return httpx.get(base + "/readyz").status_code == 200
    except httpx.TransportError:
        return False


def test_the_yaml_turns_tracing_on(tmp_path: Path) -> None:
    (yaml_text,) = blocks(TRACES, "yaml")
    root = write_project(tmp_path, {"modelserve.yaml": yaml_text, "model.py": "class Model:\n    pass\n"})
    assert load_project_config(root).tracing


def test_the_walkthrough_gives_the_span_tree_it_draws(tmp_path: Path, receiver: Receiver) -> None:
    install, serve, call = (command_lines(block)[0] for block in blocks(TRACES, "bash")[:3])
    assert install == 'pip install -e ".[tracing]"'
    words = shlex.split(serve)
    variables = dict(word.split("=", 1) for word in words if "=" in word and not word.startswith("-"))
    command = [word for word in words if word not in {f"{k}={v}" for k, v in variables.items()}]
    assert command[0] == "modelserve" and variables["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://127.0.0.1:4318"
    port = free_port()
    environment = {
        **os.environ,
        **variables,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    environment.pop("MODELSERVE_TRACING", None)  # --tracing alone turns it on
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "modelserve", *command[1:], "--port", str(port)],
        cwd=REPO,
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while not ready(base):
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "server.log").read_text()
            time.sleep(0.05)
        request = curl_request(call, base)
        trace_id, caller = request.headers["traceparent"].split("-")[1:3]
        with httpx.Client() as client:
            answer = client.send(request)
        assert answer.status_code == 200
        assert answer.headers["traceparent"].split("-")[1] == trace_id
        root_name, drawn = tree(blocks(TRACES, "text")[0])

        def received(spans: list[Span]) -> Any:
            server = next((s for s in spans if s.trace_id == trace_id and s.parent_id == caller), None)
            if server is None:
                return None
            names = [s.name for s in sorted(children(spans, server), key=lambda s: s.start)]
            return (server, names) if len(names) >= len(drawn) else None

        server, names = receiver.wait_for(received)
        assert server.name == root_name and server.service == variables["OTEL_SERVICE_NAME"]
        assert sorted(names) == sorted(drawn)
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def test_the_snippet_continues_the_trace_into_another_api(
    tmp_path: Path, start_server: Any, receiver: Receiver
) -> None:
    (snippet,) = blocks(TRACES, "python")
    project = write_project(
        tmp_path,
        {
            "front.py": snippet,
            "back.py": "class Model:\n    def predict(self, inputs):\n        return {'back': inputs}\n",
            "modelserve.yaml": """
                apis:
                  - name: front
                    handler: {path: front.py}
                  - name: back
                    handler: {path: back.py}
            """,
        },
    )
    server = start_server(project, env=env(receiver))
    server.wait_ready()
    answer = httpx.post(server.url + "/front", json={"x": 1})
    assert answer.json() == {"back": {"x": 1}}
    trace_id = answer.headers["traceparent"].split("-")[1]

    def both(spans: list[Span]) -> Any:
        mine = {s.attributes.get("http.route"): s for s in spans if s.trace_id == trace_id and s.kind == 2}
        return mine if {"/front", "/back"} <= set(mine) else None

    spans = receiver.wait_for(both)
    assert spans["/back"].parent_id == spans["/front"].span_id


def test_the_benchmark_command_names_its_options() -> None:
    (command,) = command_lines(blocks(section(TRACES, "What tracing costs"), "bash")[0])
    words = shlex.split(command)
    assert words[:2] == ["python", "benchmarks/tracing_cost.py"]
    usage = subprocess.run([sys.executable, words[1], "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0, usage.stderr
    for option in words[2::2]:
        assert option in usage.stdout, option
