"""End to end: `python -m modelserve` on a free loopback port (readiness, backpressure, signals, exit codes,
workers, reload, chaining, a mounted app).

Where a test must know that user code has reached a point, the model blocks on a named pipe (FIFO) in its
project folder: the test's ``open(fifo, "w")`` returns exactly when the model opened it for reading, and
writing releases it. No sleep-polling.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, free_port, write_project

pytestmark = pytest.mark.slow

GATED = """
import asyncio, os

class Model:
    def load(self):
        if os.path.exists("load_gate"):
            with open("load_gate") as gate:  # blocks until the test opens it for writing
                gate.read()

    def predict(self, inputs):
        if inputs.get("gate"):
            with open("gate") as gate:
                gate.read()
        return {"pid": os.getpid(), "inputs": inputs}
"""


def gated_project(tmp_path: Path, yaml_text: str | None = None, load_gate: bool = False) -> Path:
    files = {"model.py": GATED}
    if yaml_text is not None:
        files["modelserve.yaml"] = yaml_text
    root = write_project(tmp_path / "gated", files)
    os.mkfifo(root / "gate")
    if load_gate:
        os.mkfifo(root / "load_gate")
    return root


class Gate:
    """The writing end of a FIFO the model reads: `wait()` returns once the model is blocked on it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file: Any = None

    def wait(self, timeout: float = 20) -> None:
        fd = _open_writer(self.path, timeout)
        self.file = os.fdopen(fd, "w")

    def release(self) -> None:
        self.file.close()


def _open_writer(path: Path, timeout: float) -> int:
    # os.open(O_WRONLY) blocks until a reader opens the FIFO; run it in a thread to bound the wait.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(os.open, path, os.O_WRONLY)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))  # unblock the thread before failing
            raise


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelserve", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO),
    )


# --------------------------------------------------------------------------------------------------
# readiness, backpressure, timeout


def test_readyz_is_503_while_load_runs_and_healthz_200(tmp_path: Path, start_server: Any) -> None:
    root = gated_project(tmp_path, load_gate=True)
    server = start_server(root)
    load_gate = Gate(root / "load_gate")
    load_gate.wait()  # load() is running
    server.wait_listening()
    assert httpx.get(server.url + "/healthz").status_code == 200
    ready = httpx.get(server.url + "/readyz")
    assert ready.status_code == 503 and ready.headers["retry-after"] == "1"
    assert ready.json()["apis"] == {"model": "loading"}
    answer = httpx.post(server.url + "/model", json={})
    assert answer.status_code == 503 and "loading" in answer.json()["error"]
    assert answer.headers["retry-after"]
    load_gate.release()
    server.wait_ready()
    assert httpx.post(server.url + "/model", json={"x": 1}).json()["inputs"] == {"x": 1}


def test_backpressure_503_with_retry_after(tmp_path: Path, start_server: Any) -> None:
    yaml_text = "apis:\n  - {name: slow, handler: {path: model.py}, max_concurrency: 1, max_queue_length: 1}\n"
    root = gated_project(tmp_path, yaml_text)
    server = start_server(root)
    server.wait_ready()
    gate = Gate(root / "gate")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        running = pool.submit(httpx.post, server.url + "/slow", json={"gate": 1}, timeout=30)
        gate.wait()  # the first request is inside predict and holds the only slot
        # Two more: one waits in the queue (its length is 1), the other is refused while the gate still holds the slot.
        others = [pool.submit(httpx.post, server.url + "/slow", json={"gate": 1, "n": n}, timeout=30) for n in (2, 3)]
        refused = next(concurrent.futures.as_completed(others, timeout=60)).result()
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert set(refused.json()) == {"error", "request_id"}
        assert refused.json()["request_id"] == refused.headers["x-request-id"]
        gate.release()
        assert running.result().status_code == 200
        gate.wait()  # the queued request now runs
        gate.release()
        statuses = sorted(future.result().status_code for future in others)
    assert statuses == [200, 503]


def test_timeout_504(tmp_path: Path, start_server: Any) -> None:
    root = write_project(
        tmp_path / "sleepy",
        {
            "model.py": """
                import asyncio

                class Model:
                    async def predict(self, inputs):
                        await asyncio.sleep(inputs)
                        return "done"
            """,
            "modelserve.yaml": "- {name: sleepy, handler: {path: model.py}, timeout: 0.2}\n",
        },
    )
    server = start_server(root)
    server.wait_ready()
    answer = httpx.post(server.url + "/sleepy", json=3600, timeout=60)  # only the API's timeout answers it
    assert answer.status_code == 504 and "timeout" in answer.json()["error"]
    assert httpx.post(server.url + "/sleepy", json=0).json() == "done"


