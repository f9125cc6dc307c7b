"""Dynamic batching of ONNX and TensorFlow model APIs, through HTTP against a real server (issue 9)."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.batch_models import TABLE, doubler_onnx, lookup_onnx
from tests.conftest import write_project
from tests.models import fixed_shape_onnx, iris_expected, iris_saved_model, two_inputs_onnx

HOOKS = """
def pre_inference(sample, signature, metadata):
    return {signature[0].name: sample["rows"]}


def post_inference(prediction, signature, metadata):
    return {"rows": prediction[0].tolist(), "count": len(prediction[0])}
"""

# Slow enough (10 ms) to run in worker threads: counts how many calls overlap. A sample {"rows": ..., "hold":
# true} is held until the test creates the file "release": a hook still running after its request timed out.
SLOW_HOOKS = """
import threading, time
from pathlib import Path

lock = threading.Lock()
active = 0
most = 0


def pre_inference(sample, signature, metadata):
    global active, most
    with lock:
        active += 1
        most = max(most, active)
    time.sleep(0.01)
    held = isinstance(sample, dict) and sample["hold"]
    deadline = time.monotonic() + 10
    while held and not Path("release").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    with lock:
        active -= 1
    return sample["rows"] if isinstance(sample, dict) else sample


def post_inference(prediction, signature, metadata):
    return {"most_at_once": most}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("batching_models")
    doubler_onnx(root / "doubler.onnx", seconds=0.04)
    lookup_onnx(root / "lookup.onnx", seconds=0.04)
    fixed_shape_onnx(root / "fixed.onnx")
    two_inputs_onnx(root / "two.onnx")
    return write_project(
        root,
        {
            "hooks.py": HOOKS,
            "slow_hooks.py": SLOW_HOOKS,
            "modelserve.yaml": """
                apis:
                  - name: doubler
                    model: {path: doubler.onnx, intra_op_threads: 1}
                    max_queue_length: 200
                    batching: {max_batch_size: 8}
                  - name: hooked
                    model: {path: doubler.onnx, intra_op_threads: 1}
                    handler: {path: hooks.py}
                    batching: {max_batch_size: 8}
                  - name: serial
                    model: {path: doubler.onnx, intra_op_threads: 1}
                    handler: {path: slow_hooks.py}
                    batching: {max_batch_size: 8}
                  - name: stuck
                    model: {path: doubler.onnx, intra_op_threads: 1}
                    handler: {path: slow_hooks.py}
                    timeout: 1
                    batching: {max_batch_size: 8}
                  - name: lookup
                    model: {path: lookup.onnx, intra_op_threads: 1}
                    batching: {max_batch_size: 16}
                  - name: waiting
                    model: {path: doubler.onnx, intra_op_threads: 1}
                    batching: {max_batch_size: 4, max_wait_ms: 300}
                  - name: patient
                    model: {path: doubler.onnx, intra_op_threads: 1}
                    batching: {max_batch_size: 2, max_wait_ms: 30000}
                  - name: hurried
                    model: {path: doubler.onnx, intra_op_threads: 1}
                    timeout: 0.1
                    batching: {max_batch_size: 4, max_wait_ms: 300}
                  - name: fixed
                    model: {path: fixed.onnx}
                    batching: {max_batch_size: 8}
                  - name: scalars
                    model: {path: two.onnx}
                    batching: {max_batch_size: 8}
            """,
        },
    )


@pytest.fixture(scope="module")
def server(project: Path, start_server_module):
    server = start_server_module(project)
    server.wait_ready()
    return server


