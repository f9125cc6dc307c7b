"""ONNX model APIs: request conversion and its 400s, hooks, description, lazy import, the event loop kept free."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.testclient import TestClient

import modelserve
from modelserve._threads import Adaptive
from tests.conftest import REPO, write_project
from tests.models import (
    fixed_shape_onnx,
    iris_expected,
    iris_onnx,
    shared_batch_onnx,
    slow_onnx,
    two_inputs_onnx,
)

SAMPLE = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
ROW = [5.1, 3.5, 1.4, 0.2]

HOOKS = """
labels = ["setosa", "versicolor", "virginica"]

def pre_inference(sample, signature, metadata):
    return {signature[0].name: [[sample["sepal_length"], sample["sepal_width"],
                                 sample["petal_length"], sample["petal_width"]]]}

def post_inference(prediction, signature, metadata):
    names = [arg.name for arg in signature]
    return {"label": labels[prediction[names.index("label")][0]], "outputs": names, "tag": metadata["tag"]}
"""

PRE_ONLY = """
def pre_inference(sample, signature, metadata):
    return [sample]          # a list for the single input
"""

BROKEN_PRE = """
def pre_inference(sample, signature, metadata):
    return [[sample["sepal_length"]] * 4]
"""

BROKEN_POST = """
def post_inference(prediction, signature, metadata):
    raise ValueError("post went wrong")
"""

ASYNC_HOOKS = """
async def pre_inference(sample, signature, metadata):
    return {"input": [sample]}

async def post_inference(prediction, signature, metadata):
    return int(prediction[1][0])
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("onnx_project")
    iris_onnx(root / "iris.onnx")
    two_inputs_onnx(root / "two.onnx")
    fixed_shape_onnx(root / "fixed.onnx")
    shared_batch_onnx(root / "shared.onnx")
    return write_project(
        root,
        {
            "hooks.py": HOOKS,
            "pre_only.py": PRE_ONLY,
            "broken_pre.py": BROKEN_PRE,
            "broken_post.py": BROKEN_POST,
            "async_hooks.py": ASYNC_HOOKS,
            "modelserve.yaml": """
                apis:
                  - name: iris
                    model: {path: iris.onnx, intra_op_threads: 1}
                  - name: threaded
                    model: {path: iris.onnx, inline_threshold_ms: 0}
                  - name: inline
                    model: {path: iris.onnx, inline_threshold_ms: 1000}
                  - name: two
                    model: {path: two.onnx, format: onnx}
                  - name: fixed
                    model: {path: fixed.onnx}
                  - name: shared
                    model: {path: shared.onnx}
                  - name: hooked
                    model: {path: iris.onnx}
                    handler: {path: hooks.py, config: {tag: v1}}
                  - name: pre-only
                    model: {path: iris.onnx}
                    handler: {path: pre_only.py}
                  - name: async-hooks
                    model: {path: iris.onnx}
                    handler: {path: async_hooks.py}
                  - name: broken-pre
                    model: {path: iris.onnx}
                    handler: {path: broken_pre.py}
                  - name: broken-post
                    model: {path: iris.onnx}
                    handler: {path: broken_post.py}
            """,
        },
    )


@pytest.fixture(scope="module")
def client(project: Path) -> Iterator[TestClient]:
    app = modelserve.create_app(project)
    with TestClient(app) as client:
        client.portal.call(app.server.wait_loaded)
        yield client


def test_iris_without_hooks_takes_a_bare_array_or_an_object(client: TestClient) -> None:
    probabilities, label = iris_expected([ROW, [6.7, 3.0, 5.2, 2.3]])
    for body in ([ROW, [6.7, 3.0, 5.2, 2.3]], {"input": [ROW, [6.7, 3.0, 5.2, 2.3]]}):
        answer = client.post("/iris", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["label"] == label.tolist()
        np.testing.assert_allclose(answer.json()["probabilities"], probabilities, rtol=1e-5)


def test_multiple_inputs_with_dtype_conversion(client: TestClient) -> None:
    # ints for a float32 input, integral floats for an int32 input, 1 for a bool
    answer = client.post("/two", json={"a": [[1, 2], [3, 4]], "b": [[0.0, 10.0], [-1, 1]], "flag": 1})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"sum": [[1.0, 12.0], [2.0, 5.0]], "flag_out": True}


