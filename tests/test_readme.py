"""The README and the docs/ pages say what is true: their commands and snippets run as written and answer what
they show, the README stays a newcomer's page, and every page is reachable from the README and the site.

(Issue #16: the "Using it from Python" snippet failed; issue #28: the README's TLS curl sent a body the example
refuses.) Snippets of one feature's page may be run by that feature's tests instead: docs/v2.md's tritonclient
snippet by tests/http/test_v2.py.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import REPO, free_port

README = (REPO / "README.md").read_text(encoding="utf-8")
DOCS = REPO / "docs"


def page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def section(text: str, title: str) -> str:
    """The text under the heading `title` (any level), up to the next heading of the same level or higher;
    lines inside fenced blocks (a `# comment` of a shell or Python snippet) are not headings."""
    lines, inside, start, level = text.splitlines(keepends=True), False, None, 0
    for number, line in enumerate(lines):
        if line.startswith("```"):
            inside = not inside
        heading = None if inside else re.match(r"(#+) (.+)\n?$", line)
        if heading and start is not None and len(heading.group(1)) <= level:
            return "".join(lines[start:number])
        if heading and start is None and heading.group(2) == title:
            start, level = number + 1, len(heading.group(1))
    assert start is not None, f"no heading {title!r}"
    return "".join(lines[start:])


def blocks(text: str, language: str = r"\w*") -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def fenced(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)


def command_lines(block: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and blank lines left out."""
    lines = block.replace("\\\n", " ").splitlines()
    return [line.split("  #", 1)[0].strip() for line in lines if line.strip() and not line.startswith("#")]


def curl_request(command: str, base_url: str) -> httpx.Request:
    """The request a `curl -X POST ... -H ... -d ...` command line sends, aimed at `base_url`."""
    words = shlex.split(command)
    assert words[0] == "curl", command
    method, headers, body, url = "GET", {}, None, None
    position = 1
    while position < len(words):
        word = words[position]
        if word == "-X":
            method, position = words[position + 1], position + 2
        elif word == "-H":
            name, _, value = words[position + 1].partition(":")
            headers[name.strip()] = value.strip()
            position += 2
        elif word == "-d":
            body, method, position = words[position + 1].encode(), "POST" if method == "GET" else method, position + 2
        elif word in ("--cacert", "-o"):
            position += 2
        elif word.startswith("-"):
            position += 1
        else:
            url, position = word, position + 1
    assert url is not None, command
    target = re.sub(r"^https?://[^/]+", base_url, url)
    return httpx.Request(method, target, headers=headers, content=body)


# ------------------------------------------------------------------------------------------------
# the README: a newcomer's first page


def test_the_readme_stays_a_first_page() -> None:
    assert len(README.encode()) < 15_000
    titles = re.findall(r"^## (.+)$", README, flags=re.MULTILINE)
    assert titles[:2] == ["Start here", "A 60-second tour"], titles


def test_start_here_gives_the_venv_and_the_two_commands() -> None:
    setup, commands = (command_lines(block) for block in blocks(section(README, "Start here"), "bash"))
    assert setup == ["python -m venv .venv && source .venv/bin/activate"]
    assert commands == ['pip install -e ".[schema]" && python -m modelserve examples/iris', "bash scripts/test"]
    # The schema extra is what examples/iris needs beyond the core (its model imports pydantic).
    requirements = [requirement.replace('"', "'") for requirement in metadata.requires("modelserve") or []]
    schema = [requirement for requirement in requirements if "extra == 'schema'" in requirement]
    assert any(requirement.startswith("pydantic") for requirement in schema)
    assert "from pydantic import" in (REPO / "examples" / "iris" / "model.py").read_text()
    assert (REPO / "scripts" / "test").is_file()
    assert "not on the package index" in section(README, "Start here")  # `pip install modelserve` is not shown


def tour_steps() -> list[tuple[str, str, str, str]]:
    """(project folder, curl command, answer language, answer) of each project the tour serves."""
    steps, pending = [], list(fenced(section(README, "A 60-second tour")))
    while pending:
        language, body = pending.pop(0)
        if language == "bash" and body.startswith("python -m modelserve "):
            (serve,) = command_lines(body)
            (_, curl), (answer_language, answer) = pending.pop(0), pending.pop(0)
            (curl_line,) = command_lines(curl)
            steps.append((shlex.split(serve)[3], curl_line, answer_language, answer.strip()))
    return steps


def test_the_tour_serves_an_example_a_truss_and_a_cortex_project() -> None:
    folders = [folder for folder, *_ in tour_steps()]
    assert folders == ["examples/iris", "tests/data/truss/test_basic_truss", "tests/data/cortex/v035-sleep"]
    assert not (REPO / folders[1] / "modelserve.yaml").exists() and (REPO / folders[1] / "config.yaml").exists()
    assert not (REPO / folders[2] / "modelserve.yaml").exists() and (REPO / folders[2] / "cortex.yaml").exists()


@pytest.mark.parametrize("step", tour_steps(), ids=lambda step: step[0])
def test_the_tour_answers_exactly_as_shown(start_server: Any, step: tuple[str, str, str, str]) -> None:
    folder, curl, language, shown = step
    server = start_server(REPO / folder)
    server.wait_ready()
    with httpx.Client() as client:
        answer = client.send(curl_request(curl, server.url))
    assert answer.status_code == 200, answer.text
    assert answer.text == shown
    assert answer.headers["content-type"].startswith("application/json" if language == "json" else "text/plain")


