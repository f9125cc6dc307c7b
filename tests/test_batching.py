"""Dynamic batching of Model classes, through HTTP against a real server (issue 9)."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import write_project

MODEL = """
import time
from pathlib import Path


class Model:
    def preprocess(self, inputs):
        return inputs["x"]

    def predict(self, xs):
        Path("batches.log").open("a").write(f"{len(xs)}\\n")
        if any(x == "wrong" for x in xs):
            return xs[:-1] if len(xs) > 1 else []
        if "slow" in xs:
            time.sleep(0.5)
        time.sleep(0.05)  # the model call: long enough for requests to pile up
        return [{"double": x * 2} for x in xs]

    def postprocess(self, output):
        output["post"] = True
        return output
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_project(
        tmp_path_factory.mktemp("batching"),
        {
            "model.py": MODEL,
            "modelserve.yaml": """
                apis:
                  - name: double
                    handler: {path: model.py}
                    max_queue_length: 200
                    batching: {max_batch_size: 8}
                  - name: waiting
                    handler: {path: model.py}
                    batching: {max_batch_size: 4, max_wait_ms: 300}
                  - name: patient
                    handler: {path: model.py}
                    batching: {max_batch_size: 2, max_wait_ms: 30000}
            """,
        },
    )


@pytest.fixture(scope="module")
def server(project: Path, start_server_module):
    server = start_server_module(project)
    server.wait_ready()
    return server


def batch_sizes(project: Path) -> list[int]:
    path = project / "batches.log"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


async def post_many(url: str, values: list[object]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as client:
        return await asyncio.gather(*(client.post(url, json={"x": value}) for value in values))


def test_concurrent_requests_share_calls_and_get_their_own_rows(server, project: Path) -> None:
    before = len(batch_sizes(project))
    answers = asyncio.run(post_many(server.url + "/double", list(range(40))))
    assert [a.json() for a in answers] == [{"double": i * 2, "post": True} for i in range(40)]
    sizes = batch_sizes(project)[before:]
    assert sum(sizes) == 40
    assert max(sizes) > 1, sizes
    assert max(sizes) <= 8
    metrics = httpx.get(server.url + "/metrics").text
    assert 'modelserve_batch_size_count{api="double"}' in metrics


def test_a_full_batch_forms_while_one_runs(server, project: Path) -> None:
    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30) as client:
            before = len(batch_sizes(project))
            slow = asyncio.ensure_future(client.post(server.url + "/double", json={"x": "slow"}))
            while len(batch_sizes(project)) == before:  # until the slow call runs
                await asyncio.sleep(0.01)
            rest = await asyncio.gather(*(client.post(server.url + "/double", json={"x": i}) for i in range(15)))
            return [await slow, *rest]

    before = len(batch_sizes(project))
    answers = asyncio.run(scenario())
    assert [a.status_code for a in answers] == [200] * 16
    # The 15 arrive while the slow call runs; the next call takes a full batch of 8, not only the requests
    # admitted alongside the running one.
    assert batch_sizes(project)[before:][:2] == [1, 8]


def wait_metric(server, suffix: str) -> float:
    match = re.search(rf"^modelserve_batch_wait_seconds_{suffix} (\S+)$", httpx.get(server.url + "/metrics").text, re.M)
    return float(match.group(1)) if match else 0.0


def test_a_lone_request_is_not_delayed(server) -> None:
    # Its wait for a batch, not the wall time (which a loaded test machine stretches), is what must be ~0: it
    # is dispatched at the end of the loop's turn, so the bucket of 25 ms leaves room for a busy machine that
    # takes the CPU away for a time slice or two in between (5 ms did not), and none for any batching window.
    count = wait_metric(server, 'count{api="double"}')
    quick = wait_metric(server, 'bucket{api="double",le="0.025"}')
    assert httpx.post(server.url + "/double", json={"x": 2}).json() == {"double": 4, "post": True}
    assert wait_metric(server, 'count{api="double"}') == count + 1
    assert wait_metric(server, 'bucket{api="double",le="0.025"}') == quick + 1