@pytest.mark.parametrize(
    ("api", "body", "fragments"),
    [
        # a value that cannot be converted
        ("iris", [[1, 2, 3, "x"]], ["input 'input'", "float32", "[batch, 4]", "'x'"]),
        ("iris", [[1, 2, None, 4]], ["input 'input'", "float32", "null"]),
        ("iris", [[1e39, 2, 3, 4]], ["input 'input'", "float32", "1e+39"]),
        ("iris", [[1, 2, 3], [4, 5]], ["input 'input'", "float32", "[batch, 4]", "cannot be converted"]),
        ("two", {"a": [[1, 2]], "b": [[1.5, 2]], "flag": True}, ["input 'b'", "int32", "[null, 2]", "1.5"]),
        ("two", {"a": [[1, 2]], "b": [[2**40, 2]], "flag": True}, ["input 'b'", "int32", str(2**40)]),
        ("two", {"a": [[1, 2]], "b": [[1, 2]], "flag": 2}, ["input 'flag'", "bool", "received 2"]),
        # a wrong rank
        ("iris", [1, 2, 3], ["input 'input'", "[batch, 4] (rank 2)", "[3] (rank 1), and its 3 values do not fill"]),
        ("iris", [[ROW]], ["input 'input'", "float32", "[batch, 4]", "rank 2", "received shape [1, 1, 4] (rank 3)"]),
        ("two", {"a": [[1, 2]], "b": [[1, 2]], "flag": [True]}, ["input 'flag'", "bool", "[]", "rank 0"]),
        # a wrong fixed dimension
        ("iris", [[1, 2, 3]], ["input 'input'", "[batch, 4]", "received shape [1, 3]", "dimension 1 is 3, not 4"]),
        ("fixed", [[1, 2, 3]], ["input 'x'", "[2, 3]", "received shape [1, 3]", "dimension 0 is 1, not 2"]),
        # inputs that share a named dimension must agree on its size
        (
            "shared",
            {"a": [[1, 2], [3, 4]], "b": [[1, 2]]},
            ["inputs 'a', 'b' share the dimension 'batch'", "'a' has 2, 'b' has 1", "'b' (float32 [batch, 2])"],
        ),
        # a missing or an unknown input
        (
            "two",
            {"a": [[1, 2]], "b": [[1, 2]]},
            ["missing input 'flag'", "'flag' (bool [])", "'a' (float32 [null, 2])"],
        ),
        (
            "iris",
            {"inputs": [ROW]},
            ["unknown input 'inputs'", "missing input 'input'", "'input' (float32 [batch, 4])"],
        ),
        ("two", [[1, 2]], ["object keyed by the model's input names", "'a' (float32 [null, 2])", "received list"]),
    ],
)
def test_bad_input_is_a_400_naming_the_input_and_what_was_expected(
    client: TestClient, api: str, body: Any, fragments: list[str]
) -> None:
    answer = client.post(f"/{api}", json=body)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]
    for fragment in fragments:
        assert fragment in message
    assert answer.json()["request_id"] == answer.headers["x-request-id"]


def test_inputs_sharing_a_named_dimension_of_one_size_are_served(client: TestClient) -> None:
    answer = client.post("/shared", json={"a": [[1, 2], [3, 4]], "b": [[1, 1], [2, 2]]})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"sum": [[2.0, 3.0], [5.0, 6.0]]}


def test_a_body_that_is_not_json_is_a_400_without_pre_inference(client: TestClient) -> None:
    answer = client.post("/iris", content=b"\x00\x01", headers={"content-type": "application/octet-stream"})
    assert answer.status_code == 400
    assert "expected a JSON body" in answer.json()["error"]
    assert "'input' (float32 [batch, 4])" in answer.json()["error"]


def test_hooks_receive_the_sample_the_node_args_and_the_metadata(client: TestClient) -> None:
    answer = client.post("/hooked", json=SAMPLE)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"label": "setosa", "outputs": ["probabilities", "label"], "tag": "v1"}


