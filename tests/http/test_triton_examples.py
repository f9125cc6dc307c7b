"""Triton's own example clients, unchanged, against modelserve; and the statistics extension through tritonclient.

`simple_http_infer_client.py` and `simple_http_aio_infer_client.py` are copied byte for byte from
triton-inference-server/client (tests/data/triton_examples/SOURCES.md). They expect Triton's ``simple`` model:
INT32 inputs ``INPUT0`` and ``INPUT1`` of shape [1, 16], outputs ``OUTPUT0`` (their sum) and ``OUTPUT1`` (their
difference), which the test builds as an ONNX graph. Each script sends JSON and binary tensors, asks for
binary and JSON outputs, reads the model's statistics and checks the error for a model it does not know.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import REPO, Server, write_project
from tests.models import save_model

httpclient = pytest.importorskip("tritonclient.http")
pytest.importorskip("gevent")  # the sync example imports gevent.ssl
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

EXAMPLES = REPO / "tests" / "data" / "triton_examples"

PROJECT = """
apis:
  - name: simple
    model: {path: simple.onnx}
  - name: staged
    handler: {path: model.py, class: Staged}
"""

MODEL = """
import numpy as np


class Staged:
    v2_inputs = [{"name": "x", "datatype": "FP32", "shape": [-1]}]

    def preprocess(self, inputs):
        return inputs["x"]

    def predict(self, x):
        return x * 2

    def postprocess(self, y):
        return {"y": np.asarray(y)}
"""


def simple_onnx(path: Path) -> Path:
    """Triton's ``simple`` model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, INT32 [batch, 16]."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        "simple",
        [helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 16]) for name in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(name, TensorProto.INT32, ["batch", 16]) for name in ("OUTPUT0", "OUTPUT1")],
    )
    return save_model(graph, path)


@pytest.fixture(scope="module")
def server(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Server:
    root = write_project(tmp_path_factory.mktemp("triton"), {"modelserve.yaml": PROJECT, "model.py": MODEL})
    simple_onnx(root / "simple.onnx")
    started: Server = start_server_module(root, "--no-access-log")
    started.wait_ready(timeout=90)
    return started


def run_example(name: str, server: Server) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name), "-u", server.url.removeprefix("http://")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(EXAMPLES),
    )


def test_the_sync_example_passes_unchanged(server: Server) -> None:
    done = run_example("simple_http_infer_client.py", server)
    assert done.returncode == 0, done.stdout + done.stderr
    # The script has no PASS line: it ends with the unknown model's check, which prints the error it got.
    assert "Request for unknown model: 'wrong_model_name' is not found" in done.stdout
    assert "0 - -1 = 1" in done.stdout and "15 + -1 = 14" in done.stdout


def test_the_aio_example_passes_unchanged(server: Server) -> None:
    done = run_example("simple_http_aio_infer_client.py", server)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("PASS: infer")


# ------------------------------------------------------------------------------------------------
# the statistics extension


def test_server_metadata_lists_statistics(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    assert "statistics" in client.get_server_metadata()["extensions"]


@pytest.mark.parametrize("version", ["", "1"])
def test_statistics_count_successes_failures_and_stages(server: Server, version: str) -> None:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    before = client.get_inference_statistics("staged", version)["model_stats"][0]
    x = httpclient.InferInput("x", [3], "FP32").set_data_from_numpy(np.array([1, 2, 3], np.float32))
    for _ in range(3):
        assert client.infer("staged", [x]).as_numpy("y").tolist() == [2, 4, 6]
    wrong = httpclient.InferInput("x", [3], "INT32").set_data_from_numpy(np.array([1, 2, 3], np.int32))
    with pytest.raises(InferenceServerException):
        client.infer("staged", [wrong])

    stats = client.get_inference_statistics("staged", version)
    assert [entry["name"] for entry in stats["model_stats"]] == ["staged"]
    entry = stats["model_stats"][0]
    assert entry["version"] == "1"
    assert entry["last_inference"] >= before["last_inference"] and entry["last_inference"] > 0  # ms since 1970
    assert entry["inference_count"] - before["inference_count"] == 3
    assert entry["execution_count"] - before["execution_count"] == 3
    now, then = entry["inference_stats"], before["inference_stats"]
    assert now["success"]["count"] - then["success"]["count"] == 3
    assert now["fail"]["count"] - then["fail"]["count"] == 1
    for stage in ("compute_input", "compute_infer", "compute_output"):
        assert now[stage]["count"] - then[stage]["count"] == 3
        assert now[stage]["ns"] > then[stage]["ns"]
    assert now["success"]["ns"] > then["success"]["ns"] and now["fail"]["ns"] > then["fail"]["ns"]
    assert now["queue"] == {"count": 0, "ns": 0}  # an API without batching measures no queue


def test_statistics_of_every_model(server: Server) -> None:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    stats = client.get_inference_statistics()
    assert sorted(entry["name"] for entry in stats["model_stats"]) == ["simple", "staged"]
    for entry in stats["model_stats"]:
        assert set(entry["inference_stats"]) >= {
            "success",
            "fail",
            "queue",
            "compute_input",
            "compute_infer",
            "compute_output",
        }
        assert all(set(value) == {"count", "ns"} for value in entry["inference_stats"].values())
    assert httpx.get(f"{server.url}/v2/models/stats").json() == stats
