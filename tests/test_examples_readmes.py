"""The examples' READMEs run as written: each names the install its example needs and the folder to run from,
and every curl line of it answers what the README shows, against the example served by its README's command.

Parsed from the READMEs' fenced blocks (tests/test_readme.py's helpers), so that an edit that breaks a command,
an answer or the install line breaks a test here. Held elsewhere too: the POSTs of examples/iris
(tests/test_cli.py), iris-onnx and iris-tensorflow (tests/runtimes/); docs/v2.md's snippet against
examples/iris-onnx (tests/http/test_v2.py); async-sentiment's results and cancellations under a shorter delay
(tests/jobs/test_example_async.py) and its crash walk-through (tests/jobs/test_routes.py's kill -9 tests).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelserve import container
from modelserve.config import load_project_config
from tests.conftest import REPO, Server
from tests.test_readme import blocks, command_lines, curl_request, fenced

EXAMPLES = ["iris", "iris-onnx", "iris-tensorflow", "streaming-tokens", "async-sentiment"]
#: The examples whose README is a list of curl lines, each followed by its answer.
SYNC_EXAMPLES = ["iris", "iris-onnx", "iris-tensorflow", "streaming-tokens"]


def readme(example: str) -> str:
    return (REPO / "examples" / example / "README.md").read_text(encoding="utf-8")


def serve_command(text: str) -> list[str]:
    """The words of the README's `python -m modelserve examples/...` (after an install, if one precedes it)."""
    (line,) = [
        line for block in blocks(text, "bash") for line in command_lines(block) if "python -m modelserve" in line
    ]
    return shlex.split(line.rpartition("&& ")[2])


def exchanges(text: str) -> list[tuple[str, str]]:
    """(curl command, the answer shown after it) of each bash block holding one curl line."""
    pairs, pending = [], fenced(text)
    for (language, body), (_, answer) in zip(pending, pending[1:], strict=False):
        if language == "bash" and any(line.startswith("curl ") for line in command_lines(body)):
            (command,) = command_lines(body)
            pairs.append((command, answer))
    return pairs