async def post_many(url: str, bodies: list[Any]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as client:
        return await asyncio.gather(*(client.post(url, json=body) for body in bodies))


def batching_of(server, api: str) -> dict[str, Any]:
    info = httpx.get(f"{server.url}/{api}").json()["batching"]
    assert info is not None
    return info


def metric(server, name: str, api: str, le: str | None = None) -> float:
    labels = f'api="{api}"' + (f',le="{le}"' if le is not None else "")
    match = re.search(rf"^{name}{{{labels}}} (\S+)$", httpx.get(server.url + "/metrics").text, re.M)
    return float(match.group(1)) if match else 0.0


def test_concurrent_requests_share_calls_and_get_their_own_rows(server) -> None:
    before = batching_of(server, "doubler")
    batches_before = metric(server, "modelserve_batch_size_count", "doubler")
    rows = [[[i, i + 0.5]] for i in range(24)]
    answers = asyncio.run(post_many(server.url + "/doubler", rows))
    assert [a.status_code for a in answers] == [200] * 24
    assert [a.json()["y"] for a in answers] == [[[2 * i, 2 * i + 1]] for i in range(24)]
    after = batching_of(server, "doubler")
    assert after["requests"] - before["requests"] == 24
    calls = after["model_calls"] - before["model_calls"]
    assert calls < 12, after  # each call takes 40 ms: requests pile up while one runs
    assert after["stacked_calls"] > before["stacked_calls"]
    batches = metric(server, "modelserve_batch_size_count", "doubler") - batches_before
    assert 3 <= batches <= calls  # at most 8 per batch, and a batch is one call here
    assert metric(server, "modelserve_batch_size_sum", "doubler") >= 24


def test_hooks_run_per_request_around_a_shared_call(server) -> None:
    bodies = [{"rows": [[i, j] for j in range(i % 3 + 1)]} for i in range(12)]
    answers = asyncio.run(post_many(server.url + "/hooked", bodies))
    for body, answer in zip(bodies, answers, strict=True):
        assert answer.json() == {"rows": [[2 * a, 2 * b] for a, b in body["rows"]], "count": len(body["rows"])}
    info = batching_of(server, "hooked")
    assert info["model_calls"] < info["requests"]


def test_hooks_are_never_called_concurrently_with_max_concurrency_1(server) -> None:
    answers = asyncio.run(post_many(server.url + "/serial", [[[i, 1]] for i in range(8)]))
    assert [a.json() for a in answers] == [{"most_at_once": 1}] * 8


def test_a_hook_still_running_after_its_request_left_keeps_the_hooks_serial(server, project: Path) -> None:
    first = httpx.post(server.url + "/stuck", json={"rows": [[1, 2]], "hold": True})
    assert first.status_code == 504  # answered at the timeout; its hook is held on in its thread
    second: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: second.append(httpx.post(server.url + "/stuck", json={"rows": [[1, 2]], "hold": False}))
    )
    sender.start()
    time.sleep(0.2)
    (project / "release").touch()
    sender.join(10)
    assert second[0].json() == {"most_at_once": 1}  # its hook waited for the first one to return


def test_mixed_shapes_are_served_each_with_its_own_rows(server) -> None:
    bodies = [np.full((i % 3 + 1, 2 + i % 2), i, dtype=float).tolist() for i in range(16)]
    bodies.append([[1.0, 2.0], [3.0]])  # ragged rows: refused by the converter, not by batching
    before = batching_of(server, "doubler")
    answers = asyncio.run(post_many(server.url + "/doubler", bodies))
    for body, answer in zip(bodies[:-1], answers[:-1], strict=True):
        assert answer.status_code == 200, answer.text
        assert answer.json()["y"] == (2 * np.asarray(body)).tolist()
    assert answers[-1].status_code == 400
    after = batching_of(server, "doubler")
    assert after["stacked_calls"] > before["stacked_calls"]  # rows of equal width still shared calls
    assert after["model_calls"] - before["model_calls"] < 16


def test_a_failing_request_fails_alone(server) -> None:
    bodies = [[i % 10] for i in range(11)] + [[1, 42]]  # index 42 is out of the table: the call raises
    answers = asyncio.run(post_many(server.url + "/lookup", bodies))
    assert [a.status_code for a in answers] == [200] * 11 + [500]
    assert [a.json()["value"] for a in answers[:11]] == [[float(TABLE[i % 10])] for i in range(11)]


@pytest.mark.parametrize(
    ("api", "body", "expected"),
    [
        ("fixed", {"x": [[1, 2, 3], [4, 5, 6]]}, {"y": [[2, 4, 6], [8, 10, 12]]}),
        ("scalars", {"a": [[1, 2]], "b": [[3, 4]], "flag": True}, {"sum": [[4, 6]], "flag_out": True}),
    ],
)
def test_models_without_a_batch_dimension_are_served_alone(server, api: str, body: Any, expected: Any) -> None:
    answers = asyncio.run(post_many(f"{server.url}/{api}", [body] * 6))
    assert [a.json() for a in answers] == [expected] * 6
    info = batching_of(server, api)
    assert info["stackable"] is False
    assert info["stacked_calls"] == 0


