"""Loading a project: one line per API when it starts and when it is ready (or failed), the APIs loading
concurrently, and ``/readyz`` telling each API's state."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelserve.config import ApiConfig, HandlerConfig, ProjectConfig
from modelserve.errors import LoadError
from modelserve.server import ModelServer
from tests.conftest import REPO, free_port, write_project

# The slow API's load() reads a named pipe: it returns when the test writes to it (an event the test holds,
# across the process boundary), and records what the process looked like while it loaded.
MODEL = """
    import json
    import os
    import sys


    class Fast:
        def load(self):
            with open("data.json") as file:  # relative: the project folder is the working directory
                self.data = json.load(file)

        def predict(self, inputs):
            return {"fast": self.data["answer"]}


    class Slow:
        def load(self):
            with open(os.environ["GATE"]) as gate:
                gate.read()
            with open("data.json") as file:
                self.data = json.load(file)
            self.seen = {"cwd": os.getcwd(), "flag": os.environ.get("SLOW_FLAG"), "path": sys.path[:3]}

        def predict(self, inputs):
            return {"slow": self.data["answer"], "seen": self.seen}
"""

CONFIG = """
    apis:
      - name: slow
        handler: {path: model.py, class: Slow}
      - name: fast
        handler: {path: model.py, class: Fast}
"""


def readyz(url: str) -> httpx.Response:
    return httpx.get(url + "/readyz", timeout=5)


def until(check: Any, what: str, timeout: float = 30) -> Any:
    """The first truthy answer of `check()` within `timeout` seconds (a deadline, not a measurement)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = check()
        if answer:
            return answer
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout} s: {what}")


def test_a_fast_api_serves_while_a_slow_one_loads(tmp_path: Path, start_server: Any) -> None:
    root = write_project(tmp_path / "p", {"model.py": MODEL, "modelserve.yaml": CONFIG, "data.json": '{"answer": 42}'})
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    server = start_server(root, env={"GATE": str(gate), "SLOW_FLAG": "from-env"})
    server.wait_listening()

    fast = until(lambda: httpx.post(server.url + "/fast", json={}, timeout=5).status_code == 200, "fast ready")
    assert fast
    assert httpx.post(server.url + "/fast", json={}, timeout=5).json() == {"fast": 42}
    waiting = readyz(server.url)  # the slow API is still held at its gate: nothing released it yet
    assert waiting.status_code == 503
    assert waiting.json()["apis"] == {"slow": "loading", "fast": "ready"}
    assert waiting.json()["error"] == "loading: slow"
    refused = httpx.post(server.url + "/slow", json={}, timeout=5)
    assert refused.status_code == 503 and "loading" in refused.json()["error"]

    with open(gate, "w") as opened:  # release the slow API's load()
        opened.write("go")
    server.wait_ready()
    ready = readyz(server.url)
    assert ready.status_code == 200
    assert ready.json()["apis"] == {"slow": "ready", "fast": "ready"}
    answer = httpx.post(server.url + "/slow", json={}, timeout=5).json()
    assert answer["slow"] == 42
    assert answer["seen"]["cwd"] == str(root.resolve())
    assert answer["seen"]["flag"] == "from-env"
    assert answer["seen"]["path"][0] == str(root.resolve())
    assert server.stop() == 0

    lines = [line.split(" modelserve: ", 1)[1] for line in server.log.splitlines() if " modelserve: " in line]
    loading = [line for line in lines if "loading" in line or "is ready" in line]
    assert [line.split(" (")[0] for line in loading] == [
        "api 'slow' is loading",
        "api 'fast' is loading",
        "api 'fast' is ready",  # before the slow one: it did not wait behind it
        "api 'slow' is ready",
    ]
    assert loading[0] == "api 'slow' is loading (model_class)"
    assert loading[2].startswith("api 'fast' is ready (loaded in ") and loading[2].endswith(" s)")


BROKEN = """
    class Good:
        def predict(self, inputs):
            return inputs


    class Broken:
        def load(self):
            raise ValueError("no weights here")

        def predict(self, inputs):
            return inputs
"""


def test_an_api_that_fails_to_load_is_named_in_one_error_line(tmp_path: Path) -> None:
    config = """
        apis:
          - name: good
            handler: {path: model.py, class: Good}
          - name: broken
            handler: {path: model.py, class: Broken}
    """
    root = write_project(tmp_path / "p", {"model.py": BROKEN, "modelserve.yaml": config})
    result = subprocess.run(
        [sys.executable, "-m", "modelserve", str(root), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert result.returncode == 3
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    assert "modelserve: api 'broken' failed to load after " in errors[0]
    assert "Broken.load() raised ValueError: no weights here (model.py, line 8)" in errors[0]
    assert result.stderr.count("no weights here") == 1
    assert "api 'broken' is loading (model_class)" in result.stderr


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# In process: the loads overlap (each waits for the other to have started), and a failure stops no other.


class _Meeting:
    """Two loads that each wait until both have started: only loads that overlap ever finish."""

    barrier = threading.Barrier(2, timeout=30)


class First:
    def load(self) -> None:
        _Meeting.barrier.wait()

    def predict(self, inputs: Any) -> Any:
        return "first"


class Second(First):
    def predict(self, inputs: Any) -> Any:
        return "second"


class Failing:
    def load(self) -> None:
        raise RuntimeError("broken weights")

    def predict(self, inputs: Any) -> Any:
        return inputs


def project_of(*classes: type) -> ProjectConfig:
    apis = [ApiConfig(name=cls.__name__.lower(), handler=HandlerConfig(obj=cls)) for cls in classes]
    return ProjectConfig(root=Path.cwd(), apis=apis)


@pytest.mark.anyio
async def test_loads_overlap() -> None:
    _Meeting.barrier.reset()
    server = ModelServer(project_of(First, Second))
    await server.wait_loaded()
    assert server.ready
    assert {name: api.state for name, api in server.apis.items()} == {"first": "ready", "second": "ready"}
    await server.close()


@pytest.mark.anyio
async def test_a_failure_leaves_the_other_apis_loading() -> None:
    _Meeting.barrier.reset()
    failures: list[LoadError] = []
    server = ModelServer(project_of(Failing, First, Second), on_load_error=failures.append)
    await server.wait_loaded()
    assert len(failures) == 1 and "broken weights" in str(failures[0])
    states = {name: api.state for name, api in server.apis.items()}
    assert states == {"failing": "failed", "first": "ready", "second": "ready"}
    assert not server.ready
    await server.close()
