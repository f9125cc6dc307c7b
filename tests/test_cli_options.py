"""The command line's options, through `python -m modelserve`: every number range-checked by argparse (exit 2
and a ``modelserve: error:`` line, never a traceback), and every path read against the folder the command ran
in, before the project folder becomes the working directory."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelserve.cli import build_parser, path
from tests.conftest import REPO, Server, free_port, write_project

MODEL = """
class Model:
    def predict(self, inputs):
        return inputs
"""


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelserve", *args], capture_output=True, text=True, timeout=60, cwd=str(cwd)
    )


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--port", "99999", "an integer from 1 to 65535"),
        ("--port", "-1", "an integer from 1 to 65535"),
        ("--port", "0", "an integer from 1 to 65535"),
        ("--port", "not-a-number", "an integer from 1 to 65535"),
        ("--workers", "0", "an integer of at least 1"),
        ("--workers", "1.5", "an integer of at least 1"),
        ("--graceful-timeout", "-5", "a number of seconds of at least 0"),
        ("--graceful-timeout", "nan", "a number of seconds of at least 0"),
        ("--graceful-timeout", "inf", "a number of seconds of at least 0"),
        ("--max-header-size", "0", "an integer of at least 1"),
        ("--header-timeout", "0", "a number of seconds above 0"),
        ("--body-timeout", "-1", "a number of seconds above 0"),
        ("--refusal-pause", "1.5", "a number of seconds from 0 to 1"),
        ("--refusal-pause", "-0.1", "a number of seconds from 0 to 1"),
    ],
)
def test_a_number_out_of_range_exits_2_naming_the_option(
    tmp_path: Path, option: str, value: str, expected: str
) -> None:
    root = write_project(tmp_path / "project", {"model.py": MODEL})
    result = run_cli(str(root), option, value)
    assert result.returncode == 2, result.stderr
    assert f"modelserve: error: argument {option}: expected {expected}, got {value!r}" in result.stderr
    assert "Traceback" not in result.stderr


def test_every_numeric_option_is_range_checked() -> None:
    """An option added later with a bare ``type=int`` or ``type=float`` would take any number: refused here."""
    numeric = [
        action
        for action in build_parser()._actions
        if isinstance(action.default, (int, float)) and not isinstance(action.default, bool)
    ]
    assert {action.dest for action in numeric} >= {"port", "workers", "graceful_timeout", "max_header_size"}
    for action in numeric:
        assert getattr(action.type, "__qualname__", "") == "number.<locals>.parse", action.dest
        parse = action.type
        assert callable(parse)
        parse(str(action.default))  # the default itself is in range


@pytest.mark.parametrize("value", ["1", "65535"])
def test_the_bounds_themselves_are_accepted(value: str) -> None:
    args = build_parser().parse_args(["project", "--port", value, "--refusal-pause", "0", "--graceful-timeout", "0"])
    assert args.port == int(value) and args.refusal_pause == 0 and args.graceful_timeout == 0


def test_paths_are_absolute_against_the_folder_of_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(
        ["project", "--secrets-dir", "secrets", "--ssl-certfile", "tls/cert.pem", "--ssl-keyfile", "../key.pem"]
    )
    assert args.project_dir == str(tmp_path / "project")
    assert args.secrets_dir == str(tmp_path / "secrets")
    assert args.ssl_certfile == str(tmp_path / "tls" / "cert.pem")
    assert args.ssl_keyfile == str(tmp_path.parent / "key.pem")
    with pytest.raises(argparse.ArgumentTypeError, match="expected a path"):
        path("")


class ServerIn(Server):
    """A `python -m modelserve` whose arguments are relative to `cwd` (conftest's `Server` runs in the repo)."""

    def __init__(self, cwd: Path, *args: str, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"server-{self.port}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "modelserve", *args, "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=str(cwd),
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )


@pytest.mark.slow
def test_a_relative_secrets_dir_is_read_from_the_folder_of_the_command(tmp_path: Path) -> None:
    write_project(
        tmp_path / "project",
        {
            "model.py": """
                class Model:
                    def __init__(self, secrets):
                        self.secrets = secrets

                    def predict(self, inputs):
                        return self.secrets["token"]
            """,
            "modelserve.yaml": "apis: [{name: s, handler: {path: model.py}, secrets: [token]}]\n",
        },
    )
    write_project(tmp_path / "secrets", {"token": "from-the-secrets-dir\n"})
    server: Any = ServerIn(tmp_path, "project", "--secrets-dir", "secrets", log_dir=tmp_path)
    try:
        server.wait_ready()
        assert httpx.post(server.url + "/s", json=1).json() == "from-the-secrets-dir"
    finally:
        assert server.stop() == 0
