"""The model file backend's fused step (pre_inference, the model, post_inference as one step) against the staged
pipeline it shortcuts, which stays the reference: the same answers, the same 400s, the same failing stage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from starlette.testclient import TestClient

import modelserve
from modelserve.context import RequestContext
from modelserve.errors import BadRequest, UserCodeError
from tests.conftest import write_project
from tests.models import iris_expected, iris_onnx

ROW = [5.1, 3.5, 1.4, 0.2]

HOOKS = """
import numpy as np

def pre_inference(sample, signature, metadata):
    if sample.get("fail") == "pre":
        raise ValueError("pre went wrong")
    return {"input": np.asarray(sample["inputs"], dtype=np.float32)}

def post_inference(prediction, signature, metadata):
    return {"outputs": prediction[1].tolist(), "tag": metadata["tag"]}
"""

ASYNC_PRE = """
import numpy as np

async def pre_inference(sample, signature, metadata):
    return {"input": np.asarray(sample["inputs"], dtype=np.float32)}
"""


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("model_file")
    iris_onnx(root / "iris.onnx")
    project = write_project(
        root,
        {
            "hooks.py": HOOKS,
            "async_pre.py": ASYNC_PRE,
            "modelserve.yaml": """
                apis:
                  - name: hooked
                    model: {path: iris.onnx, intra_op_threads: 1}
                    handler: {path: hooks.py, config: {tag: v1}}
                  - name: threaded
                    model: {path: iris.onnx, intra_op_threads: 1, inline_threshold_ms: 0}
                    handler: {path: hooks.py, config: {tag: v1}}
                  - name: bare
                    model: {path: iris.onnx, intra_op_threads: 1}
                  - name: async-pre
                    model: {path: iris.onnx, intra_op_threads: 1}
                    handler: {path: async_pre.py}
                  - name: batched
                    model: {path: iris.onnx, intra_op_threads: 1}
                    handler: {path: hooks.py, config: {tag: v1}}
                    batching: {max_batch_size: 4}
            """,
        },
    )
    app = modelserve.create_app(Path(project))
    with TestClient(app) as client:
        client.portal.call(app.server.wait_loaded)
        yield client


def run_both(client: TestClient, api: str, value: Any, tensors: bool = False) -> list[Any]:
    """The outcome of the fused step and of the staged reference for `value` (a result or the exception)."""
    backend = client.app.server.apis[api].backend  # type: ignore[attr-defined]
    pipeline = backend.tensors if tensors else backend.pipeline
    outcomes = []
    for step in (pipeline.run, pipeline._compiled_run):

        async def call(step: Any = step) -> Any:
            try:
                return await step(value, None, RequestContext(api, "test"))
            except Exception as exc:
                return exc

        assert client.portal is not None
        outcomes.append(client.portal.call(call))
    return outcomes


@pytest.mark.parametrize("api", ["hooked", "threaded"])
def test_sync_hooks_run_as_one_step_with_the_staged_pipelines_answer(client: TestClient, api: str) -> None:
    backend = client.app.server.apis[api].backend  # type: ignore[attr-defined]
    assert backend.pipeline.run is not backend.pipeline._compiled_run
    fused, staged = run_both(client, api, {"inputs": [ROW]})
    assert fused == staged
    np.testing.assert_allclose(fused["outputs"], iris_expected([ROW])[1], rtol=1e-5)
    assert fused["tag"] == "v1"
    answer = client.post(f"/{api}", json={"inputs": [ROW]})
    assert answer.status_code == 200
    assert answer.json()["tag"] == "v1"


def test_a_failing_hook_is_named_alike_by_both(client: TestClient) -> None:
    fused, staged = run_both(client, "hooked", {"inputs": [ROW], "fail": "pre"})
    assert isinstance(fused, UserCodeError) and isinstance(staged, UserCodeError)
    assert fused.stage == staged.stage == "pre_inference"


def test_bad_input_is_the_same_400_from_both(client: TestClient) -> None:
    fused, staged = run_both(client, "bare", {"wrong": [ROW]})
    assert isinstance(fused, BadRequest) and isinstance(staged, BadRequest)
    assert str(fused) == str(staged)
    fused, staged = run_both(client, "bare", b"not json")
    assert isinstance(fused, BadRequest) and str(fused) == str(staged)


def test_the_tensor_entry_runs_as_one_step_too(client: TestClient) -> None:
    feeds = {"input": np.asarray([ROW], dtype=np.float32)}
    fused, staged = run_both(client, "hooked", feeds, tensors=True)
    assert fused.keys() == staged.keys() == {"label", "probabilities"}
    for name in fused:
        np.testing.assert_array_equal(fused[name], staged[name])


def test_async_hooks_keep_the_staged_pipeline(client: TestClient) -> None:
    backend = client.app.server.apis["async-pre"].backend  # type: ignore[attr-defined]
    assert backend.pipeline.run is backend.pipeline._compiled_run
    answer = client.post("/async-pre", json={"inputs": [ROW]})
    assert answer.status_code == 200


def test_a_batched_api_chooses_between_the_fused_step_and_its_limited_stages(client: TestClient) -> None:
    backend = client.app.server.apis["batched"].backend  # type: ignore[attr-defined]
    assert backend.pipeline.stage_limit == 1
    assert backend.pipeline.run is not backend.pipeline._compiled_run
    assert backend.pipeline.limited(1) is backend.pipeline  # Api.load keeps the choice
    fused, staged = run_both(client, "batched", {"inputs": [ROW]})
    assert fused == staged
