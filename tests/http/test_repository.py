"""Model versions (`modelserve.versions`, `modelserve.repository`): a model folder of numbered versions served
as its version_policy says, over V2 HTTP (tritonclient.http and plain requests) and gRPC (tritonclient.grpc)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import write_project
from tests.models import save_model

httpclient = pytest.importorskip("tritonclient.http")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

PROJECT = """
apis:
  - name: every
    model: {path: models/plus, version_policy: all}
  - name: latest
    model: {path: models/plus}
  - name: chosen
    model: {path: models/plus, version_policy: {specific: [1, 3]}}
"""


def plus_onnx(path: Path, n: float) -> Path:
    """Version n of the model: y = x + n, FP32 [-1]."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "n"], ["y"])],
        "plus",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])],
        initializer=[helper.make_tensor("n", TensorProto.FLOAT, [], [n])],
    )
    return save_model(graph, path)


def versioned_project(root: Path, numbers: tuple[int, ...] = (1, 2, 3)) -> Path:
    write_project(root, {"modelserve.yaml": PROJECT})
    for number in numbers:
        plus_onnx(root / "models" / "plus" / str(number) / "model.onnx", float(number))
    return root


@pytest.fixture(scope="module")
def server(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    started = start_server_module(versioned_project(tmp_path_factory.mktemp("versions")), "--no-access-log")
    started.wait_ready(timeout=90)
    yield started


def infer(server: Any, name: str, version: str = "") -> float:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    x = httpclient.InferInput("x", [1], "FP32").set_data_from_numpy(np.array([10], np.float32))
    result = client.infer(name, [x], model_version=version)
    assert result.get_response()["model_version"] == (version or result.get_response()["model_version"])
    return float(result.as_numpy("y")[0])


@pytest.mark.parametrize(("name", "served"), [("every", ["1", "2", "3"]), ("latest", ["3"]), ("chosen", ["1", "3"])])
def test_the_policy_names_the_versions_served(server: Any, name: str, served: list[str]) -> None:
    assert httpx.get(f"{server.url}/v2/models/{name}").json()["versions"] == served
    for version in served:
        assert infer(server, name, version) == 10 + int(version)
        assert httpx.get(f"{server.url}/v2/models/{name}/versions/{version}/ready").json()["ready"] is True
    assert infer(server, name) == 10 + int(served[-1])  # unversioned: the highest
    for version in {"1", "2", "3", "4"} - set(served):
        answer = httpx.post(f"{server.url}/v2/models/{name}/versions/{version}/infer", json={"inputs": []})
        assert answer.status_code == 404
        assert answer.json()["error"] == f"Request for unknown model: '{name}' version {version} is not found"


def test_the_answer_and_the_statistics_name_the_version(server: Any) -> None:
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    answer = httpx.post(f"{server.url}/v2/models/every/versions/2/infer", json=body).json()
    assert answer["model_version"] == "2" and answer["outputs"][0]["data"] == [3.0]
    stats = httpx.get(f"{server.url}/v2/models/every/versions/2/stats").json()["model_stats"]
    assert [(entry["name"], entry["version"]) for entry in stats] == [("every", "2")]
    everything = httpx.get(f"{server.url}/v2/models/stats").json()["model_stats"]
    assert [(e["name"], e["version"]) for e in everything if e["name"] == "chosen"] == [
        ("chosen", "1"),
        ("chosen", "3"),
    ]


def test_a_versioned_path_without_versions_is_refused(tmp_path: Path) -> None:
    from modelserve.config import load_project_config
    from modelserve.errors import ConfigError

    versioned_project(tmp_path)
    (tmp_path / "modelserve.yaml").write_text(
        "apis:\n  - name: a\n    model: {path: models/plus, version_policy: {specific: [7]}}\n"
        "  - name: b\n    model: {path: models/plus/1/model.onnx, version_policy: all}\n"
        "  - name: c\n    model: {path: models/plus, version_policy: {latest: 0}}\n"
    )
    with pytest.raises(ConfigError) as error:
        load_project_config(tmp_path)
    message = str(error.value)
    assert "api 'a'" in message and "selects none of the versions [1, 2, 3]" in message
    assert "api 'b'" in message and "is not a folder of numbered versions" in message
    assert "api 'c'" in message and "{latest: N} (N >= 1)" in message
