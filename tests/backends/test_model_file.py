"""The model file backend's fused step (pre_inference, the model, post_inference as one step) and its busy work (the
same call for a worker thread, which a busy server runs through the line) against the staged pipeline they
shortcut, which stays the reference: the same answers, the same 400s, the same failing stage; and which of them a
real server runs, alone and crowded."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
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
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model_file")
    iris_onnx(root / "iris.onnx")
    return write_project(
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
                  # The real server's tests: a threshold no call of a loaded machine crosses, so that every call
                  # alone runs on the loop and only the crowded ones go to a thread.
                  - name: crowd
                    model: {path: iris.onnx, intra_op_threads: 1, inline_threshold_ms: 1000}
                    handler: {path: hooks.py, config: {tag: v1}}
                  - name: crowd-bare
                    model: {path: iris.onnx, intra_op_threads: 1, inline_threshold_ms: 1000}
            """,
        },
    )


@pytest.fixture(scope="module")
def client(project: Path) -> Iterator[TestClient]:
    app = modelserve.create_app(project)
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
    if pipeline.busy_work is not None:  # the same call as the server's worker thread runs it
        ctx = RequestContext(api, "test")
        try:
            outcomes.append(pipeline.busy_work(value, None, ctx)()[0])
        except Exception as exc:
            outcomes.append(exc)
        if isinstance(outcomes[-1], dict) and isinstance(outcomes[0], dict):
            assert outcomes[-1].keys() == outcomes[0].keys()
            for name in outcomes[0]:
                np.testing.assert_equal(outcomes[-1][name], outcomes[0][name])
        else:
            assert type(outcomes[-1]) is type(outcomes[0])
            assert str(outcomes[-1]) == str(outcomes[0])
            assert getattr(outcomes[-1], "stage", None) == getattr(outcomes[0], "stage", None)
    return outcomes[:2]


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


# --------------------------------------------------------------------------------------------------
# A real server: the one step on the loop for a request alone, the busy work through the line when others wait.


@pytest.fixture(scope="module")
def server(project: Path, start_server_module: Any) -> Any:
    server = start_server_module(project)
    server.wait_ready()
    return server


