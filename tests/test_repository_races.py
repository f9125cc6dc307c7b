"""Loading and unloading models while requests are in flight (`modelserve.repository`, model control explicit).

A real uvicorn server in this process serves a project whose models wait on events that the test holds
(`GATES`): a call that waits inside ``predict``, a load that waits inside ``load``. What happens around them is
then decided by the test, not by timing: an unload while a call runs, a load or an unload whose gRPC caller gives
up, an unload while the model still loads at start, a load that finds no version, a burst of calls beside
repeated loads and unloads. Client timeouts are failure detectors only.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, free_port, serve_in_thread, write_project

#: Generous bounds that only tell a hang from an answer.
PATIENCE = 30.0
#: docs/v2.md, whose model repository section says what these tests hold.
V2_PAGE = (REPO / "docs" / "v2.md").read_text(encoding="utf-8")


class Gates:
    """What the project's models wait on and tell (reset before each test)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.entered = threading.Event()  # a gated call runs its predict
        self.release = threading.Event()  # ... which returns (or a stream goes on) once this is set
        self.loading = threading.Event()  # a gated load runs
        self.load = threading.Event()  # ... which returns once this is set
        self.fail_load = False
        #: The calls that name a gate (``{"gate": name}``): (entered, release) events, made by the test.
        self.named: dict[str, tuple[threading.Event, threading.Event]] = {}

    def gate(self, name: str) -> tuple[threading.Event, threading.Event]:
        self.named[name] = (threading.Event(), threading.Event())
        return self.named[name]


GATES = Gates()

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: gated
            handler: {path: gated.py}
            max_concurrency: 8
          - name: quick
            handler: {path: quick.py}
            max_concurrency: 4
            max_queue_length: 64
          - name: stream
            handler: {path: stream.py}
    """,
    "gated.py": """
        from tests.test_repository_races import GATES, PATIENCE

        class Model:
            def __init__(self, **kwargs):
                pass

            def load(self):
                GATES.loading.set()
                assert GATES.load.wait(PATIENCE)
                if GATES.fail_load:
                    raise RuntimeError("told to fail")

            def predict(self, inputs):
                entered, release = GATES.named.get(inputs.get("gate"), (GATES.entered, GATES.release))
                entered.set()
                assert release.wait(PATIENCE)
                return {"done": True}
    """,
    "quick.py": """
        class Model:
            def __init__(self, **kwargs):
                pass

            def predict(self, inputs):
                return {"done": True}
    """,
    "stream.py": """
        from tests.test_repository_races import GATES, PATIENCE

        class Model:
            def __init__(self, **kwargs):
                pass

            def predict(self, inputs):
                yield "first\\n"
                GATES.entered.set()
                assert GATES.release.wait(PATIENCE)
                yield "last\\n"
    """,
}


@pytest.fixture(autouse=True)
def gates() -> Iterator[Gates]:
    GATES.reset()  # the same object: a project's model imported it once
    GATES.load.set()  # loads go through unless a test holds them
    yield GATES
    for _, release in [*GATES.named.values(), (None, GATES.release)]:
        release.set()
    GATES.load.set()  # nothing of a failed test stays held


@contextlib.contextmanager
def serving(root: Path, grpc: bool = False, ready: bool = True, **options: Any) -> Iterator[tuple[str, str, Any]]:
    """The project served with model control explicit (every API loads at start), gRPC beside when asked;
    yields (HTTP URL, gRPC address, app), once every API is ready when `ready`. `options`: uvicorn's."""
    import uvicorn

    import modelserve

    app = modelserve.create_app(str(root))
    app.server.repository.explicit([])
    address = ""
    if grpc:
        from modelserve.grpc import attach

        port = free_port()
        attach(app.server, "127.0.0.1", port)
        address = f"127.0.0.1:{port}"
    http_port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=http_port, log_level="warning", lifespan="on", **options)
    with serve_in_thread(config):
        url = f"http://127.0.0.1:{http_port}"
        if ready:
            until(lambda: httpx.get(f"{url}/readyz").status_code == 200, "the server was not ready")
        yield url, address, app


def until(condition: Callable[[], bool], failure: str) -> None:
    """Wait for `condition` (a state the server reaches by itself, with no event to wait on); a hang fails."""
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.01)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path, PROJECT)