def console_steps(block: str) -> list[tuple[str, str]]:
    """(command, output) of each `$ ` line of a console block, continuation lines joined."""
    steps: list[list[str]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append([line[2:], ""])
        elif steps and steps[-1][0].endswith("\\") and not steps[-1][1]:
            steps[-1][0] = steps[-1][0][:-1].rstrip() + " " + line.strip()
        else:
            steps[-1][1] += line + "\n"
    return [(command, output.strip()) for command, output in steps]


def without_elisions(shown: str) -> Any:
    """A shown JSON object with its `...` elisions left out, parsed."""
    return json.loads(re.sub(r",\s*\.\.\.|\.\.\.\s*,", "", shown))


def check(answer: httpx.Response, shown: str) -> None:
    """`answer` is what the README shows: exactly, but for a request id shown as "..." and elided keys."""
    shown = shown.rstrip("\n")
    if '"request_id":"..."' in shown:
        assert answer.status_code == 400, answer.text
        request_id = answer.headers["x-request-id"]
        assert answer.text == shown.replace('"request_id":"..."', f'"request_id":"{request_id}"')
    elif "..." in shown:
        assert answer.status_code == 200, answer.text
        partial, got = without_elisions(shown), answer.json()
        assert {key: got.get(key) for key in partial} == partial
    else:
        assert answer.status_code == 200, answer.text
        assert answer.text.rstrip("\n") == shown


# ------------------------------------------------------------------------------------------------
# what a newcomer needs before the first command


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_readme_installs_what_the_example_needs_and_serves_it_from_the_clone(example: str) -> None:
    text = readme(example)
    words = serve_command(text)
    assert words[:4] == ["python", "-m", "modelserve", f"examples/{example}"], words
    assert "root of" in text  # the folder the path is relative to
    installs = re.findall(r'pip install -e (?:"\.\[([\w,]+)\]"|\.(?=[\s`]))', text)
    assert installs, "no `pip install -e` line"
    needed = set(container.recipe(load_project_config(REPO / "examples" / example)).extras)
    assert any(needed <= set(filter(None, extras.split(","))) for extras in installs), (needed, installs)


@pytest.mark.slow
@pytest.mark.parametrize(("example", "same"), [("iris-onnx", ["model.onnx"]), ("iris-tensorflow", ["model"])])
def test_the_build_command_writes_the_committed_model(tmp_path: Path, example: str, same: list[str]) -> None:
    (command,) = re.findall(rf"`(python examples/{example}/build_model\.py)`", readme(example))
    (committed,) = same
    target = tmp_path / committed
    words = shlex.split(command)
    result = subprocess.run(
        [sys.executable, *words[1:], str(target)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    original = REPO / "examples" / example / committed
    files = [original] if original.is_file() else sorted(path for path in original.rglob("*") if path.is_file())
    for path in files:
        if path.name == "fingerprint.pb":  # a SavedModel's fingerprint holds a random number
            continue
        written = target / path.relative_to(original) if original.is_dir() else target
        assert written.read_bytes() == path.read_bytes(), path


# ------------------------------------------------------------------------------------------------
# every curl line, against the example served as its README says (one server per example and module)


@pytest.fixture(scope="module")
def served(start_server_module: Callable[..., Server]) -> Callable[[str], Server]:
    running: dict[str, Server] = {}

    def get(example: str) -> Server:
        if example not in running:
            words = serve_command(readme(example))
            server = start_server_module(REPO / words[3], *words[4:], "--no-access-log")
            server.wait_ready(timeout=180)  # TensorFlow's import is slow on a busy machine
            running[example] = server
        return running[example]

    return get


def all_exchanges() -> list[tuple[str, str, str]]:
    return [(example, command, shown) for example in SYNC_EXAMPLES for command, shown in exchanges(readme(example))]


@pytest.mark.parametrize("example", SYNC_EXAMPLES)
def test_every_curl_line_is_followed_by_its_answer(example: str) -> None:
    text = readme(example)
    curls = [line for block in blocks(text, "bash") for line in command_lines(block) if line.startswith("curl ")]
    assert curls and [command for command, _ in exchanges(text)] == curls


@pytest.mark.parametrize(("example", "command", "shown"), all_exchanges(), ids=lambda value: str(value)[:40])
def test_the_curl_line_answers_as_shown(
    served: Callable[[str], Server], example: str, command: str, shown: str
) -> None:
    server = served(example)
    with httpx.Client(timeout=30) as client:
        answer = client.send(curl_request(command, server.url))
    check(answer, shown)


def test_iris_refuses_what_its_strict_model_would_not_convert(served: Callable[[str], Server]) -> None:
    text = readme("iris")
    values = re.findall(r"`(\"5\.2\"|true)`", text)
    assert values == ['"5.2"', "true"]
    command, _ = exchanges(text)[0]
    for value in values:
        request = curl_request(command.replace('"sepal_length": 5.2', f'"sepal_length": {value}'), served("iris").url)
        with httpx.Client(timeout=30) as client:
            answer = client.send(request)
        assert answer.status_code == 400, answer.text
        assert [item["loc"] for item in answer.json()["detail"]] == [["sepal_length"]]


def test_iris_pages_named_by_the_readme_answer(served: Callable[[str], Server]) -> None:
    text, server = readme("iris"), served("iris")
    paths = re.findall(r"http://127\.0\.0\.1:8888(/[\w./]+)", text)
    assert {"/docs", "/openapi/iris.json", "/iris"} <= set(paths)
    docs = httpx.get(server.url + "/docs")
    assert docs.status_code == 200 and docs.headers["content-type"].startswith("text/html")
    document = httpx.get(server.url + "/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    schemas = set(document["components"]["schemas"])
    assert {"IrisFeatures", "IrisAnswer"} <= schemas, schemas
    assert httpx.get(server.url + "/openapi/iris.json").json()["openapi"].startswith("3.1")
    description = httpx.get(server.url + "/iris").json()  # its stages, config keys and limits
    assert set(description["stages"]) == {"preprocess", "predict", "postprocess"}
    assert description["config_keys"] == ["decimals", "weights"]
    assert {"max_concurrency", "max_queue_length", "timeout"} <= set(description)
    assert httpx.get(server.url + "/readyz").status_code == 200


def test_a_long_generation_stops_when_its_client_goes(served: Callable[[str], Server]) -> None:
    text, server = readme("streaming-tokens"), served("streaming-tokens")
    asked = re.search(r'`"max_tokens": (\d+)`', text)
    logged = re.search(r"`(generation ended after N of \d+ tokens)`", text)
    assert asked and logged
    with httpx.Client(timeout=30) as client:
        body = {"prompt": "hello", "max_tokens": int(asked.group(1))}
        with client.stream("POST", server.url + "/generate", json=body) as answer:
            request_id = answer.headers["x-request-id"]
            lines = answer.iter_lines()
            received = [next(lines), next(lines)]
    assert [json.loads(line)["index"] for line in received] == [0, 1]
    pattern = re.escape(logged.group(1)).replace("N", r"(\d+)") + rf".*request_id={request_id}"
    deadline = time.monotonic() + 30
    while not (found := re.search(pattern, server.log)):
        assert time.monotonic() < deadline, server.log
        time.sleep(0.05)
    assert 2 <= int(found.group(1)) < int(asked.group(1))


# ------------------------------------------------------------------------------------------------
# async-sentiment: its console blocks up to the crash walk-through, in order


def test_the_async_readme_runs_as_shown(tmp_path: Path, start_server: Callable[..., Server]) -> None:
    text = readme("async-sentiment").split("## Crashes", 1)[0]
    steps = [step for block in blocks(text, "console") for step in console_steps(block)]
    assert len(steps) >= 10, steps
    project = tmp_path / "async-sentiment"  # its SQLite store lives in the copy's .modelserve/
    shutil.copytree(REPO / "examples" / "async-sentiment", project, ignore=shutil.ignore_patterns(".modelserve"))
    words = serve_command(text)
    server = start_server(project, *words[4:], "--no-access-log")
    server.wait_ready()
    ids: dict[str, str] = {}  # an id the server generated: the README's one -> this run's
    with httpx.Client(timeout=30) as client:
        for command, output in steps:
            for shown_id, real_id in ids.items():
                command, output = command.replace(shown_id, real_id), output.replace(shown_id, real_id)
            request = curl_request(command.replace(" --data ", " -d "), server.url)
            shown = json.loads(output)
            answer = client.send(request)
            deadline = time.monotonic() + 30
            while request.method == "GET" and answer.json().get("status") != shown.get("status"):
                assert answer.json().get("status") in ("in_queue", "in_progress"), (command, answer.text)
                assert time.monotonic() < deadline, (command, answer.text)
                time.sleep(0.05)
                answer = client.send(request)
            got = answer.json()
            assert ("timestamp" in got) == ("timestamp" in shown), (command, answer.text)
            if "timestamp" in got:
                assert got.pop("timestamp").endswith("Z")
                shown.pop("timestamp")
            if "error" in shown and "status" not in shown:  # an error answer, not a failed job's document
                assert 400 <= answer.status_code < 500, (command, answer.text)
                if re.fullmatch(r"[0-9a-f]{32}", shown["request_id"]):  # generated: this run's differs
                    shown["request_id"] = answer.headers["x-request-id"]
            else:
                assert answer.status_code == 200, (command, answer.text)
            if "id" in shown and re.fullmatch(r"[0-9a-f]{32}", shown["id"]) and request.method == "POST":
                ids[shown["id"]] = got["id"]
                shown["id"] = got["id"]
            assert got == shown, command
