"""Triton's model control examples, unchanged (tests/data/triton_examples/SOURCES.md), against modelserve with
model control explicit: `simple_grpc_model_control.py` and `simple_http_model_control.py`.

They expect a repository of eight (gRPC) or seven (HTTP) models, among them ``simple`` with a max_batch_size
of 8 (here the ONNX graph of tests/http/test_triton_examples.py, batched 8 at a time); they load it, load it
with a configuration that is not JSON (refused, "failed to load"), load it with ``{"max_batch_size":"16"}``
(applied: the model configuration then says 16), unload it, and load a model that does not exist. The HTTP
script passes. The gRPC one then loads with a ``file:`` parameter and wants Triton's INTERNAL status for it
(a Triton TODO in the script says INVALID_ARGUMENT is the right one): modelserve answers INVALID_ARGUMENT, so the
script must pass every check before that one and stop at it.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO, write_project
from tests.grpc.test_grpc import served
from tests.http.test_triton_examples import simple_onnx

pytest.importorskip("tritonclient.grpc")
pytest.importorskip("tritonclient.http")

EXAMPLES = REPO / "tests" / "data" / "triton_examples"

MODEL = """
class Identity:
    v2_inputs = [{"name": "INPUT0", "datatype": "INT32", "shape": [-1]}]

    def predict(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
"""


def project(root: Path, models: int) -> Path:
    """``simple`` batched 8 at a time, and as many small models beside it as make `models` in all."""
    others = "".join(
        f"  - name: other_{i}\n    handler: {{path: model.py, class: Identity}}\n" for i in range(models - 1)
    )
    yaml = f"apis:\n  - name: simple\n    model: {{path: simple.onnx}}\n    batching: {{max_batch_size: 8}}\n{others}"
    write_project(root, {"modelserve.yaml": yaml, "model.py": MODEL})
    simple_onnx(root / "simple.onnx")
    return root


@pytest.fixture
def grpc_address(tmp_path: Path) -> Iterator[str]:
    with served(project(tmp_path, 8), load=[]) as (_, address):
        yield address


@pytest.fixture
def http_url(tmp_path: Path) -> Iterator[str]:
    with served(project(tmp_path, 7), load=[]) as (url, _):
        yield url


def run_example(name: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), "-u", url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(EXAMPLES),
    )


def test_the_http_example_passes_unchanged(http_url: str) -> None:
    done = run_example("simple_http_model_control.py", http_url.removeprefix("http://"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "PASS: model control", done.stdout + done.stderr
    # It left `simple` unloaded; a load without a configuration brings back the project's own.
    assert httpx.post(f"{http_url}/v2/repository/models/simple/load").status_code == 200
    assert httpx.get(f"{http_url}/v2/models/simple/config").json()["max_batch_size"] == 8


def test_the_grpc_example_passes_up_to_triton_s_internal_status(grpc_address: str) -> None:
    """Every check up to the ``file:`` parameter passes (the override to 16 included); modelserve refuses that
    load as INVALID_ARGUMENT, where the script wants Triton's INTERNAL, and the script stops there."""
    done = run_example("simple_grpc_model_control.py", grpc_address)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.strip() == (
        "FAILED: expected status 'StatusCode.INTERNAL' for oversized file parameter, "
        "got status='StatusCode.INVALID_ARGUMENT'"
    ), done.stdout + done.stderr


def test_a_load_applies_what_maps_of_a_triton_configuration(http_url: str) -> None:
    """max_batch_size and dynamic_batching's delay become the API's batching, until a load without one."""
    config = '{"max_batch_size": "4", "dynamic_batching": {"max_queue_delay_microseconds": 2500}}'
    answer = httpx.post(f"{http_url}/v2/repository/models/simple/load", json={"parameters": {"config": config}})
    assert answer.status_code == 200, answer.text
    assert httpx.get(f"{http_url}/v2/models/simple/config").json()["max_batch_size"] == 4
    batching = httpx.get(f"{http_url}/simple").json()["batching"]
    assert (batching["max_batch_size"], batching["max_wait_ms"]) == (4, 2.5)
    body = {
        "inputs": [{"name": n, "datatype": "INT32", "shape": [1, 16], "data": [2] * 16} for n in ("INPUT0", "INPUT1")]
    }
    assert httpx.post(f"{http_url}/v2/models/simple/infer", json=body).json()["outputs"][0]["data"] == [4] * 16
    assert httpx.post(f"{http_url}/v2/repository/models/simple/load").status_code == 200
    assert httpx.get(f"{http_url}/simple").json()["batching"]["max_batch_size"] == 8


def test_the_docs_load_with_a_configuration_answers_as_shown(http_url: str) -> None:
    """docs/v2.md's curl commands, run as written against this server, answer what the page shows."""
    from tests.test_readme import page, section

    text = section(page("v2.md"), "The model repository")
    block = text.split("```console\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    commands = [(line[2:], lines[i + 1]) for i, line in enumerate(lines) if line.startswith("$ ")]
    assert len(commands) == 2
    host = http_url.removeprefix("http://")
    for command, shown in commands:
        argv = [arg.replace("localhost:8000", host) for arg in shlex.split(command)]
        done = subprocess.run([*argv, "-sS"], capture_output=True, text=True, timeout=60, check=True)
        if "[...]" in shown:
            got = json.loads(done.stdout)
            expected = json.loads(shown.replace("[...]", "null"))
            assert {key: got[key] for key, value in expected.items() if value is not None} == {
                key: value for key, value in expected.items() if value is not None
            }
            assert all(got[key] for key, value in expected.items() if value is None)
        else:
            assert json.loads(done.stdout) == json.loads(shown)
