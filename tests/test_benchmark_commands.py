"""Every ``python benchmarks/<script>.py ...`` line of the docs (benchmarks/README.md and docs/*.md) names a
script that exists and options that script takes (its ``--help``): the benchmarks are run by hand, from these
lines, so a renamed or dropped option would otherwise surface only when someone copies one."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import cache

import pytest

from tests.conftest import REPO

PAGES = [REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMMAND = re.compile(r"^\s*python benchmarks/(\w+)\.py(.*)$")


def commands() -> list[tuple[str, str, list[str]]]:
    """(page, script, options) of every documented command line."""
    found = []
    for page in PAGES:
        lines = iter(page.read_text(encoding="utf-8").splitlines())
        for line in lines:
            match = COMMAND.match(line)
            if match is None:
                continue
            text = match.group(2)
            while text.endswith("\\"):  # continued on the next line
                text = text[:-1] + " " + next(lines, "")
            words = shlex.split(text, comments=True)
            options = [word.split("=", 1)[0] for word in words if word.startswith("--")]
            found.append((page.relative_to(REPO).as_posix(), match.group(1), options))
    return found


@cache
def usage(script: str) -> str:
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / f"{script}.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_docs_show_benchmark_commands() -> None:
    assert len({script for _, script, _ in commands()}) >= 10


@pytest.mark.parametrize(
    ("page", "script", "options"), commands(), ids=lambda value: value if isinstance(value, str) else None
)
def test_each_documented_benchmark_command_uses_options_its_script_takes(
    page: str, script: str, options: list[str]
) -> None:
    assert (REPO / "benchmarks" / f"{script}.py").is_file(), f"{page}: no benchmarks/{script}.py"
    text = usage(script)
    missing = [option for option in options if not re.search(rf"{re.escape(option)}\b", text)]
    assert not missing, f"{page}: benchmarks/{script}.py takes no {', '.join(missing)}"