def test_the_tour_shows_the_example_as_it_is() -> None:
    tour = section(README, "A 60-second tour")
    example = REPO / "examples" / "iris"
    (shown_yaml,) = blocks(tour, "yaml")
    assert yaml.safe_load(shown_yaml) == yaml.safe_load((example / "modelserve.yaml").read_text())
    (tree,) = [body for language, body in fenced(tour) if language == "" and "examples/iris/" in body]
    for name in re.findall(r"[─ ]([\w.]+\.\w+)", tree):
        assert (example / name).is_file(), name
    (model,) = blocks(tour, "python")
    code = (example / "model.py").read_text()
    for signature in re.findall(r"def \w+\(.*\)(?: -> \w+(?:\[\w+\])?)?:", model):
        assert signature in code, signature


# ------------------------------------------------------------------------------------------------
# every page is reachable, every local link names a file


def doc_pages() -> set[str]:
    return {path.name for path in DOCS.glob("*.md")}


def test_the_readme_lists_every_docs_page_and_every_link_names_a_file() -> None:
    listed = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", section(README, "Documentation")))
    assert listed == doc_pages()  # index.md: the site's home
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README):
        if not re.match(r"[a-z]+:", target):
            assert (REPO / target).exists(), target


def test_the_site_nav_and_its_home_list_every_page() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())

    def leaves(entries: Any) -> list[str]:
        if isinstance(entries, str):
            return [entries]
        if isinstance(entries, dict):
            return [leaf for value in entries.values() for leaf in leaves(value)]
        return [leaf for entry in entries for leaf in leaves(entry)]

    nav = leaves(config["nav"])
    assert sorted(nav) == sorted(doc_pages() | {"benchmarks.md"})  # benchmarks.md: benchmarks/README.md
    home = set(re.findall(r"\]\(([\w-]+\.md)\)", page("index.md")))
    assert home == doc_pages() - {"index.md"}


def test_the_site_builds_strictly_when_mkdocs_is_installed() -> None:
    pytest.importorskip("material", reason="mkdocs-material builds the site (the dev extra installs it)")
    result = subprocess.run(["bash", "scripts/docs"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------------------------------------
# the docs pages' snippets


def test_create_app_runs_as_written_from_the_repository() -> None:
    (snippet,) = blocks(section(page("embedding.md"), "create_app"), "python")
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


def test_serve_runs_as_written(tmp_path: Path) -> None:
    (snippet,) = blocks(section(page("embedding.md"), "serve"), "python")
    assert 'modelserve.serve("examples/iris", port=8000, workers=2)' in snippet
    port = free_port()
    script = tmp_path / "serve_iris.py"  # a relative folder is relative to the folder the program was in
    script.write_text(snippet.replace("port=8000", f"port={port}"))
    (tmp_path / "examples").symlink_to(REPO / "examples")
    process = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        row = {"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}
        answer = None
        for _ in range(600):
            try:
                answer = httpx.post(f"http://127.0.0.1:{port}/iris", json=row)
                if answer.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            try:
                process.wait(0.1)
                break
            except subprocess.TimeoutExpired:
                pass
        assert answer is not None and answer.status_code == 200, answer
        assert answer.json()["label"] == "setosa"
    finally:
        process.terminate()
        assert process.wait(60) == 0


def test_the_beyond_loopback_call_is_answered(start_server: Any) -> None:
    """The page's key, command line options and curl (the body examples/iris accepts), served over plain HTTP
    here: TLS itself is tests/http/test_tls.py's."""
    (commands,) = blocks(section(page("beyond-loopback.md"), "Configuration"), "bash")
    export, serve, curl = command_lines(commands)
    variable = re.fullmatch(r'export (\w+)="\$\(python -c (.+)\)"', export)
    assert variable, export
    key = subprocess.run(
        [sys.executable, "-c", shlex.split(variable.group(2))[0]], capture_output=True, text=True, check=True
    ).stdout.strip()
    words = shlex.split(serve)
    assert words[:4] == ["python", "-m", "modelserve", "examples/iris"]
    options = dict(zip(words[4::2], words[5::2], strict=True))
    assert {"--ssl-certfile", "--ssl-keyfile"} <= set(options)
    server = start_server(
        REPO / words[3],
        "--api-key-env",
        options["--api-key-env"],
        "--cors-origin",
        options["--cors-origin"],
        env={variable.group(1): key},
    )
    server.wait_ready()
    request = curl_request(curl.replace(f"${variable.group(1)}", key), server.url)
    with httpx.Client() as client:
        answer = client.send(request)
        assert answer.status_code == 200, answer.text
        assert answer.json()["label"] == "setosa"
        del request.headers["authorization"]
        assert client.send(request).status_code == 401


def test_the_install_page_installs_from_a_clone() -> None:
    install = page("install.md")
    assert 'pip install -e ".[dev]"' in install and "pip install -e ." in install
    assert "not on the package index" in install  # `pip install modelserve` is not shown as if it worked
    extras = metadata.metadata("modelserve").get_all("Provides-Extra") or []
    for extra in re.findall(r'pip install -e "\.\[(\w+)\]"', install):
        assert extra in extras, extra


def test_the_configuration_reference_names_every_key() -> None:
    from modelserve import config

    reference = page("configuration.md")
    documented = set(re.findall(r"^\| `([\w.]+)`", section(reference, "Keys of an API"), flags=re.MULTILINE))
    assert {key.split(".")[0] for key in documented} == config._API_KEYS
    top = set(re.findall(r"^\| `(\w+):`", section(reference, "Top-level keys"), flags=re.MULTILINE))
    assert top | {"apis"} == config._TOP_KEYS


def test_the_cli_page_names_every_option() -> None:
    from modelserve import cli

    parser = cli.build_parser()
    options = {option for action in parser._actions for option in action.option_strings if option.startswith("--")}
    documented = set(re.findall(r"--[\w-]+", section(page("cli.md"), "Options")))
    assert options - {"--help", "--version"} <= documented, options - documented
