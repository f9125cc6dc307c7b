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


# ------------------------------------------------------------------------------------------------
# the repository: loading and unloading while serving (model control explicit)


@pytest.fixture
def explicit(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    from tests.grpc.test_grpc import served

    root = versioned_project(tmp_path)
    with served(root, load=["every", "latest"]) as (url, _):
        yield url, root


def client_of(url: str) -> Any:
    return httpclient.InferenceServerClient(url.removeprefix("http://"))


def test_load_and_unload_are_refused_unless_explicit(server: Any) -> None:
    client = client_of(server.url)
    with pytest.raises(InferenceServerException) as error:
        client.load_model("latest")
    assert "failed to load 'latest'" in error.value.message() and "--model-control explicit" in error.value.message()
    assert client.is_model_ready("latest")


def test_an_unloaded_model_loads_on_request(explicit: tuple[str, Path]) -> None:
    url, _ = explicit
    client = client_of(url)
    index = {(entry["name"], entry["version"]): entry["state"] for entry in client.get_model_repository_index()}
    assert index == {
        ("every", "1"): "READY",
        ("every", "2"): "READY",
        ("every", "3"): "READY",
        ("latest", "3"): "READY",
        ("chosen", "1"): "UNAVAILABLE",
        ("chosen", "3"): "UNAVAILABLE",
    }
    assert httpx.get(f"{url}/readyz").status_code == 200  # what was not asked for is not waited for
    assert not client.is_model_ready("chosen")
    client.load_model("chosen")
    assert client.is_model_ready("chosen") and infer_url(url, "chosen", "1") == 11.0
    client.unload_model("chosen")
    assert not client.is_model_ready("chosen")
    assert httpx.post(f"{url}/v2/repository/index", json={"ready": True}).json()[-1]["name"] == "latest"


def test_a_load_picks_up_a_new_version_and_retires_the_old(explicit: tuple[str, Path]) -> None:
    url, root = explicit
    client = client_of(url)
    plus_onnx(root / "models" / "plus" / "4" / "model.onnx", 4.0)
    assert infer_url(url, "latest") == 13.0
    client.load_model("latest")
    assert infer_url(url, "latest") == 14.0
    assert client.get_model_metadata("latest")["versions"] == ["4"]
    assert httpx.get(f"{url}/v2/models/latest/versions/3/ready").status_code == 404
    client.load_model("every")
    assert client.get_model_metadata("every")["versions"] == ["1", "2", "3", "4"]


@pytest.mark.parametrize(
    ("name", "body", "words"),
    [
        ("nothing", {}, "failed to load 'nothing', failed to poll from model repository"),
        ("latest", {"parameters": {"file:1/model.onnx": "AA=="}}, "modelserve takes no 'file:1/model.onnx' parameter"),
        ("latest", {"parameters": {"config": "max_batch_size: 4"}}, "the 'config' parameter is not valid JSON"),
        ("latest", {"parameters": {"config": '{"input": [], "platform": "x"}'}}, "cannot apply 'input', 'platform'"),
        ("latest", {"parameters": {"config": '{"name": "other"}'}}, "the configuration names another model, 'other'"),
        ("latest", {"parameters": {"config": '{"max_batch_size": 4}'}}, "max_batch_size 4 would turn batching on"),
        ("latest", {"parameters": {"config": '{"max_batch_size": -1}'}}, "'max_batch_size' must be a non-negative"),
        ("latest", {"parameters": {"config": '{"dynamic_batching": {}}'}}, "'dynamic_batching' is for an API that"),
        ("latest", {"parameters": {"config": 4}}, "the 'config' parameter must be a string of JSON"),
    ],
)
def test_a_load_that_cannot_be_done_says_why(explicit: tuple[str, Path], name: str, body: Any, words: str) -> None:
    url, _ = explicit
    answer = httpx.post(f"{url}/v2/repository/models/{name}/load", json=body)
    assert answer.status_code == 400 and words in answer.json()["error"]


def test_a_load_with_a_configuration_that_changes_nothing_reloads(explicit: tuple[str, Path]) -> None:
    url, _ = explicit
    config = '{"name": "every", "max_batch_size": "0"}'
    answer = httpx.post(f"{url}/v2/repository/models/every/load", json={"parameters": {"config": config}})
    assert answer.status_code == 200, answer.text
    assert [infer_url(url, "every", version) for version in "123"] == [11.0, 12.0, 13.0]
    assert httpx.get(f"{url}/v2/models/every/versions/2/config").json()["max_batch_size"] == 0
    refused = httpx.post(f"{url}/v2/repository/models/every/unload", json={"parameters": {"config": "{}"}})
    assert refused.status_code == 400 and "taken by a load only" in refused.json()["error"]


def infer_url(url: str, name: str, version: str = "") -> float:
    client = client_of(url)
    x = httpclient.InferInput("x", [1], "FP32").set_data_from_numpy(np.array([10], np.float32))
    return float(client.infer(name, [x], model_version=version).as_numpy("y")[0])


def test_the_native_route_of_each_version(server: Any) -> None:
    assert httpx.post(f"{server.url}/every/versions/2", json={"x": [1.0]}).json() == {"y": [3.0]}
    assert httpx.post(f"{server.url}/chosen/versions/1", json={"x": [1.0]}).json() == {"y": [2.0]}
    assert httpx.post(f"{server.url}/every", json={"x": [1.0]}).json() == {"y": [4.0]}  # the highest
    assert httpx.get(f"{server.url}/every/versions/2").json()["model"]["path"] == "models/plus/2/model.onnx"
    assert httpx.post(f"{server.url}/chosen/versions/2", json={"x": [1.0]}).status_code == 404


def test_the_native_routes_follow_loads_and_unloads(start_server: Any, tmp_path: Path) -> None:
    root = versioned_project(tmp_path)
    server = start_server(root, "--model-control", "explicit", "--load-model", "latest", "--load-model", "every")
    server.wait_ready(timeout=90)
    url = server.url
    tensor = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}

    def native(path: str) -> httpx.Response:
        return httpx.post(f"{url}{path}", json={"x": [1.0]})

    def both(name: str, version: str) -> tuple[httpx.Response, httpx.Response]:
        """The native answer and V2's for one version."""
        v2 = httpx.post(f"{url}/v2/models/{name}/versions/{version}/infer", json=tensor)
        return native(f"/{name}/versions/{version}"), v2

    assert native("/latest").json() == native("/latest/versions/3").json() == {"y": [4.0]}
    assert native("/latest/versions/4").status_code == 404
    plus_onnx(root / "models" / "plus" / "4" / "model.onnx", 4.0)
    for name in ("latest", "every"):
        assert httpx.post(f"{url}/v2/repository/models/{name}/load").status_code == 200
    # the version the loads added, by its number and (the highest) without one
    assert native("/latest/versions/4").json() == native("/latest").json() == {"y": [5.0]}
    assert native("/every/versions/4").json() == native("/every").json() == {"y": [5.0]}
    assert native("/every/versions/1").json() == {"y": [2.0]}
    assert httpx.get(f"{url}/latest/versions/4").json()["model"]["path"] == "models/plus/4/model.onnx"
    # the version a load retired: V2's 404, in V2's words
    retired, v2 = both("latest", "3")
    assert retired.status_code == v2.status_code == 404
    assert retired.json()["error"] == v2.json()["error"] == "Request for unknown model: 'latest' version 3 is not found"
    assert httpx.get(f"{url}/latest/versions/3").status_code == 404
    # an unloaded model: V2's 503
    assert httpx.post(f"{url}/v2/repository/models/every/unload").status_code == 200
    unloaded, v2 = both("every", "2")
    assert unloaded.status_code == v2.status_code == 503
    assert unloaded.json()["error"] == v2.json()["error"]
    assert native("/every").status_code == 503