# --------------------------------------------------------------------------------------------------
# signals and exit codes


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_exit_0_on_a_signal(tmp_path: Path, start_server: Any, sig: int) -> None:
    server = start_server(gated_project(tmp_path))
    server.wait_ready()
    assert server.stop(sig) == 0


def test_sigterm_lets_an_in_flight_request_finish(tmp_path: Path, start_server: Any) -> None:
    root = gated_project(tmp_path)
    server = start_server(root)
    server.wait_ready()
    gate = Gate(root / "gate")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(httpx.post, server.url + "/model", json={"gate": 1, "n": 7}, timeout=30)
        gate.wait()
        server.process.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):
            server.process.wait(0.5)  # it waits for the request
        gate.release()
        answer = in_flight.result()
    assert answer.status_code == 200 and answer.json()["inputs"] == {"gate": 1, "n": 7}
    assert server.wait_exit() == 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--port", "not-a-number"], "modelserve: error: argument --port: expected an integer"),
        (["--workers", "0"], "modelserve: error: argument --workers: expected an integer of at least 1"),
        (["--reload", "--workers", "2"], "cannot be used together"),
        (["--log-level", "loud"], "invalid choice"),
    ],
)
def test_exit_2_for_a_bad_command_line(tmp_path: Path, args: list[str], expected: str) -> None:
    result = run_cli(str(gated_project(tmp_path)), *args)
    assert result.returncode == 2
    assert expected in result.stderr


def test_exit_2_without_arguments() -> None:
    result = run_cli()
    assert result.returncode == 2 and "project_dir" in result.stderr


def test_exit_2_for_a_missing_folder(tmp_path: Path) -> None:
    result = run_cli(str(tmp_path / "nowhere"))
    assert result.returncode == 2
    assert "nowhere" in result.stderr and "does not exist" in result.stderr


def test_exit_2_for_an_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = run_cli(str(tmp_path / "empty"))
    assert result.returncode == 2 and "neither modelserve.yaml nor a model.py" in result.stderr


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("apis: [\n", "modelserve.yaml, line 2, column 1: not valid YAML"),
        ("- {name: echo, handler: {path: model.py}, max_concurrency: two}\n", "key 'max_concurrency'"),
        ("- {name: echo, handler: {path: modle.py}}\n", "file 'modle.py' not found"),
    ],
)
def test_exit_2_for_a_bad_modelserve_yaml(tmp_path: Path, yaml_text: str, expected: str) -> None:
    result = run_cli(str(gated_project(tmp_path, yaml_text)))
    assert result.returncode == 2
    assert "modelserve.yaml" in result.stderr and expected in result.stderr


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "class Model:\n    def __init__(self):\n        raise ValueError('no GPU here')\n"
            "    def predict(self, inputs):\n        return inputs\n",
            ["model.py", "Model", "ValueError: no GPU here"],
        ),
        (
            "class Model:\n    def load(self):\n        open('missing-weights.bin')\n"
            "    def predict(self, inputs):\n        return inputs\n",
            ["model.py", "Model.load()", "FileNotFoundError", "missing-weights.bin"],
        ),
        (
            "class Model:\n    async def load(self):\n        raise RuntimeError('async load failed')\n"
            "    def predict(self, inputs):\n        return inputs\n",
            ["model.py", "Model.load()", "RuntimeError: async load failed"],
        ),
        ("import not_a_module_anywhere\n", ["model.py", "ModuleNotFoundError", "not_a_module_anywhere"]),
        (
            "from starlette.requests import Request\nclass Model:\n"
            "    def predict(self, request: Request, inputs):\n        return inputs\n",
            ["model.py", "Model", "the request must come second"],
        ),
        ("class Other:\n    pass\n", ["model.py", "no class 'Model'", "Other"]),
    ],
    ids=["init", "load", "async-load", "import", "signature", "no-class"],
)
def test_exit_3_when_the_handler_fails_to_load(tmp_path: Path, source: str, expected: list[str]) -> None:
    root = write_project(tmp_path / "broken", {"model.py": source})
    result = run_cli(str(root), "--port", str(free_port()))
    assert result.returncode == 3, result.stderr
    assert "modelserve: error:" in result.stderr, result.stderr
    for part in expected:
        assert part in result.stderr, result.stderr
    error_line = next(line for line in result.stderr.splitlines() if expected[-1] in line)
    assert result.stderr.count(error_line.split(": ", 2)[-1]) == 1, result.stderr  # printed once, not twice


# --------------------------------------------------------------------------------------------------
# workers, reload


