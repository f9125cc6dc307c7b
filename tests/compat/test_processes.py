"""Model files imported so that pickling works, and the processes a model starts stopped with the server.

truss-examples' `multiprocessing` (tests/data/truss/multiprocessing, byte for byte) sends a method of a class
defined in model/model.py to a ``ProcessPoolExecutor`` in its preprocess: the pool pickles it by its module's
name, which must be importable (``model.model``, as Truss names it). torch is a stand-in (tests/stand_ins.py)
in the truss's packages/ folder.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, write_project
from tests.stand_ins import TORCH, write

pytestmark = pytest.mark.slow

DATA = Path(__file__).parents[1] / "data" / "truss"


def children_of(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.update(int(child) for child in (task / "children").read_text().split())
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids: set[int], timeout: float = 15) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    return {pid for pid in pids if alive(pid)}


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the server's children from /proc")
def test_truss_multiprocessing_preprocess_runs_in_a_process_pool_and_its_workers_stop_with_the_server(
    tmp_path: Path, start_server: Any
) -> None:
    root = tmp_path / "multiprocessing"
    shutil.copytree(DATA / "multiprocessing", root)
    write(root / "packages", TORCH)
    server = start_server(root)
    server.wait_ready()
    answer = httpx.post(f"{server.url}/", json={"n": 8}, timeout=30)
    assert answer.status_code == 200, server.log
    assert isinstance(answer.json()["predictions"], float)
    workers = children_of(server.process.pid)
    assert workers, "the pool's workers are the server's children"
    assert server.stop() == 0
    assert wait_gone(workers) == set(), server.log
    assert "stopping" in server.log and "process(es) its code started" in server.log


def test_a_subprocess_that_a_model_starts_is_stopped_with_the_server(tmp_path: Path, start_server: Any) -> None:
    """Not only multiprocessing's children: a helper process started with subprocess (as Truss models start
    vLLM or a server of their own) is the server's child too, and ends with it."""
    root = write_project(
        tmp_path / "p",
        {
            "model.py": f"""
            import subprocess
            import sys


            class Model:
                def load(self):
                    self.helper = subprocess.Popen([{sys.executable!r}, "-c", "import time; time.sleep(600)"])

                def predict(self, x):
                    return self.helper.pid
            """,
        },
    )
    server = start_server(root)
    server.wait_ready()
    helper = httpx.post(f"{server.url}/", json=1).json()
    assert helper in children_of(server.process.pid)
    assert server.stop() == 0
    assert wait_gone({helper}) == set(), server.log


def test_only_children_started_after_loading_began_are_stopped(tmp_path: Path) -> None:
    """An embedding program's own processes (started before the app loads, or not by multiprocessing outside
    the modelserve command) are left alone."""
    script = """
import multiprocessing, subprocess, sys, time
from starlette.testclient import TestClient
import modelserve

before = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
app = modelserve.create_app(sys.argv[1])
with TestClient(app) as client:
    client.portal.call(app.server.wait_loaded)
    worker = client.post("/", json=1).json()
    after = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print(before.poll(), after.poll(), multiprocessing.active_children())
before.kill(); after.kill()
"""
    root = write_project(
        tmp_path / "p",
        {
            "model.py": """
            import multiprocessing
            import time


            class Model:
                def load(self):
                    self.worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
                    self.worker.start()

                def predict(self, x):
                    return self.worker.pid
            """,
        },
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(root)], capture_output=True, text=True, cwd=str(REPO), timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["None", "None", "[]"]  # the program's own run on; the model's worker is gone


# --------------------------------------------------------------------------------------------------
# the names project files are imported under


def test_a_truss_model_file_is_model_model_with_its_package(tmp_path: Path) -> None:
    root = write_project(
        tmp_path / "truss",
        {"model/__init__.py": "PACKAGE = True\n", "model/model.py": "class Helper:\n    pass\n"},
    )
    script = """
import pickle, sys
from pathlib import Path
from modelserve.project import import_file
module = import_file(Path(sys.argv[1]), "model/model.py")
assert module.__name__ == "model.model", module.__name__
assert sys.modules["model"].PACKAGE and sys.modules["model"].model is module
assert type(pickle.loads(pickle.dumps(module.Helper()))) is module.Helper
import model.model
assert model.model is module
"""
    result = subprocess.run([sys.executable, "-c", script, str(root)], capture_output=True, text=True, cwd=str(REPO))
    assert result.returncode == 0, result.stderr


def test_a_file_whose_name_is_taken_gets_a_package_of_the_project(tmp_path: Path) -> None:
    """`json.py` in a project cannot be `json`: it gets a name under a package of its own, still picklable."""
    from modelserve.project import import_file

    root = write_project(tmp_path / "p", {"json.py": "class Helper:\n    pass\n"})
    module = import_file(root, "json.py")
    assert module.__name__.startswith("modelserve_project_") and module.__name__.endswith(".json")
    assert type(pickle.loads(pickle.dumps(module.Helper()))) is module.Helper
    import json

    assert json.dumps([1]) == "[1]"  # the standard library's json is untouched


def test_a_stray_child_is_killed_when_it_ignores_sigterm(tmp_path: Path, start_server: Any) -> None:
    root = write_project(
        tmp_path / "p",
        {
            "model.py": """
            import multiprocessing
            import signal
            import time


            def stubborn():
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                time.sleep(600)


            class Model:
                def load(self):
                    self.worker = multiprocessing.Process(target=stubborn)
                    self.worker.start()

                def predict(self, x):
                    return self.worker.pid
            """,
        },
    )
    server = start_server(root)
    server.wait_ready()
    pid = httpx.post(f"{server.url}/", json=1).json()
    server.stop(signal.SIGTERM, timeout=60)
    assert wait_gone({pid}) == set(), server.log
    assert "did not exit on SIGTERM; killed" in server.log
    assert os.getpid() != pid