def in_thread(function: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run `function` in a thread; its result lands in the list."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(function()))
    thread.start()
    return thread, result


def post(url: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body if body is not None else {}, timeout=PATIENCE)


def index(url: str) -> dict[str, tuple[str, str]]:
    entries = httpx.post(f"{url}/v2/repository/index", timeout=PATIENCE).json()
    return {entry["name"]: (entry["state"], entry["reason"]) for entry in entries}


def test_an_unload_refuses_new_calls_as_unloaded_while_one_finishes(project: Path, gates: Gates) -> None:
    with serving(project) as (url, _, _app):
        held, held_answer = in_thread(lambda: post(url, "/gated"))
        assert gates.entered.wait(PATIENCE)
        unloading, unload_answer = in_thread(lambda: post(url, "/v2/repository/models/gated/unload"))
        until(lambda: httpx.get(f"{url}/v2/models/gated/ready").status_code == 503, "the unload did not begin")
        refused = post(url, "/gated")
        assert refused.status_code == 503
        assert refused.json()["error"].startswith("api 'gated' is unloaded;")  # not "is loading; retry later"
        assert "from the moment it begins" in V2_PAGE and "so the server stays ready" in V2_PAGE
        # the server stays ready: what is being unloaded is not meant to be loaded
        assert httpx.get(f"{url}/readyz").status_code == 200
        assert httpx.get(f"{url}/v2/health/ready").status_code == 200
        assert unloading.is_alive()  # the call in flight holds the unload
        gates.release.set()
        held.join(PATIENCE)
        unloading.join(PATIENCE)
        assert held_answer[0].status_code == 200 and held_answer[0].json() == {"done": True}
        assert unload_answer[0].status_code == 200
        assert index(url)["gated"] == ("UNAVAILABLE", "unloaded")


def test_a_load_of_a_model_that_serves_answers_once_the_new_one_serves(project: Path, gates: Gates) -> None:
    with serving(project) as (url, _, app):
        (old_entered, old_release), (new_entered, new_release) = gates.gate("old"), gates.gate("new")
        on_old, on_old_answer = in_thread(lambda: post(url, "/gated", {"gate": "old"}))
        assert old_entered.wait(PATIENCE)
        old_backend = app.server.apis["gated"].backend
        loading, load_answer = in_thread(lambda: post(url, "/v2/repository/models/gated/load"))
        until(lambda: app.server.apis["gated"].backend is not old_backend, "the load did not switch")
        on_new, on_new_answer = in_thread(lambda: post(url, "/gated", {"gate": "new"}))
        assert new_entered.wait(PATIENCE)  # a call on the new backend
        old_release.set()
        on_old.join(PATIENCE)
        # the load answers while a call of the new backend runs (it waited until no call at all ran: never,
        # under steady traffic, and every later load or unload of the API waited behind it)
        loading.join(PATIENCE)
        assert not loading.is_alive() and load_answer[0].status_code == 200
        assert on_new.is_alive()
        assert "switches once that is ready, and answers" in V2_PAGE
        new_release.set()
        on_new.join(PATIENCE)
        assert on_old_answer[0].json() == on_new_answer[0].json() == {"done": True}
        assert post(url, "/v2/repository/models/gated/unload").status_code == 200


def test_a_load_whose_grpc_caller_gave_up_still_ends(project: Path, gates: Gates) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc")
    InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException  # noqa: N806

    with serving(project, grpc=True) as (url, address, _app):
        assert post(url, "/v2/repository/models/gated/unload").status_code == 200
        gates.load.clear()
        gates.loading.clear()
        client = grpcclient.InferenceServerClient(address)
        with pytest.raises(InferenceServerException) as gave_up:
            client.load_model("gated", client_timeout=0.5)  # the load waits on the test: the deadline passes
        assert "Deadline" in str(gave_up.value.status()) or "DEADLINE" in str(gave_up.value.status())
        assert gates.loading.wait(PATIENCE)
        gates.load.set()
        # the load goes on without its caller: the model serves (it stayed LOADING, refusing every call)
        until(lambda: httpx.get(f"{url}/v2/models/gated/ready").status_code == 200, "the load never ended")
        assert index(url)["gated"] == ("READY", "")
        gates.release.set()
        assert post(url, "/gated").json() == {"done": True}
        client.close()


def test_an_unload_while_the_model_loads_at_start_is_not_undone(project: Path, gates: Gates) -> None:
    gates.load.clear()
    with serving(project, ready=False) as (url, _, app):
        assert gates.loading.wait(PATIENCE)
        unloading, unload_answer = in_thread(lambda: post(url, "/v2/repository/models/gated/unload"))
        # let the load at start end only once the unload has come (it waits for that load now; it was answered
        # at once before, and the load then made the model serve again)
        busy = app.server.repository._busy
        until(lambda: not unloading.is_alive() or ("gated" in busy and busy["gated"].locked()), "no unload came")
        gates.load.set()
        unloading.join(PATIENCE)
        assert unload_answer[0].status_code == 200
        until(lambda: httpx.get(f"{url}/readyz").status_code == 200, "the server was not ready")
        assert index(url)["gated"] == ("UNAVAILABLE", "unloaded")
        refused = post(url, "/gated")
        assert refused.status_code == 503 and refused.json()["error"].startswith("api 'gated' is unloaded;")


def test_an_unload_that_the_shutdown_stops_is_a_503(project: Path, gates: Gates) -> None:
    with serving(project, timeout_graceful_shutdown=0.2) as (url, _, _app):
        held, held_answer = in_thread(lambda: post(url, "/gated"))
        assert gates.entered.wait(PATIENCE)
        unloading, unload_answer = in_thread(lambda: post(url, "/v2/repository/models/gated/unload"))
        until(lambda: httpx.get(f"{url}/v2/models/gated/ready").status_code == 503, "the unload did not begin")
    # the server stopped while the call held the unload: both requests are answered, in JSON (the unload's was a
    # plain-text 500)
    held.join(PATIENCE)
    unloading.join(PATIENCE)
    for answer in (held_answer[0], unload_answer[0]):
        assert answer.status_code == 503 and answer.json()["error"] == "the server is shutting down; retry later"
    assert "answers\n  503 `the server is shutting down; retry later`" in V2_PAGE


def test_a_load_that_finds_no_version_is_refused_and_the_versions_serve_on(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    from tests.http.test_repository import versioned_project

    root = versioned_project(tmp_path)
    with serving(root) as (url, _, _app):
        folder = root / "models" / "plus"
        shutil.move(folder, tmp_path / "away")
        folder.mkdir()
        answer = post(url, "/v2/repository/models/latest/load")
        assert answer.status_code == 400
        said = "selects none of the versions [] in 'models/plus'; the versions it serves stay"
        assert said in answer.json()["error"] and said in V2_PAGE
        # what served goes on serving (every call was a plain 500 after such a load)
        assert post(url, "/latest", {"x": [1.0]}).json() == {"y": [4.0]}
        assert httpx.get(f"{url}/v2/models/latest").json()["versions"] == ["3"]
        assert httpx.get(f"{url}/v2/models/latest/ready").status_code == 200
        folder.rmdir()
        shutil.move(tmp_path / "away", folder)
        assert post(url, "/v2/repository/models/latest/load").status_code == 200
        assert post(url, "/latest", {"x": [1.0]}).json() == {"y": [4.0]}


def test_versions_added_and_retired_again_and_again_are_freed(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    import gc

    from modelserve.api import Api
    from tests.http.test_repository import plus_onnx, versioned_project

    def live_apis() -> int:
        gc.collect()
        return sum(isinstance(thing, Api) for thing in gc.get_objects())

    root = versioned_project(tmp_path)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    with serving(root) as (url, _, _app):
        counts = []
        for _ in range(6):
            plus_onnx(root / "models" / "plus" / "4" / "model.onnx", 4.0)
            assert post(url, "/v2/repository/models/latest/load").status_code == 200
            assert post(url, "/v2/models/latest/infer", body).json()["outputs"][0]["data"] == [5.0]
            shutil.rmtree(root / "models" / "plus" / "4")
            assert post(url, "/v2/repository/models/latest/load").status_code == 200
            assert post(url, "/v2/models/latest/infer", body).json()["outputs"][0]["data"] == [4.0]
            counts.append(live_apis())
        # each cycle made two APIs (version 4, then version 3 again): the retired ones are not kept
        assert counts[-1] == counts[1], counts


def test_an_unload_during_a_stream_lets_it_finish(project: Path, gates: Gates) -> None:
    with serving(project) as (url, _, _app), httpx.Client(timeout=PATIENCE) as client:
        with client.stream("POST", f"{url}/stream", json={}) as streamed:
            chunks = streamed.iter_text()
            assert next(chunks) == "first\n"
            assert gates.entered.wait(PATIENCE)
            unloading, unload_answer = in_thread(lambda: post(url, "/v2/repository/models/stream/unload"))
            until(lambda: httpx.get(f"{url}/v2/models/stream/ready").status_code == 503, "the unload did not begin")
            assert post(url, "/stream").status_code == 503
            gates.release.set()
            assert "".join(chunks) == "last\n"
        unloading.join(PATIENCE)
        assert unload_answer[0].status_code == 200
        assert post(url, "/v2/repository/models/stream/load").status_code == 200
        assert post(url, "/stream").text == "first\nlast\n"


def test_a_load_that_fails_then_succeeds(project: Path, gates: Gates) -> None:
    with serving(project) as (url, _, _app):
        assert post(url, "/v2/repository/models/gated/unload").status_code == 200
        gates.fail_load = True
        failed = post(url, "/v2/repository/models/gated/load")
        assert failed.status_code == 400 and "told to fail" in failed.json()["error"]
        state, reason = index(url)["gated"]
        assert state == "UNAVAILABLE" and "told to fail" in reason
        refused = post(url, "/gated")
        assert refused.status_code == 503 and "failed to load" in refused.json()["error"]
        gates.fail_load = False
        assert post(url, "/v2/repository/models/gated/load").status_code == 200
        assert index(url)["gated"] == ("READY", "")
        assert httpx.get(f"{url}/readyz").status_code == 200


async def _burst(url: str, cycles: int) -> tuple[Counter[int], list[str]]:
    """Calls of `quick` from 8 clients (natively and over V2) while it is unloaded and loaded `cycles` times, and
    loads and unloads of it sent together; what each answer was, and any that broke the rules."""
    answers: Counter[int] = Counter()
    broken: list[str] = []
    done = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=PATIENCE) as client:

        async def control() -> None:
            for cycle in range(cycles):
                actions = ["unload", "load"] if cycle % 2 else ["load", "unload", "load"]
                sent = [client.post(f"/v2/repository/models/quick/{action}") for action in actions]
                for answer in await asyncio.gather(*sent):
                    if answer.status_code != 200:
                        broken.append(f"{answer.request.url.path}: {answer.status_code} {answer.text}")
                # whichever came last, the index, the model's readiness and the server's agree
                state = {entry["name"]: entry for entry in (await client.post("/v2/repository/index")).json()}
                ready = (await client.get("/v2/models/quick/ready")).status_code
                readyz = (await client.get("/readyz")).status_code
                if (state["quick"]["state"], ready, readyz) not in {("READY", 200, 200), ("UNAVAILABLE", 503, 200)}:
                    broken.append(f"cycle {cycle}: {state['quick']}, ready {ready}, /readyz {readyz}")
            done.set()

        async def calls(n: int) -> None:
            body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
            for _ in range(40):
                if done.is_set():
                    return
                if n % 2:
                    answer = await client.post("/quick", json={})
                else:
                    answer = await client.post("/v2/models/quick/infer", json=body)
                answers[answer.status_code] += 1
                if answer.status_code == 200:
                    continue
                error = answer.json().get("error", "") if answer.status_code == 503 else ""
                if not error.startswith("api 'quick' is"):
                    broken.append(f"{answer.status_code} {answer.text}")

        await asyncio.gather(control(), *(calls(n) for n in range(8)))
    return answers, broken


def test_calls_beside_repeated_loads_and_unloads(project: Path) -> None:
    with serving(project) as (url, _, _app):
        answers, broken = asyncio.run(_burst(url, 20))
        assert not broken
        assert set(answers) <= {200, 503} and answers[200]
        assert post(url, "/v2/repository/models/quick/load").status_code == 200
        assert index(url)["quick"] == ("READY", "")
        assert httpx.get(f"{url}/v2/models/quick/ready").status_code == 200
        assert httpx.get(f"{url}/readyz").status_code == httpx.get(f"{url}/v2/health/ready").status_code == 200
        assert post(url, "/quick").json() == {"done": True}
