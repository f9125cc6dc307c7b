"""Triton's own gRPC example clients, unchanged (tests/data/triton_examples/SOURCES.md), against modelserve.

The models they expect are built here: ``simple`` (the ONNX graph of tests/http/test_triton_examples.py),
``simple_string`` (BYTES numbers in, their sum and difference as BYTES out) and ``simple_identity`` (BYTES
back as they came). `simple_grpc_health_metadata.py` checks that the server calls itself "triton": it is run
unchanged too, and must pass every check before that one and fail at it (modelserve names itself).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.conftest import REPO, write_project
from tests.grpc.test_grpc import grpc_served
from tests.http.test_triton_examples import simple_onnx

pytest.importorskip("tritonclient.grpc")

EXAMPLES = REPO / "tests" / "data" / "triton_examples"

PROJECT = """
apis:
  - name: simple
    model: {path: simple.onnx}
  - name: simple_string
    handler: {path: model.py, class: SimpleString}
  - name: simple_identity
    handler: {path: model.py, class: Identity}
"""

MODEL = """
import numpy as np


def _strings(values, shape):
    array = np.empty(len(values), dtype=object)
    array[:] = values
    return array.reshape(shape)


class SimpleString:
    v2_inputs = [{"name": name, "datatype": "BYTES", "shape": [-1, 16]} for name in ("INPUT0", "INPUT1")]
    v2_outputs = [{"name": name, "datatype": "BYTES", "shape": [-1, 16]} for name in ("OUTPUT0", "OUTPUT1")]

    def predict(self, inputs):
        a = np.array([int(x) for x in inputs["INPUT0"].flat])
        b = np.array([int(x) for x in inputs["INPUT1"].flat])
        shape = inputs["INPUT0"].shape
        return {
            "OUTPUT0": _strings([str(v).encode() for v in a + b], shape),
            "OUTPUT1": _strings([str(v).encode() for v in a - b], shape),
        }


class Identity:
    v2_inputs = [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1, -1]}]

    def predict(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
"""


@pytest.fixture(scope="module")
def address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = write_project(tmp_path_factory.mktemp("triton_grpc"), {"modelserve.yaml": PROJECT, "model.py": MODEL})
    simple_onnx(root / "simple.onnx")
    with grpc_served(root) as served:
        yield served


def run_example(name: str, address: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), "-u", address],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(EXAMPLES),
    )


@pytest.mark.parametrize(
    ("script", "last_line"),
    [
        ("simple_grpc_infer_client.py", "PASS: infer"),
        ("simple_grpc_async_infer_client.py", "PASS: Async infer"),
        ("simple_grpc_aio_infer_client.py", "PASS: grpc aio infer"),
        ("simple_grpc_string_infer_client.py", "PASS: string"),
    ],
)
def test_the_example_passes_unchanged(address: str, script: str, last_line: str) -> None:
    done = run_example(script, address)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith(last_line)


def test_the_health_example_passes_up_to_the_server_name(address: str) -> None:
    """Live, ready and the model's readiness pass; then the script wants the name "triton" and stops."""
    done = run_example("simple_grpc_health_metadata.py", address)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.strip() == "FAILED : get_server_metadata", done.stdout + done.stderr