def test_two_workers_serve(tmp_path: Path, start_server: Any) -> None:
    root = write_project(
        tmp_path / "workers",
        {
            "model.py": """
                import os, time

                class Model:
                    def predict(self, inputs):
                        time.sleep(0.05)
                        return os.getpid()
            """,
        },
    )
    server = start_server(root, "--workers", "2")
    server.wait_ready(consecutive=20)

    def ask(_: int) -> int:
        with httpx.Client() as client:  # a new connection each time, so that both workers get some
            answer = client.post(server.url + "/model", json={})
            assert answer.status_code == 200
            return int(answer.json())

    # Rounds of 48 until both workers answered (30 s at most): a busy machine may give one worker every
    # connection of a round.
    pids: set[int] = set()
    deadline = time.monotonic() + 30
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        while len(pids) < 2 and time.monotonic() < deadline:
            pids |= set(pool.map(ask, range(48)))
    assert len(pids) == 2 and server.process.pid not in pids
    assert server.stop() == 0


def second_worker_waits(tmp_path: Path) -> tuple[Path, Path]:
    """(project, gate): a Model class whose first worker to load loads at once, the second once `gate` exists."""
    gate = tmp_path / "gate"
    root = write_project(
        tmp_path / "slow",
        {
            "model.py": f"""
                import fcntl, os, time
                from pathlib import Path

                GATE = Path({str(gate)!r})

                class Model:
                    def load(self):
                        self.first = open(GATE.with_name("first"), "a")
                        try:
                            fcntl.flock(self.first, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        except OSError:  # the second worker to load waits for the test
                            while not GATE.exists():
                                time.sleep(0.05)

                    def predict(self, inputs):
                        return os.getpid()
            """,
        },
    )
    return root, gate


def test_with_workers_readyz_waits_for_every_worker(tmp_path: Path, start_server: Any) -> None:
    """Each worker answers /readyz for all of them: 503 while any still loads, since a loading worker answers
    the API's requests 503 (each connection goes to whichever worker takes it). Before, a worker that had
    loaded said 200 while its sibling was still loading."""
    root, gate = second_worker_waits(tmp_path)
    server = start_server(root, "--workers", "2")
    # Until the loaded worker has taken a connection: its /readyz is asked on the connection it answered on.
    seen: list[tuple[int, str]] = []
    deadline = time.monotonic() + 60
    while not seen and time.monotonic() < deadline:
        with httpx.Client() as client:  # a new connection each time
            try:
                answer = client.post(server.url + "/model", json={})
            except httpx.TransportError:  # not listening yet
                time.sleep(0.1)
                continue
            assert answer.status_code in (200, 503), answer.text
            if answer.status_code == 200:
                ready = client.get(server.url + "/readyz")
                seen.append((ready.status_code, ready.json().get("error", "")))
    assert seen == [(503, "loading: 1 of 2 workers have loaded")]

    gate.touch()
    server.wait_ready()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # from now on, no worker answers 503

        def ask(_: int) -> int:
            with httpx.Client() as client:
                return client.post(server.url + "/model", json={}).status_code

        assert set(pool.map(ask, range(48))) == {200}
    assert server.stop() == 0


def test_with_workers_readyz_is_503_while_a_dead_workers_replacement_loads(tmp_path: Path, start_server: Any) -> None:
    """uvicorn starts a worker again when one dies: until the new one has loaded, the survivor's /readyz is 503
    too (the dead worker's note of having loaded is not the new one's)."""
    gate = tmp_path / "gate"
    root = write_project(
        tmp_path / "restarted",
        {
            "model.py": f"""
                import os, time
                from pathlib import Path

                GATE = Path({str(gate)!r})

                class Model:
                    def load(self):
                        while GATE.with_name("hold").exists() and not GATE.exists():  # the test holds it
                            time.sleep(0.05)

                    def predict(self, inputs):
                        return os.getpid()
            """,
        },
    )
    server = start_server(root, "--workers", "2")
    server.wait_ready()
    victim = httpx.post(server.url + "/model", json={}).json()
    (tmp_path / "hold").touch()  # the replacement waits in load() for the gate
    os.kill(victim, signal.SIGKILL)
    errors: set[str] = set()
    deadline = time.monotonic() + 60
    while "loading: 1 of 2 workers have loaded" not in errors and time.monotonic() < deadline:
        try:
            with httpx.Client() as client:  # a new connection each time, so either worker answers
                answer = client.get(server.url + "/readyz")
        except httpx.TransportError:  # taken by the worker as it was killed
            continue
        assert answer.status_code == 503 or not errors, answer.text  # never ready again before the gate opens
        if answer.status_code == 503:
            errors.add(answer.json()["error"])
        time.sleep(0.05)
    assert "loading: 1 of 2 workers have loaded" in errors, errors
    gate.touch()
    server.wait_ready()
    assert victim not in {httpx.post(server.url + "/model", json={}, headers={"connection": "close"}).json()}
    assert server.stop() == 0


