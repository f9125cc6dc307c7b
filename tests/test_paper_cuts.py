"""The paper cuts a newcomer hits (issue #16, item 6): --version, a port in use, where a YAML or syntax error
is, each load error once, keys that do not apply, a format that contradicts the path, serve() from a plain
script, create_app after create_app."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import modelserve
from modelserve.config import load_project_config
from modelserve.errors import ConfigError
from tests.conftest import REPO, free_port, write_project

MODEL = "class Model:\n    def predict(self, inputs):\n        return inputs\n"


def run_cli(*args: str, cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelserve", *args], capture_output=True, text=True, timeout=timeout, cwd=str(cwd)
    )


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"modelserve {modelserve.__version__}"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_exits_4_naming_the_address(workers: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_cli("examples/iris", "--port", str(port), "--workers", workers)
    assert result.returncode == 4, result.stderr
    assert f"modelserve: error: cannot listen on 127.0.0.1:{port}: Address already in use" in result.stderr
    assert "is ready" not in result.stderr  # refused before any model loads


def test_a_host_that_does_not_resolve_exits_4() -> None:
    result = run_cli("examples/iris", "--host", "no-such-host.invalid", "--port", str(free_port()))
    assert result.returncode == 4, result.stderr
    assert "modelserve: error: cannot listen on no-such-host.invalid:" in result.stderr


# --------------------------------------------------------------------------------------------------
# where the error is


def test_a_yaml_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p", {"model.py": MODEL, "modelserve.yaml": "apis:\n  - name: a\n   kind: x\n"})
    result = run_cli(str(root))
    assert result.returncode == 2
    assert f"modelserve: error: {root / 'modelserve.yaml'}, line 3, column 4: not valid YAML" in result.stderr
    assert "<unicode string>" not in result.stderr


@pytest.mark.parametrize("name", ["cortex.yaml", "config.yaml"])
def test_yaml_errors_of_cortex_and_truss_files_name_the_line(tmp_path: Path, name: str) -> None:
    root = write_project(tmp_path / "p", {name: "- name: a\n  kind: [RealtimeAPI\n", "model/model.py": MODEL})
    with pytest.raises(ConfigError) as info:
        load_project_config(root)
    assert f"{root / name}, line 3, column 1: not valid YAML" in str(info.value)
    assert "<unicode string>" not in str(info.value)


def test_a_syntax_error_names_the_users_file_and_line_once(tmp_path: Path) -> None:
    root = write_project(tmp_path / "p", {"model.py": "import os\n\nclass Model:\n    def predict(self, x)\n"})
    result = run_cli(str(root), "--port", str(free_port()))
    assert result.returncode == 3
    assert "SyntaxError: expected ':' (model.py, line 4)" in result.stderr
    assert "frozen importlib" not in result.stderr
    assert result.stderr.count("SyntaxError") == 1


def test_a_load_error_is_printed_once(tmp_path: Path) -> None:
    source = "class Model:\n    def load(self):\n        raise ValueError('no weights')\n\n" + MODEL.split("\n", 1)[1]
    root = write_project(tmp_path / "p", {"model.py": source})
    result = run_cli(str(root), "--port", str(free_port()))
    assert result.returncode == 3
    assert result.stderr.count("no weights") == 1, result.stderr
    assert "modelserve: error:" in result.stderr


# --------------------------------------------------------------------------------------------------
# keys that do not apply


@pytest.mark.parametrize(
    "api, problem",
    [
        ("handler: {path: model.py}\n    result_ttl: 60", "key 'result_ttl' applies to async APIs only"),
        (
            "kind: async\n    handler: {path: model.py}\n    batching: {max_batch_size: 4}",
            "key 'batching' applies to a Model class or a model file, not to an async Handler class",
        ),
        (
            "model: {path: m.onnx}\n    handler: {path: model.py, class: Handler}\n    batching: {}",
            "key 'batching' applies to a Model class or a model file, not to a handler class",
        ),
        ("kind: async\n    handler: {path: model.py}\n    secrets: [token]", "key 'secrets' is given to a Model class"),
        ("model: {path: m.onnx}\n    data_dir: data", "key 'data_dir' is given to a Model class"),
        ("model: {path: m.onnx, signature_key: serve}", "key 'signature_key' applies to tensorflow models"),
        (
            "model: {path: m.onnx, inline_threshold_ms: 0}\n    handler: {path: model.py, class: Handler}",
            "key 'inline_threshold_ms' applies to a model file",
        ),
        ("model: {path: m.onnx, format: onnx, providers: [CPUExecutionProvider]}\n    result_ttl: 5", "result_ttl"),
    ],
)
def test_keys_that_do_not_apply_to_the_api_are_refused(tmp_path: Path, api: str, problem: str) -> None:
    root = write_project(
        tmp_path / "p", {"model.py": MODEL, "m.onnx": "", "modelserve.yaml": f"apis:\n  - name: a\n    {api}\n"}
    )
    with pytest.raises(ConfigError, match="api 'a'") as info:
        load_project_config(root)
    assert problem in str(info.value)


def test_keys_that_apply_are_accepted(tmp_path: Path) -> None:
    yaml = """
        apis:
          - name: jobs
            kind: async
            handler: {path: model.py}
            result_ttl: 60
          - name: model
            handler: {path: model.py}
            batching: {max_batch_size: 4}
            secrets: [token]
            data_dir: data
          - name: onnx
            model: {path: m.onnx, providers: [CPUExecutionProvider]}
            batching: {max_batch_size: 4}
    """
    root = write_project(tmp_path / "p", {"model.py": MODEL, "m.onnx": "", "modelserve.yaml": yaml})
    assert [api.name for api in load_project_config(root).apis] == ["jobs", "model", "onnx"]


def test_a_format_that_contradicts_the_path_is_refused_before_tensorflow_is_imported(tmp_path: Path) -> None:
    write_project(
        tmp_path / "p", {"modelserve.yaml": "apis:\n  - name: m\n    model: {path: m.onnx, format: tensorflow}\n"}
    )
    (tmp_path / "p" / "m.onnx").write_bytes(b"")
    script = textwrap.dedent(
        f"""
        import sys
        from modelserve.cli import main
        code = main([{str(tmp_path / "p")!r}, "--port", "{free_port()}"])
        print("exit", code, "tensorflow imported:", "tensorflow" in sys.modules)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert "exit 2 tensorflow imported: False" in result.stdout, result.stdout + result.stderr
    assert "key 'format': 'tensorflow' contradicts the path 'm.onnx', which is a onnx model" in result.stderr


# --------------------------------------------------------------------------------------------------
# serve() and create_app() from Python


def test_serve_with_workers_runs_from_a_plain_script_with_a_relative_path(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "examples").symlink_to(REPO / "examples")
    script = tmp_path / "plain.py"
    script.write_text(f'import modelserve\nmodelserve.serve("examples/iris", port={port}, workers=2)\n')
    process = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.communicate()[1]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "not ready within 60 s"
            time.sleep(0.1)
        row = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
        assert httpx.post(f"http://127.0.0.1:{port}/iris", json=row).json()["label"] == "setosa"
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "Child process" not in stderr and "died" not in stderr  # the workers did not crash-loop


def test_create_app_resolves_a_relative_path_against_the_callers_folder_every_time(monkeypatch: Any) -> None:
    monkeypatch.chdir(REPO)
    first = modelserve.create_app("examples/iris")
    second = modelserve.create_app("examples/iris")  # the first made examples/iris the working directory
    third = modelserve.create_app("examples/iris-onnx")
    assert first.server.project.root == second.server.project.root == REPO / "examples" / "iris"
    assert third.server.project.root == REPO / "examples" / "iris-onnx"
