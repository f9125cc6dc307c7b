"""What to install, said the same way everywhere (`modelserve.errors.install_hint`): the command that works from a
clone today, and the one that will work once modelserve is on the package index. Through the command line with
the package hidden, through a real server for ``/docs``, and over the docs and examples people copy from."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from modelserve.errors import install_hint
from tests.conftest import REPO, free_port, write_project

MODEL = "class Model:\n    def predict(self, inputs):\n        return inputs\n"
TYPED = "class Model:\n    def predict(self, x: list[float]) -> list[float]:\n        return x\n"


def test_the_hint_names_both_forms() -> None:
    assert install_hint("onnx") == (
        'pip install -e ".[onnx]" in a clone of modelserve (pip install "modelserve[onnx]" once it is published)'
    )
    assert 'pip install --force-reinstall -e ".[redis]"' in install_hint("redis", reinstall=True)
    assert 'pip install --force-reinstall "modelserve[redis]"' in install_hint("redis", reinstall=True)


def cli_without(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`modelserve.cli.main(args)` in a new interpreter where `module` cannot be imported."""
    code = (
        f"import sys; sys.modules[{module!r}] = None\nfrom modelserve.cli import main\nsys.exit(main({list(args)!r}))"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)


@pytest.mark.parametrize(
    ("module", "extra", "files", "args"),
    [
        ("onnxruntime", "onnx", {"modelserve.yaml": "apis: [{name: m, model: {path: m.onnx}}]\n", "m.onnx": ""}, []),
        ("pydantic", "schema", {"model.py": TYPED}, []),
        (
            "redis",
            "redis",
            {
                "model.py": "class Handler:\n    def handle_async(self, payload):\n        return payload\n",
                "modelserve.yaml": "apis: [{name: a, kind: async, handler: {path: model.py}}]\n",
            },
            ["--jobs-store", "redis://127.0.0.1:1/0"],
        ),
        (
            "opentelemetry",
            "tracing",
            {"model.py": MODEL, "modelserve.yaml": "tracing: true\napis: [{name: m, handler: {path: model.py}}]\n"},
            [],
        ),
    ],
)
def test_a_missing_extra_exits_3_with_both_commands(
    tmp_path: Path, module: str, extra: str, files: dict[str, str], args: list[str]
) -> None:
    root = write_project(tmp_path / "project", files)
    result = cli_without(module, str(root), "--port", str(free_port()), *args)
    assert result.returncode == 3, result.stderr
    assert f"Install it with: {install_hint(extra)}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_docs_without_swagger_ui_names_both_commands(tmp_path: Path) -> None:
    root = write_project(tmp_path / "project", {"model.py": MODEL})
    port = free_port()
    code = (
        "import sys; sys.modules['swagger_ui_bundle'] = None\n"
        "from modelserve.cli import run\n"
        f"sys.argv = ['modelserve', {str(root)!r}, '--port', '{port}']\n"
        "run()\n"
    )
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None and time.monotonic() < deadline
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/docs", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        assert answer.status_code == 404
        assert install_hint("schema") in answer.json()["error"]
    finally:
        process.terminate()
        process.wait(30)


PAGES = sorted([*REPO.glob("docs/*.md"), *REPO.glob("examples/*/README.md")])


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_published_form_in_the_docs_comes_with_the_clone_form(page: Path) -> None:
    """`pip install "modelserve[x]"` does not work yet: a page that shows it shows `pip install -e ".[x]"` too."""
    text = page.read_text(encoding="utf-8")
    for extra in re.findall(r'pip install "modelserve\[([a-z,-]+)\]"', text):
        assert f'pip install -e ".[{extra}]"' in text, f"{page.relative_to(REPO)}: {extra}"


def test_the_package_builds_every_hint_with_the_helper() -> None:
    command = re.compile(r'pip install[^\n]*"modelserve\[')
    for source in (REPO / "modelserve").rglob("*.py"):
        if source.name != "errors.py":
            found = command.search(source.read_text(encoding="utf-8"))
            assert found is None, f"{source.relative_to(REPO)}: build the hint with modelserve.errors.install_hint"