def test_max_wait_ms_lets_a_partial_batch_wait(server, project: Path) -> None:
    before = len(batch_sizes(project))
    started = time.monotonic()
    assert httpx.post(server.url + "/waiting", json={"x": 3}).json() == {"double": 6, "post": True}
    assert time.monotonic() - started >= 0.3
    assert batch_sizes(project)[before:] == [1]


def test_a_wrong_length_result_fails_every_request_of_the_batch(server, project: Path) -> None:
    answers = asyncio.run(post_many(server.url + "/double", ["wrong"]))
    assert answers[0].status_code == 500
    assert answers[0].json()["request_id"] == answers[0].headers["x-request-id"]
    assert "returned 0 results" in server.log


def wait_in_flight(server, api: str, count: int) -> None:
    """Wait until the server's gauge shows `count` requests of `api` in flight."""
    line = f'modelserve_requests_in_flight{{api="{api}"}} {float(count)}'
    deadline = time.monotonic() + 30  # bounds a failing test; a passing one waits for the server alone
    while line not in httpx.get(server.url + "/metrics").text.splitlines():
        assert time.monotonic() < deadline, server.log
        time.sleep(0.01)


def test_a_request_cancelled_while_waiting_leaves_its_batch(server, project: Path) -> None:
    # `patient` waits up to 30 s for a second request: the first one is surely still waiting when it leaves
    # (with max_wait_ms 300, a busy machine that noticed the close 0.2 s late would have run it).
    host, port = server.url.removeprefix("http://").split(":")
    body = b'{"x": 5}'
    sock = socket.create_connection((host, int(port)))
    sock.sendall(
        b"POST /patient HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    wait_in_flight(server, "patient", 1)  # read, and waiting for its batch
    before = len(batch_sizes(project))
    sock.close()
    wait_in_flight(server, "patient", 0)  # the server saw it leave
    # Two more fill a batch at once: had the first kept its place, it would have taken one of the two places.
    answers = asyncio.run(post_many(server.url + "/patient", [1, 2]))
    assert [a.json() for a in answers] == [{"double": 2, "post": True}, {"double": 4, "post": True}]
    assert batch_sizes(project)[before:] == [2]  # the first one never ran


def test_streaming_with_batching_is_refused(tmp_path: Path) -> None:
    import modelserve

    class Streams:
        def predict(self, inputs):
            yield inputs

    with pytest.raises(modelserve.LoadError, match="batching"):
        modelserve.create_app(handler=Streams, batching=modelserve.BatchingConfig(max_batch_size=4))


# --------------------------------------------------------------------------------------------------
# The lean path (issue 19): a batch's own thread runs the sync stages; a lone request is never held back.

STANDIN = """
import threading
import time

import modelserve


class Model:
    def __init__(self):
        self.threads = []

    def load(self):
        self.loaded_on = threading.get_ident()  # a warm-up call here warms the thread that runs predict

    def preprocess(self, inputs):
        self.threads.append(("preprocess", threading.get_ident()))
        if inputs.get("fail") == "preprocess":
            raise ValueError("bad inputs")
        return inputs["x"]

    def predict(self, batch):
        self.threads.append(("predict", threading.get_ident()))
        if "boom" in batch:
            raise RuntimeError("the model failed")
        time.sleep(0.002)
        return [x * 2 for x in batch]

    def postprocess(self, doubled):
        self.threads.append(("postprocess", threading.get_ident()))
        if doubled == -2:
            raise modelserve.BadRequest("no minus one")
        return {"doubled": doubled, "request_id": modelserve.current_request_id()}
"""


@pytest.fixture(scope="module")
def lean(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from starlette.testclient import TestClient

    import modelserve

    project = write_project(
        tmp_path_factory.mktemp("lean"),
        {
            "model.py": STANDIN,
            "modelserve.yaml": """
                apis:
                  - name: lean
                    handler: {path: model.py}
                    batching: {max_batch_size: 16}
            """,
        },
    )
    app = modelserve.create_app(project)
    with TestClient(app) as client:
        client.portal.call(app.server.wait_loaded)
        yield client, app.server.apis["lean"].backend


def test_a_batch_runs_every_sync_stage_on_the_apis_own_warm_thread(lean) -> None:  # type: ignore[no-untyped-def]
    client, backend = lean
    threads = backend.batcher.threads
    assert len(threads.idents) == 1  # started at load, before any request
    assert backend.instance.loaded_on == threads.idents[0]
    backend.instance.threads.clear()
    for x in range(5):  # one at a time: each a lone request
        answer = client.post("/lean", json={"x": x}, headers={"x-request-id": f"lone-{x}"})
        assert answer.json() == {"doubled": 2 * x, "request_id": f"lone-{x}"}
    seen = backend.instance.threads
    assert [stage for stage, _ in seen] == ["preprocess", "predict", "postprocess"] * 5
    assert {ident for _, ident in seen} == {threads.idents[0]}  # the same thread, every stage, every call


def test_the_requests_of_a_batch_cost_the_loop_one_thread_hop(lean) -> None:  # type: ignore[no-untyped-def]
    client, backend = lean
    thread = backend.batcher.threads.idents[0]

    async def scenario() -> list[int]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            answers = await asyncio.gather(*(http.post("/lean", json={"x": x}) for x in range(12)))
        return [answer.json()["doubled"] for answer in answers]

    backend.instance.threads.clear()
    assert client.portal.call(scenario) == [2 * x for x in range(12)]
    seen = backend.instance.threads
    assert {ident for _, ident in seen} == {thread}
    # Batch by batch, in one job of the batch's thread: each request's preprocess, one predict over them, each
    # request's postprocess (a hop per request would interleave the stages of requests of other batches).
    letters = "".join({"preprocess": "a", "predict": "b", "postprocess": "c"}[stage] for stage, _ in seen)
    batches = re.findall(r"(a+)b(c+)", letters)
    assert "".join(pre + "b" + post for pre, post in batches) == letters
    assert all(len(pre) == len(post) for pre, post in batches)
    assert sum(len(pre) for pre, _ in batches) == 12
    assert max(len(pre) for pre, _ in batches) > 1  # requests did share batches


def test_a_failing_stage_fails_its_own_request_only(lean) -> None:  # type: ignore[no-untyped-def]
    client, _ = lean

    async def scenario() -> list[int]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as http:
            bodies = [{"x": 1}, {"x": 2, "fail": "preprocess"}, {"x": -1}, {"x": 3}]
            answers = await asyncio.gather(*(http.post("/lean", json=body) for body in bodies))
        return [answer.status_code for answer in answers]

    assert client.portal.call(scenario) == [200, 500, 400, 200]
    assert client.post("/lean", json={"x": "boom"}).status_code == 500


def test_a_lone_request_is_handed_to_its_thread_in_the_same_turn_of_the_loop() -> None:
    from modelserve.batching import Batcher

    async def scenario() -> tuple[int, int, bool, list[int]]:
        calls: list[int] = []

        def call(items: list[int]) -> list[int]:
            calls.append(len(items))
            return items

        batcher = Batcher(sync_call=call, name="t", max_batch_size=8)
        batcher.threads.start()  # type: ignore[union-attr]
        lone = asyncio.ensure_future(batcher.submit(1))
        await asyncio.sleep(0)  # the request's task runs and queues its batch
        await asyncio.sleep(0)  # the end of that turn: the batch goes to its thread
        running, waiting, timer = batcher.running, batcher.waiting, batcher._timer is None
        assert await lone == 1
        batcher.close()
        return running, waiting, timer, calls

    assert asyncio.run(scenario()) == (1, 0, True, [1])