def post(path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def pipelined(server: Any, *requests: bytes) -> list[tuple[int, Any]]:
    """Send `requests` in one write on one connection (the server parses them all before the first call begins,
    so the first finds others waiting); their statuses and JSON bodies."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"".join(requests))
        data, answers = b"", list[tuple[int, Any]]()
        while len(answers) < len(requests):
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection"
            data += chunk
            while b"\r\n\r\n" in data:
                head, _, rest = data.partition(b"\r\n\r\n")
                length = next(
                    int(line[15:]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:")
                )
                if len(rest) < length:
                    break
                answers.append((int(head.split(b" ", 2)[1]), json.loads(rest[:length])))
                data = rest[length:]
    return answers


def calls(server: Any, api: str) -> dict[str, int]:
    stages = httpx.get(f"{server.url}/{api}").json()["execution"]["stages"]
    return {name: stage["thread_calls"] for name, stage in stages.items()}


def test_a_request_alone_runs_on_the_loop_and_a_crowded_one_through_the_line(server: Any) -> None:
    # The first call of a hook goes to a thread (never measured yet), as its later ones do when measured slow.
    assert httpx.post(f"{server.url}/crowd", json={"inputs": [ROW]}).status_code == 200
    before = calls(server, "crowd")
    for _ in range(3):  # one at a time: never crowded
        assert httpx.post(f"{server.url}/crowd", json={"inputs": [ROW]}).status_code == 200
    assert calls(server, "crowd") == before
    body = json.dumps({"inputs": [ROW]}).encode()
    answers = pipelined(server, post("/crowd", body), post("/crowd", body))
    expected = iris_expected([ROW])[1].tolist()
    assert answers == [(200, {"outputs": expected, "tag": "v1"})] * 2
    # The first found the second parsed behind it: its whole call ran in a worker thread; the second, alone by
    # then, on the loop.
    after = calls(server, "crowd")
    assert after == {name: count + 1 for name, count in before.items()}


def test_a_crowded_call_fails_and_refuses_as_one_alone_does(server: Any) -> None:
    cases = [("/crowd", json.dumps({"inputs": [ROW], "fail": "pre"}).encode()), ("/crowd-bare", b'{"wrong": [1]}')]
    alone = [pipelined(server, post(path, body))[0] for path, body in cases]
    before = calls(server, "crowd-bare")["run"]
    crowded = [pipelined(server, post(path, body), post(path, body))[0] for path, body in cases]
    assert calls(server, "crowd-bare")["run"] == before + 1  # the first of the two, through the line
    assert [status for status, _ in alone] == [status for status, _ in crowded] == [500, 400]
    for (_, one), (_, other) in zip(alone, crowded, strict=True):
        assert {key: value for key, value in one.items() if key != "request_id"} == {
            key: value for key, value in other.items() if key != "request_id"
        }


def test_the_v2_route_runs_crowded_calls_through_the_line_too(server: Any) -> None:
    before = calls(server, "crowd")["run"]
    tensor = {"name": "input", "datatype": "FP32", "shape": [1, 4], "data": ROW}
    body = json.dumps({"inputs": [tensor]}).encode()
    answers = pipelined(server, post("/v2/models/crowd/infer", body), post("/v2/models/crowd/infer", body))
    assert [status for status, _ in answers] == [200, 200]
    assert answers[0][1]["outputs"] == answers[1][1]["outputs"]
    assert calls(server, "crowd")["run"] == before + 1


def test_a_crowded_v2_request_is_decoded_and_answered_in_the_thread_as_one_alone_is(server: Any) -> None:
    # Crowded, the body is decoded, checked and its answer encoded in the call's worker thread: the same answers
    # and 400s as on the loop, the body's id included.
    def tensor(**change: Any) -> dict[str, Any]:
        return {"name": "input", "datatype": "FP32", "shape": [1, 4], "data": ROW, **change}

    cases = [
        {"id": "mine-1", "inputs": [tensor()]},
        {"inputs": [tensor(), tensor(name="other")]},
        {"inputs": [tensor(datatype="INT8")]},
        {"inputs": [tensor(shape=[1, 5])]},
        {"inputs": [tensor()], "outputs": [{"name": "nothing"}]},
    ]
    statuses = []
    for case in cases:
        body = json.dumps(case).encode()
        alone = pipelined(server, post("/v2/models/crowd/infer", body))[0]
        before = calls(server, "crowd")["run"]
        crowded = pipelined(server, post("/v2/models/crowd/infer", body), post("/v2/models/crowd/infer", body))
        # a request the model runs: the first of the two in a worker thread, the second on the loop
        assert calls(server, "crowd")["run"] == before + (alone[0] == 200)
        statuses.append(alone[0])
        assert crowded[0][0] == crowded[1][0] == alone[0], case
        for _, answer in crowded:
            assert {k: v for k, v in answer.items() if k != "request_id"} == {
                k: v for k, v in alone[1].items() if k != "request_id"
            }
    assert statuses == [200, 400, 400, 400, 400]
    assert "nothing" in alone[1]["error"]


def test_a_batched_api_serving_unbatched_runs_crowded_calls_in_its_own_thread(server: Any) -> None:
    body = json.dumps({"inputs": [ROW]}).encode()
    expected = [(200, {"outputs": iris_expected([ROW])[1].tolist(), "tag": "v1"})] * 2
    # The batcher serves unbatched while the model is measured under 0.5 ms a call: a call of a loaded machine
    # measured slower batches the next requests, so the pair is sent right after the API says it is unbatched.
    for _ in range(5):
        for _ in range(5):  # the hooks and the model measured, alone
            assert httpx.post(f"{server.url}/batched", json={"inputs": [ROW]}).status_code == 200
        before = calls(server, "batched")
        if httpx.get(f"{server.url}/batched").json()["batching"]["mode"] != "unbatched":
            continue
        assert pipelined(server, post("/batched", body), post("/batched", body)) == expected
        if calls(server, "batched") == {name: count + 1 for name, count in before.items()}:
            return
    pytest.fail("a crowded request of an API serving unbatched did not run in the API's own thread")