def test_pre_inference_alone_answers_an_object_keyed_by_output_names(client: TestClient) -> None:
    answer = client.post("/pre-only", json=ROW)
    assert answer.status_code == 200, answer.text
    assert answer.json()["label"] == [0]
    assert set(answer.json()) == {"probabilities", "label"}


def test_async_hooks_run_on_the_loop(client: TestClient) -> None:
    answer = client.post("/async-hooks", json=[6.7, 3.0, 5.2, 2.3])
    assert answer.status_code == 200, answer.text
    assert answer.json() == int(iris_expected([[6.7, 3.0, 5.2, 2.3]])[1][0])


def test_a_value_from_pre_inference_that_does_not_fit_is_a_400(client: TestClient) -> None:
    answer = client.post("/pre-only", json=[1, 2, 3])
    assert answer.status_code == 400
    assert "dimension 1 is 3, not 4" in answer.json()["error"]


@pytest.mark.parametrize(
    ("api", "body", "logged"),
    [
        ("broken-pre", {"petal_length": 1}, "api 'broken-pre': pre_inference raised KeyError: 'sepal_length'"),
        ("broken-post", [ROW], "api 'broken-post': post_inference raised ValueError: post went wrong"),
    ],
)
def test_a_hook_that_raises_is_a_500_and_the_log_names_the_hook(
    client: TestClient, caplog: pytest.LogCaptureFixture, api: str, body: Any, logged: str
) -> None:
    with caplog.at_level(logging.ERROR, logger="modelserve"):
        answer = client.post(f"/{api}", json=body)
    assert answer.status_code == 500
    assert set(answer.json()) == {"error", "request_id"}
    assert "KeyError" not in answer.text and "post went wrong" not in answer.text
    assert logged in caplog.text
    assert "Traceback" in caplog.text


def test_get_describes_inputs_and_outputs_with_symbolic_dims(client: TestClient) -> None:
    model = client.get("/iris").json()["model"]
    assert model["format"] == "onnx"
    assert model["inputs"] == [{"name": "input", "dtype": "float32", "shape": ["batch", 4]}]
    assert model["outputs"] == [
        {"name": "probabilities", "dtype": "float32", "shape": ["batch", 3]},
        {"name": "label", "dtype": "int64", "shape": ["batch"]},
    ]
    assert model["providers"] == ["CPUExecutionProvider"]
    two = client.get("/two").json()["model"]
    assert two["inputs"] == [
        {"name": "a", "dtype": "float32", "shape": [None, 2]},
        {"name": "b", "dtype": "int32", "shape": [None, 2]},
        {"name": "flag", "dtype": "bool", "shape": []},
    ]
    hooked = client.get("/hooked").json()
    assert hooked["hooks"] == {"pre_inference": "hooks.py", "post_inference": "hooks.py"}


def test_a_fast_model_runs_inline_and_threshold_zero_uses_a_thread(client: TestClient) -> None:
    for api in ("inline", "threaded"):
        for _ in range(3):
            assert client.post(f"/{api}", json=[ROW]).status_code == 200
    inline = client.get("/inline").json()["execution"]["stages"]["run"]
    threaded = client.get("/threaded").json()["execution"]["stages"]["run"]
    # Measured under its threshold (a second: no call of iris takes that long, however busy the machine), so run
    # on the loop after the first call (a thread: not measured yet, or measured at load by the warm-up).
    assert inline["inline"] is True and inline["inline_calls"] >= 2
    assert threaded["inline"] is False and threaded["inline_calls"] == 0 and threaded["thread_calls"] >= 3


def test_adaptive_goes_to_a_thread_until_measured_fast_and_scales_with_input_size() -> None:
    adaptive = Adaptive("run", threshold_s=0.001)
    assert not adaptive.inline()  # never measured
    adaptive.seed(0.0002, size=4)
    assert adaptive.inline(size=4)
    assert not adaptive.inline(size=400)  # 100x the usual input: predicted 20 ms
    adaptive.record(0.5, size=4)  # one call slowed by a busy machine: still inline
    assert adaptive.inline(size=4)
    for _ in range(8):  # a model that became slow: a thread within a few calls
        adaptive.record(0.005, size=4)
    assert not adaptive.inline(size=4)

    seen: list[str] = []

    async def call_twice() -> None:
        main = threading.current_thread().name
        for _ in range(2):
            await adaptive.call(lambda: seen.append(threading.current_thread().name == main and "loop" or "thread"))

    adaptive = Adaptive("run", threshold_s=0.001)
    asyncio.run(call_twice())
    assert seen == ["thread", "loop"]