def test_a_lone_request_is_not_delayed(server) -> None:
    count = metric(server, "modelserve_batch_wait_seconds_count", "doubler")
    # Dispatched at the end of the loop's turn: within 25 ms even when a busy machine takes the CPU away for a
    # time slice or two in between (5 ms left it none).
    quick = metric(server, "modelserve_batch_wait_seconds_bucket", "doubler", le="0.025")
    assert httpx.post(server.url + "/doubler", json=[[1, 2]]).json() == {"y": [[2, 4]]}
    assert metric(server, "modelserve_batch_wait_seconds_count", "doubler") == count + 1
    assert metric(server, "modelserve_batch_wait_seconds_bucket", "doubler", le="0.025") == quick + 1


def test_max_wait_ms_lets_a_partial_batch_wait(server) -> None:
    started = time.monotonic()
    assert httpx.post(server.url + "/waiting", json=[[1, 2]]).json() == {"y": [[2, 4]]}
    assert time.monotonic() - started >= 0.3


def wait_for(predicate, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_request_cancelled_while_waiting_leaves_its_batch(server) -> None:
    # `patient` waits up to 30 s for a second request: the first one is surely still waiting when the test sees
    # it and when it leaves (with max_wait_ms 300, a busy machine could run its batch before the polling saw it).
    before = batching_of(server, "patient")
    body = b"[[5, 6]]"
    sock = socket.create_connection(("127.0.0.1", server.port))
    try:
        sock.sendall(
            b"POST /patient HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        wait_for(lambda: batching_of(server, "patient")["waiting"] == 1)
    finally:
        sock.close()
    wait_for(lambda: batching_of(server, "patient")["waiting"] == 0)
    # Two more fill a batch at once: had the first kept its place, it would have taken one of the two places.
    answers = asyncio.run(post_many(server.url + "/patient", [[[1, 2]], [[3, 4]]]))
    assert [a.json() for a in answers] == [{"y": [[2, 4]]}, {"y": [[6, 8]]}]
    after = batching_of(server, "patient")
    assert after["requests"] - before["requests"] == 2  # the first request never ran
    assert after["model_calls"] - before["model_calls"] == 1


def test_a_request_that_times_out_while_waiting_leaves_its_batch(server) -> None:
    before = batching_of(server, "hurried")
    answer = httpx.post(server.url + "/hurried", json=[[1, 2]])
    assert answer.status_code == 504
    after = batching_of(server, "hurried")
    assert after["waiting"] == 0
    assert after["requests"] == before["requests"]


def test_tensorflow_requests_are_batched(tmp_path: Path, start_server) -> None:
    iris_saved_model(tmp_path / "iris")
    project = write_project(
        tmp_path,
        {
            "modelserve.yaml": """
                apis:
                  - name: iris
                    model: {path: iris, format: tensorflow}
                    batching: {max_batch_size: 8}
            """,
        },
    )
    server = start_server(project)
    server.wait_ready(timeout=120)
    rows = [[[i / 4, 1.0, 2 - i / 8, 0.5]] for i in range(20)]
    answers = asyncio.run(post_many(server.url + "/iris", rows))
    for row, answer in zip(rows, answers, strict=True):
        probabilities, label = iris_expected(row)
        assert answer.json()["label"] == label.tolist()
        assert np.allclose(answer.json()["probabilities"], probabilities, atol=1e-5)
    info = batching_of(server, "iris")
    assert info["stackable"] is True
    assert info["requests"] == 20


def test_a_waiter_cancelled_just_before_a_release_does_not_break_the_limiter() -> None:
    # A burst of disconnects (wrk stopping 64 connections) cancels waiters that release() then skips.
    from modelserve.limiter import Limiter

    async def scenario() -> None:
        limiter = Limiter(1, 10)
        await limiter.acquire()
        waiters = [asyncio.create_task(limiter.acquire()) for _ in range(3)]
        await asyncio.sleep(0)
        waiters[0].cancel()  # its future is cancelled now, its handler runs only later
        limiter.release()  # skips the cancelled future, hands the slot to the second waiter
        with pytest.raises(asyncio.CancelledError):
            await waiters[0]
        await waiters[1]
        assert limiter.running == 1 and limiter.waiting == 1
        limiter.release()
        await waiters[2]
        limiter.release()
        assert limiter.running == 0 and limiter.waiting == 0

    asyncio.run(scenario())


def test_the_batcher_drops_requests_cancelled_while_the_model_is_busy() -> None:
    from modelserve.batching import Batcher

    async def scenario() -> None:
        release = asyncio.Event()
        calls: list[list[str]] = []

        async def call(items: list[str]) -> list[str]:
            calls.append(items)
            await release.wait()
            return [item.upper() for item in items]

        batcher = Batcher(call, name="t", max_batch_size=8)
        running = asyncio.create_task(batcher.submit("a"))  # takes the model
        await asyncio.sleep(0)
        waiting = asyncio.create_task(batcher.submit("b"))  # waits: the model is busy
        kept = asyncio.create_task(batcher.submit("c"))
        await asyncio.sleep(0)
        assert batcher.waiting == 2
        waiting.cancel()
        running.cancel()  # cancelled during its call: the call goes on, its result is dropped
        await asyncio.sleep(0)
        assert batcher.waiting == 1
        release.set()
        assert await kept == "C"
        assert calls == [["a"], ["c"]]
        assert running.cancelled() and waiting.cancelled()

    asyncio.run(scenario())


def test_a_failed_item_fails_its_own_request_only() -> None:
    from modelserve.batching import Batcher, Failed

    sizes: list[int] = []

    def call(items: list[int]) -> list[object]:
        sizes.append(len(items))
        return [Failed(ValueError(f"bad {item}")) if item < 0 else item * 2 for item in items]

    async def scenario() -> list[object]:
        batcher = Batcher(sync_call=call, name="t", max_batch_size=8)
        try:
            return await asyncio.gather(*(batcher.submit(item) for item in (1, -1, 3)), return_exceptions=True)
        finally:
            batcher.close()

    first, failed, last = asyncio.run(scenario())
    assert sizes == [3]  # one batch, whose failed row did not fail the others
    assert (first, last) == (2, 6)
    assert isinstance(failed, ValueError) and str(failed) == "bad -1"


def test_the_stacker_groups_stackable_requests_and_runs_the_others_alone() -> None:
    from modelserve.batching import Failed
    from modelserve.stacking import FeedStacker

    calls: list[tuple[int, ...]] = []

    def run(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        x = feeds["x"]
        calls.append(x.shape)
        if (x < 0).any():
            raise ValueError("negative")
        total = np.full((1,), x.sum())  # no batch dimension: cannot be split
        return [x * 2, total] if x.shape[1] == 3 else [x * 2]

    stacker = FeedStacker(run, stackable=True)
    items = [
        {"x": np.ones((1, 2))},
        {"x": np.full((2, 2), 2.0)},
        {"x": np.full((1, 2), -1.0)},  # its stacked call raises: retried alone, fails alone
        {"x": np.ones((1, 3))},  # an unsplittable output: run alone, with the other [*, 3]
        {"x": np.ones((1, 3))},
        {"x": np.ones((1, 5))},  # nothing to stack with
    ]
    results = stacker(items)
    assert [r[0].tolist() for r in results[:2]] == [[[2, 2]], [[4, 4], [4, 4]]]
    assert isinstance(results[2], Failed) and str(results[2].error) == "negative"
    assert [r[0].tolist() for r in results[3:]] == [[[2, 2, 2]], [[2, 2, 2]], [[2] * 5]]
    assert calls[0] == (4, 2) and (2, 3) in calls  # two stacked attempts, then calls of one request
    assert stacker.stacked_calls == 2 and stacker.calls == len(calls)
    calls.clear()
    stacker([{"x": np.ones((1, 3))}, {"x": np.ones((1, 3))}])
    assert calls == [(1, 3), (1, 3)]  # an unsplittable shape is remembered: no stacked attempt again


@pytest.mark.parametrize(
    ("inputs", "outputs", "expected"),
    [
        ([("batch", 4)], [("batch", 3)], True),
        ([(None, 4)], [None], True),
        ([(2, 3)], [(2, 3)], False),
        ([("n", 2), ()], [("n", 2)], False),
        ([None], [("n",)], False),
        ([("n", 4)], [(1,)], False),
    ],
)
def test_a_model_is_stackable_with_a_dynamic_first_dimension(inputs, outputs, expected) -> None:
    from modelserve.runtimes._tensors import TensorSpec
    from modelserve.stacking import has_batch_dimension

    def specs(shapes):  # type: ignore[no-untyped-def]
        return [TensorSpec(f"t{i}", np.dtype("float32"), shape) for i, shape in enumerate(shapes)]

    assert has_batch_dimension(specs(inputs), specs(outputs)) is expected
