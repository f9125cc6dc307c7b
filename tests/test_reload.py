"""``--reload`` keeps answering: a saved mistake is a 503 naming it (file and line) until the file is fixed
(real servers; modelserve/_reload.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from uvicorn.supervisors.basereload import BaseReload
from uvicorn.supervisors.watchfilesreload import WatchFilesReload

from modelserve._reload import ProjectReload
from tests.conftest import write_project

MODEL = "class Model:\n    def predict(self, inputs):\n        return {answer}\n"
BROKEN = "class Model:\n    def predict(self, inputs)\n        return 0\n"


def answer_until(server: Any, wanted: int, timeout: float = 30) -> httpx.Response:
    """POST /model until its status is `wanted` (the worker restarts after a saved change)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            reply = httpx.post(server.url + "/model", json={}, timeout=5)
            if reply.status_code == wanted:
                return reply
        except httpx.TransportError:
            pass  # the worker is restarting
        assert time.monotonic() < deadline, f"no {wanted} within {timeout} s:\n{server.log}"
        time.sleep(0.1)


def test_a_syntax_error_answers_503_naming_it_until_the_file_is_fixed(tmp_path: Path, start_server: Any) -> None:
    root = write_project(tmp_path / "p", {"model.py": MODEL.format(answer=1)})
    server = start_server(root, "--reload")
    server.wait_ready()
    assert httpx.post(server.url + "/model", json={}).json() == 1

    (root / "model.py").write_text(BROKEN)
    reply = answer_until(server, 503)
    error = reply.json()["error"]
    assert "SyntaxError" in error and "(model.py, line 2)" in error, error
    assert reply.headers["retry-after"] == "1"
    assert httpx.get(server.url + "/readyz").status_code == 503
    assert httpx.get(server.url + "/healthz").status_code == 200  # the process is alive and waiting for a fix

    (root / "model.py").write_text(MODEL.format(answer=2))
    assert answer_until(server, 200).json() == 2
    assert server.stop() == 0


def test_a_bad_modelserve_yaml_answers_503_naming_the_line_then_recovers(tmp_path: Path, start_server: Any) -> None:
    config = "apis:\n  - name: model\n    handler: {path: model.py, class: Model}\n"
    root = write_project(tmp_path / "p", {"model.py": MODEL.format(answer=1), "modelserve.yaml": config})
    server = start_server(root, "--reload")
    server.wait_ready()

    (root / "modelserve.yaml").write_text("apis:\n  - name: model\n   handler: {path: model.py}\n")
    error = answer_until(server, 503).json()["error"]
    assert "modelserve.yaml, line 3, column 4: not valid YAML" in error, error

    (root / "modelserve.yaml").write_text(config)
    assert answer_until(server, 200).json() == 1


def test_an_import_error_answers_503_naming_the_users_line(tmp_path: Path, start_server: Any) -> None:
    root = write_project(tmp_path / "p", {"model.py": MODEL.format(answer=1)})
    server = start_server(root, "--reload")
    server.wait_ready()
    (root / "model.py").write_text("import no_such_module_here\n" + MODEL.format(answer=1))
    error = answer_until(server, 503).json()["error"]
    assert "ModuleNotFoundError" in error and "(model.py, line 1)" in error, error


def test_the_reloader_is_built_on_uvicorns_public_base_reload() -> None:
    assert issubclass(ProjectReload, BaseReload) and not issubclass(ProjectReload, WatchFilesReload)
    assert "should_restart" in vars(ProjectReload)