# ------------------------------------------------------------------------------------------------
# load errors, extras and lazy imports (in subprocesses: sys.modules must start clean)


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60, env=_env())


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_serving_onnx_never_imports_tensorflow(project: Path) -> None:
    code = f"""
import sys, modelserve
from starlette.testclient import TestClient
app = modelserve.create_app({str(project)!r})
with TestClient(app) as client:
    client.portal.call(app.server.wait_loaded)
    assert client.post("/iris", json=[{ROW!r}]).status_code == 200
    assert "onnxruntime" in sys.modules
print(sorted(name for name in sys.modules if name.split(".")[0] in ("tensorflow", "keras")))
"""
    result = _python(code, project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_missing_runtime_names_the_pip_command(project: Path) -> None:
    code = f"""
import sys
sys.modules["onnxruntime"] = None     # as if it were not installed
import modelserve
try:
    modelserve.create_app({str(project)!r})
except modelserve.LoadError as exc:
    print(type(exc).__name__, exc)
"""
    result = _python(code, project)
    assert result.returncode == 0, result.stderr
    assert (
        "MissingExtraError onnxruntime is not installed, and this project needs it. "
        f"Install it with: {modelserve.errors.install_hint('onnx')}" in result.stdout
    )


def test_the_cli_exits_3_with_the_pip_command(project: Path) -> None:
    code = f"""
import sys
sys.modules["tensorflow"] = None
from modelserve.cli import main
sys.exit(main([{str(project / "tf")!r}]))
"""
    write_project(
        project / "tf",
        {"modelserve.yaml": "apis:\n  - name: tf\n    model: {path: saved, format: tensorflow}\n"},
    )
    (project / "tf" / "saved").mkdir(exist_ok=True)
    result = _python(code, project)
    assert result.returncode == 3, result.stderr
    assert 'pip install "modelserve[tensorflow]"' in result.stderr


def test_a_handler_file_whose_hooks_take_the_wrong_arguments_is_refused(tmp_path: Path) -> None:
    iris_onnx(tmp_path / "iris.onnx")
    write_project(
        tmp_path,
        {
            "hooks.py": "def pre_inference(sample):\n    return sample\n",
            "modelserve.yaml": "apis:\n  - name: iris\n    model: {path: iris.onnx}\n    handler: {path: hooks.py}\n",
        },
    )
    with pytest.raises(modelserve.LoadError, match=r"pre_inference.*must accept \(sample, signature, metadata\)"):
        modelserve.create_app(tmp_path)


# ------------------------------------------------------------------------------------------------
# a real server: slow calls leave the event loop free; hooks of one API never run concurrently

SLEEPY_HOOKS = """
import time

def pre_inference(sample, signature, metadata):
    time.sleep(1)
    return [[0.0] * 4]
"""

COUNTING_HOOKS = """
import time

running = 0
most = 0

def pre_inference(sample, signature, metadata):
    global running, most
    running += 1                  # no lock: max_concurrency 1 promises one call at a time
    most = max(most, running)
    time.sleep(0.02)
    running -= 1
    return {"input": [[5.1, 3.5, 1.4, 0.2]]}

def post_inference(prediction, signature, metadata):
    return {"most": most}
"""


@pytest.mark.slow
def test_slow_calls_do_not_delay_healthz_and_hooks_never_overlap(tmp_path: Path, start_server: Any) -> None:
    slow_onnx(tmp_path / "slow.onnx", seconds=1)
    iris_onnx(tmp_path / "iris.onnx")
    project = write_project(
        tmp_path,
        {
            "sleepy.py": SLEEPY_HOOKS,
            "counting.py": COUNTING_HOOKS,
            "modelserve.yaml": """
                apis:
                  - name: slow-model
                    model: {path: slow.onnx, intra_op_threads: 1}
                  - name: slow-hook
                    model: {path: iris.onnx}
                    handler: {path: sleepy.py}
                  - name: counting
                    model: {path: iris.onnx}
                    handler: {path: counting.py}
            """,
        },
    )
    server = start_server(project, "--no-access-log")
    server.wait_ready()

    async def scenario() -> tuple[list[int], list[Any]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            await http.get("/healthz")  # the connection is open before the probes start
            busy = [http.post("/slow-model", json=[[0.0] * 128]) for _ in range(3)]
            busy += [http.post("/slow-hook", json={}) for _ in range(3)]
            busy += [http.post("/counting", json={}) for _ in range(8)]
            tasks = [asyncio.ensure_future(request) for request in busy]
            probes = 0
            # How many probes had been answered when each slow call's answer arrived.
            seen: list[int] = [-1] * 6

            def note(index: int) -> Callable[[object], None]:
                return lambda _: seen.__setitem__(index, probes)

            for index, task in enumerate(tasks[:6]):
                task.add_done_callback(note(index))
            while not all(task.done() for task in tasks[:6]):
                assert (await http.get("/healthz")).status_code == 200
                probes += 1
            return seen, await asyncio.gather(*tasks)

    seen, answers = asyncio.run(scenario())
    assert all(answer.status_code == 200 for answer in answers), [a.text for a in answers]
    # A call run on the event loop would hold every probe until it ended, so at most one probe could be answered
    # before the first slow answer; with the calls in threads, probes are answered all along.
    assert min(seen) >= 3, seen
    assert [answer.json() for answer in answers[6:]] == [{"most": 1}] * 8, server.log


# ------------------------------------------------------------------------------------------------
# the example project: its README's answers, its model rebuilt by its script

EXAMPLE = REPO / "examples" / "iris-onnx"
_CURL = re.compile(r"curl -s -X POST http://127\.0\.0\.1:8888(/\S+) .*?-d '([^']*)'\n```\n```\n(.*?)\n```", re.S)


def readme_requests(readme: Path) -> list[tuple[str, str, str]]:
    """(path, JSON body, answer) of each ``curl -X POST`` in a README followed by its answer."""
    return _CURL.findall(readme.read_text(encoding="utf-8"))


@pytest.mark.slow
def test_the_example_answers_what_its_readme_says(start_server: Any) -> None:
    requests = readme_requests(EXAMPLE / "README.md")
    assert len(requests) == 3
    server = start_server(EXAMPLE, "--no-access-log")
    server.wait_ready()
    for path, body, expected in requests:
        answer = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
        if answer.status_code == 400:  # the README shows the request id as "..."
            shown = json.loads(expected)
            assert shown.pop("request_id") == "..."
            got = answer.json()
            assert got.pop("request_id") == answer.headers["x-request-id"]
            assert got == shown
        else:
            assert answer.status_code == 200, answer.text
            assert answer.text == expected


def test_the_example_model_is_what_its_build_script_writes(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE / "build_model.py"), str(tmp_path / "model.onnx")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "model.onnx").read_bytes() == (EXAMPLE / "model.onnx").read_bytes()


def test_unavailable_providers_are_skipped_and_none_available_fails_the_load(tmp_path: Path) -> None:
    iris_onnx(tmp_path / "iris.onnx")
    write_project(
        tmp_path,
        {
            "modelserve.yaml": """
                apis:
                  - name: fallback
                    model: {path: iris.onnx, providers: [NoSuchExecutionProvider, CPUExecutionProvider]}
                  - name: none
                    model: {path: iris.onnx, providers: [NoSuchExecutionProvider]}
            """
        },
    )
    errors: list[modelserve.LoadError] = []
    app = modelserve.create_app(tmp_path, on_load_error=errors.append)
    with TestClient(app) as client:
        client.portal.call(app.server.wait_loaded)
        assert client.get("/fallback").json()["model"]["providers"] == ["CPUExecutionProvider"]
        assert client.get("/readyz").json()["apis"] == {"fallback": "ready", "none": "failed"}
    assert len(errors) == 1
    assert "none of the execution providers ['NoSuchExecutionProvider'] is available" in str(errors[0])
    assert "CPUExecutionProvider" in str(errors[0])