def test_reload_restarts_on_a_change_and_ignores_modelserveignore(tmp_path: Path, start_server: Any) -> None:
    model = (
        "import os\nVERSION = {version}\n\n"
        "class Model:\n    def predict(self, inputs):\n        return [VERSION, os.getpid()]\n"
    )
    root = write_project(
        tmp_path / "reloading",
        {
            "model.py": model.format(version=1),
            ".modelserveignore": "data/\n*.log\n",
            "data/cache.txt": "0",
        },
    )
    server = start_server(root, "--reload")
    server.wait_ready()
    version, pid = httpx.post(server.url + "/model", json={}).json()
    assert version == 1

    (root / "data" / "cache.txt").write_text("1")
    (root / "notes.log").write_text("ignored too")
    time.sleep(1.0)  # a restart, had there been one, would have started by now (watchfiles debounces 50 ms)
    assert httpx.post(server.url + "/model", json={}).json() == [1, pid]

    (root / "model.py").write_text(model.format(version=2))
    deadline = time.monotonic() + 30
    answer: list[int] = [1, pid]
    while answer[0] != 2 and time.monotonic() < deadline:
        try:
            reply = httpx.post(server.url + "/model", json={}, timeout=5)
            if reply.status_code == 200:
                answer = reply.json()
        except httpx.TransportError:
            pass  # restarting
        time.sleep(0.1)
    assert answer[0] == 2 and answer[1] != pid
    assert "model.py" in server.log and "cache.txt" not in server.log and "notes.log" not in server.log
    assert server.stop() == 0


# --------------------------------------------------------------------------------------------------
# chaining and a mounted app


CHAIN = """
import os
import httpx

class Double:
    def predict(self, inputs):
        return inputs * 2

class Chain:
    def __init__(self):
        self.client = httpx.AsyncClient(base_url=os.environ["MODELSERVE_URL"])

    async def predict(self, inputs):
        doubled = (await self.client.post("/double", json=inputs)).json()
        return {"doubled": doubled, "url": os.environ["MODELSERVE_URL"]}
"""


CHAIN_YAML = """
apis:
  - {name: double, handler: {path: model.py, class: Double}}
  - {name: chain, handler: {path: model.py, class: Chain}}
"""


def test_chaining_through_modelserve_url(tmp_path: Path, start_server: Any) -> None:
    root = write_project(
        tmp_path / "chain",
        {
            "model.py": CHAIN,
            "modelserve.yaml": CHAIN_YAML,
        },
    )
    server = start_server(root)
    server.wait_ready()
    assert httpx.post(server.url + "/chain", json=21).json() == {"doubled": 42, "url": server.url}


def test_a_mounted_app_under_uvicorn(tmp_path: Path) -> None:
    project = write_project(tmp_path / "chain", {"model.py": CHAIN, "modelserve.yaml": CHAIN_YAML})
    write_project(
        tmp_path / "parent",
        {
            "parent.py": f"""
                import modelserve
                from starlette.applications import Starlette
                from starlette.responses import PlainTextResponse
                from starlette.routing import Mount, Route

                async def home(request):
                    return PlainTextResponse("parent")

                app = Starlette(routes=[Route("/", home), Mount("/ml", app=modelserve.create_app({str(project)!r}))])
            """
        },
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "parent:app", "--app-dir", str(tmp_path / "parent"), "--port", str(port)],
        cwd=str(REPO),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**{k: v for k, v in os.environ.items() if k != "MODELSERVE_URL"}, "PYTHONPATH": str(REPO)},
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/ml/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        assert httpx.get(url + "/").text == "parent"
        assert httpx.post(url + "/ml/double", json=4).json() == 8
        # MODELSERVE_URL learnt from the first request includes the mount prefix, so chaining works.
        assert httpx.post(url + "/ml/chain", json=5).json() == {"doubled": 10, "url": url + "/ml"}
        assert httpx.post(url + "/ml/nope", json=1).status_code == 404
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


def test_examples_iris_gives_the_readme_answer(start_server: Any) -> None:
    readme = (REPO / "examples" / "iris" / "README.md").read_text()
    assert 'pip install -e ".[schema]" && python -m modelserve examples/iris' in readme
    server = start_server(REPO / "examples" / "iris")
    server.wait_ready()
    checked = 0
    for block in readme.split("```bash")[1:]:
        command, _, rest = block.partition("```")
        if "curl" not in command or " -d " not in command:
            continue
        payload = command.split("-d '", 1)[1].split("'", 1)[0]
        expected = rest.split("```json", 1)[1].split("```", 1)[0].strip()
        answer = httpx.post(server.url + "/iris", content=payload, headers={"content-type": "application/json"})
        if '"request_id":"..."' in expected:
            assert answer.status_code == 400
            assert answer.text == expected.replace("...", answer.headers["x-request-id"])
        else:
            assert answer.status_code == 200
            assert answer.text == expected
        checked += 1
    assert checked == 3
