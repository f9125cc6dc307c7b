"""`stacking.BatchChoice`: a batched model file API serves requests unbatched while batching would not pay (a
model measured fast, hooks inline), says so in ``GET /<api>`` and the metrics, and batches again otherwise."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable
from typing import Any

import httpx
import numpy as np
import pytest

from modelserve._threads import Adaptive
from modelserve.context import RequestContext
from modelserve.stacking import UNBATCHED_BELOW_S, BatchChoice
from tests.batch_models import doubler_onnx
from tests.conftest import write_project
from tests.models import iris_expected, iris_onnx

ROW = [5.1, 3.5, 1.4, 0.2]

HOOKS = """
import numpy as np

def pre_inference(sample, signature, metadata):
    return {"input": np.asarray(sample["inputs"], dtype=np.float32)}

def post_inference(prediction, signature, metadata):
    return {"label": prediction[1].tolist()}
"""


def measured(name: str, seconds: float | None, threshold_s: float = 0.001) -> Adaptive:
    adaptive = Adaptive(name, threshold_s)
    if seconds is not None:
        adaptive.seed(seconds)
    return adaptive


def test_a_fast_model_with_inline_hooks_is_served_unbatched() -> None:
    choice = BatchChoice(measured("run", 20e-6), [measured("pre_inference", 5e-6)])
    assert choice.unbatched()
    assert choice.describe()["mode"] == "unbatched"


@pytest.mark.parametrize(
    ("run", "hook", "threshold_s"),
    [
        (None, 5e-6, 0.001),  # the model never measured
        (UNBATCHED_BELOW_S * 2, 5e-6, 0.001),  # a model slow enough for stacking to pay
        (20e-6, None, 0.001),  # a hook not measured yet
        (20e-6, 0.005, 0.001),  # a hook that runs in a thread
        (20e-6, 5e-6, 0.0),  # inline_threshold_ms: 0, nothing inline: always batched
    ],
)
def test_otherwise_requests_are_batched(run: float | None, hook: float | None, threshold_s: float) -> None:
    choice = BatchChoice(measured("run", run, threshold_s), [measured("pre_inference", hook, threshold_s)])
    assert not choice.unbatched()
    assert choice.describe()["mode"] == "batched"


def test_a_model_that_becomes_slow_is_batched_again() -> None:
    run = measured("run", 20e-6)
    choice = BatchChoice(run, [])
    assert choice.unbatched()
    for _ in range(20):
        run.record(0.01)
    assert not choice.unbatched()


async def awaited(call: Awaitable[Any]) -> Any:
    return await call


def test_the_step_counts_what_it_chose() -> None:
    run = measured("run", 20e-6)
    choice = BatchChoice(run, [])

    async def unbatched(value: Any, request: Any, ctx: Any) -> str:
        return "unbatched"

    async def batched(value: Any, request: Any, ctx: Any) -> str:
        return "batched"

    step = choice.step(unbatched, batched)
    assert asyncio.run(awaited(step(1, None, None))) == "unbatched"
    run.seed(0.01)
    assert asyncio.run(awaited(step(1, None, None))) == "batched"
    assert (choice.unbatched_requests, choice.batched_requests) == (1, 1)


@pytest.mark.parametrize(
    ("crowded", "occupied", "expected"),
    [(False, False, "inline"), (True, False, "thread"), (False, True, "thread"), (True, True, "thread")],
)
def test_an_unbatched_request_goes_to_the_thread_when_crowded_or_the_thread_has_work(
    crowded: bool, occupied: bool, expected: str
) -> None:
    choice = BatchChoice(measured("run", 20e-6), [])

    async def unbatched(value: Any, request: Any, ctx: Any) -> str:
        return "inline"

    async def batched(value: Any, request: Any, ctx: Any) -> str:
        return "batched"

    async def busy(value: Any, request: Any, ctx: Any) -> str:
        return "thread"

    ctx = RequestContext("api", "id")
    ctx.crowded = crowded
    step = choice.step(unbatched, batched, busy=busy, occupied=lambda: occupied)
    assert asyncio.run(awaited(step(1, None, ctx))) == expected
    assert (choice.unbatched_requests, choice.batched_requests) == (1, 0)


# --------------------------------------------------------------------------------------------------
# through a server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> Any:
    root = tmp_path_factory.mktemp("stacking")
    iris_onnx(root / "iris.onnx")
    doubler_onnx(root / "doubler.onnx", seconds=0.02)
    project = write_project(
        root,
        {
            "hooks.py": HOOKS,
            "modelserve.yaml": """
                apis:
                  - name: iris
                    model: {path: iris.onnx, intra_op_threads: 1}
                    handler: {path: hooks.py}
                    batching: {max_batch_size: 8}
                  - name: always
                    model: {path: iris.onnx, intra_op_threads: 1, inline_threshold_ms: 0}
                    handler: {path: hooks.py}
                    batching: {max_batch_size: 8}
                  - name: slow
                    model: {path: doubler.onnx, intra_op_threads: 1}
                    batching: {max_batch_size: 8}
            """,
        },
    )
    server = start_server_module(project)
    server.wait_ready()
    return server


async def post_many(url: str, bodies: list[Any]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as client:
        return await asyncio.gather(*(client.post(url, json=body) for body in bodies))


def stage_count(server: Any, api: str, stage: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    match = re.search(rf'^modelserve_\w*stage\w*_count{{api="{api}",stage="{re.escape(stage)}"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def test_a_fast_model_is_served_unbatched_and_says_so(server: Any) -> None:
    # Until the model and its hooks are measured, requests are batched: a first burst may all arrive before any
    # estimate exists (seen in a CI run: 24 batched, then "unbatched" with none served so). Bursts go on until
    # one is served unbatched (a bound for a failing test only).
    deadline = time.monotonic() + 30
    while True:
        answers = asyncio.run(post_many(server.url + "/iris", [{"inputs": [ROW]}] * 24))
        assert [answer.status_code for answer in answers] == [200] * 24
        assert {tuple(answer.json()["label"]) for answer in answers} == {tuple(iris_expected([ROW])[1].tolist())}
        info = httpx.get(server.url + "/iris").json()["batching"]
        if info["unbatched_requests"] > 0 or time.monotonic() > deadline:
            break
    assert info["mode"] == "unbatched"
    assert info["unbatched_requests"] > 0
    assert stage_count(server, "iris", "run (unbatched)") == info["unbatched_requests"]
    # V2's tensor entry makes the same choice
    v2 = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 4], "data": ROW}]}
    answer = httpx.post(server.url + "/v2/models/iris/infer", json=v2)
    assert answer.status_code == 200
    assert httpx.get(server.url + "/iris").json()["batching"]["unbatched_requests"] > info["unbatched_requests"]


def test_inline_threshold_zero_always_batches(server: Any) -> None:
    answers = asyncio.run(post_many(server.url + "/always", [{"inputs": [ROW]}] * 16))
    assert [answer.status_code for answer in answers] == [200] * 16
    info = httpx.get(server.url + "/always").json()["batching"]
    assert info["mode"] == "batched"
    assert info["unbatched_requests"] == 0
    assert info["batched_requests"] == info["requests"] >= 16
    assert stage_count(server, "always", "run (unbatched)") == 0


def test_a_slow_model_is_batched(server: Any) -> None:
    rows = [{"x": [[i, i + 0.5]]} for i in range(16)]
    answers = asyncio.run(post_many(server.url + "/slow", rows))
    assert [answer.json()["y"] for answer in answers] == [[[2 * i, 2 * i + 1]] for i in range(16)]
    info = httpx.get(server.url + "/slow").json()["batching"]
    assert info["mode"] == "batched"
    assert info["unbatched_requests"] == 0
    assert info["stacked_calls"] > 0
    assert np.isfinite(info["unbatched_below_ms"])
