"""The README's snippets run as written (issue #16: the "Using it from Python" snippet failed)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import textwrap
from typing import Any

import httpx

from tests.conftest import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def test_using_it_from_python_runs_as_written_from_the_repository() -> None:
    (snippet,) = blocks(section("Using it from Python"), "python")
    check = textwrap.dedent(
        """
        from starlette.testclient import TestClient

        row = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
        with TestClient(parent) as client:
            mounted = parent.routes[0].app  # a mounted app loads on its first request; wait_loaded waits for it
            client.portal.call(mounted.server.wait_loaded)
            answer = client.post("/ml/iris", json=row)
            assert answer.status_code == 200, answer.text
            assert answer.json()["label"] == "setosa"
        with TestClient(app) as client:
            client.portal.call(app.server.wait_loaded)  # loading starts with the lifespan; /readyz says when done
            assert client.post("/echo", json={"a": 1}).json() == {"a": 1}
        print("snippet ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", snippet + check], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "snippet ok" in result.stdout


def test_a_project_folder_serves_as_the_readme_shows(start_server: Any) -> None:
    commands = blocks(section("A project folder"), "bash")[0].replace("\\\n", " ").splitlines()
    serve = shlex.split(commands[0])
    assert serve[:3] == ["python", "-m", "modelserve"]
    curl = shlex.split(commands[1])
    url, body = curl[curl.index("-X") + 2], json.loads(curl[curl.index("-d") + 1])
    server = start_server(REPO / serve[3])
    server.wait_ready()
    answer = httpx.post(url.replace("http://127.0.0.1:8888", server.url), json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["label"] == "setosa"


def test_the_install_section_shows_how_to_install_from_a_clone() -> None:
    install = section("Install")
    assert 'pip install -e ".[dev]"' in install and "pip install -e ." in install
    assert "not on the package index" in install  # `pip install modelserve` is not shown as if it worked
