"""docs/ray.md and docs/containers.md say what is true: their commands, snippets and messages are the ones the
code takes and gives (the Ray deployment itself runs in tests/deploy/test_ray.py, the image's command lines in
tests/deploy/test_container.py)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelserve import container
from modelserve.config import load_project_config
from modelserve.errors import ConfigError
from modelserve.ray import plan
from tests.conftest import REPO
from tests.test_readme import blocks, command_lines

RAY_PAGE = (REPO / "docs" / "ray.md").read_text(encoding="utf-8")
CONTAINERS_PAGE = (REPO / "docs" / "containers.md").read_text(encoding="utf-8")


def serve_run_arguments() -> list[list[str]]:
    """The application arguments of every ``serve run modelserve.ray:app ...`` on the page."""
    found = []
    for block in blocks(RAY_PAGE, "bash"):
        for line in command_lines(block):
            words = shlex.split(line)
            if "unshare" in words:  # the command inside sh -c
                words = shlex.split(words[-1].split("&&", 1)[1])
            if words[:2] == ["serve", "run"]:
                assert words[2] == "modelserve.ray:app"
                found.append(words[3:])
    return found


def test_the_serve_run_commands_build_the_application(monkeypatch: pytest.MonkeyPatch) -> None:
    serve_scripts = pytest.importorskip("ray.serve.scripts", reason='Ray Serve is the "ray" extra (dev installs it)')
    import modelserve.ray

    monkeypatch.chdir(REPO)
    commands = serve_run_arguments()
    assert len(commands) == 2
    for words in commands:
        args = serve_scripts.convert_args_to_dict(tuple(words))  # as `serve run` reads them
        assert plan(args).options["num_replicas"] == 2
        assert plan(args).options["max_ongoing_requests"] == 2 + 32  # examples/iris: max_concurrency + max_queue_length
        assert type(modelserve.ray.app(args)).__name__ == "Application"


def test_the_python_snippet_builds_what_serve_run_gets(monkeypatch: pytest.MonkeyPatch) -> None:
    serve = pytest.importorskip("ray.serve", reason='Ray Serve is the "ray" extra (dev installs it)')
    monkeypatch.chdir(REPO)
    deployed: list[Any] = []
    monkeypatch.setattr(serve, "run", deployed.append)  # the real serve.run runs in test_ray.py's namespace
    (snippet,) = blocks(RAY_PAGE, "python")
    exec(compile(snippet, "docs/ray.md", "exec"), {})
    assert [type(app).__name__ for app in deployed] == ["Application"]


def test_the_config_file_is_a_valid_serve_config_with_valid_arguments() -> None:
    schema = pytest.importorskip("ray.serve.schema", reason='Ray Serve is the "ray" extra (dev installs it)')
    (config,) = [yaml.safe_load(block) for block in blocks(RAY_PAGE, "yaml") if "applications:" in block]
    schema.ServeDeploySchema.model_validate(config)  # Ray's own check of a config file
    (application,) = config["applications"]
    assert application["import_path"] == "modelserve.ray:app"
    working_dir = REPO / "examples" / "iris"  # what the zip that working_dir names holds
    args = {**application["args"], "project": str(working_dir / application["args"]["project"])}
    options = plan(args).options
    assert options["autoscaling_config"]["max_replicas"] == 4
    assert options["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0.5}


def test_the_shared_store_message_is_the_one_shown() -> None:
    (shown,) = [block for block in blocks(RAY_PAGE, "text") if "cannot" in block]
    with pytest.raises(ConfigError) as refused:
        plan({"project": str(REPO / "examples" / "async-sentiment"), "num_replicas": 2})
    assert " ".join(str(refused.value).split()) == " ".join(shown.split())


def test_the_examples_extras_are_the_ones_listed() -> None:
    sentence = " ".join(CONTAINERS_PAGE.split("The examples get:", 1)[1].split(".\n", 1)[0].split())
    listed: dict[str, list[str]] = {}
    for names, extras in re.findall(r"((?:`[\w-]+`(?: and )?)+) → (`[\w,]+`|none)", sentence):
        for name in re.findall(r"`([\w-]+)`", names):
            listed[name] = [] if extras == "none" else extras.strip("`").split(",")
    examples = sorted(path.name for path in (REPO / "examples").iterdir() if path.is_dir())
    assert sorted(listed) == examples
    for name, extras in listed.items():
        assert container.recipe(load_project_config(Path(REPO / "examples" / name))).extras == extras


def test_the_container_commands_run_as_written(tmp_path: Path) -> None:
    (block,) = [block for block in blocks(CONTAINERS_PAGE, "bash") if "modelserve dockerfile" in block]
    dockerfile_line, build_line = command_lines(block)
    words = shlex.split(dockerfile_line)
    assert words[:2] == ["modelserve", "dockerfile"]
    copy = tmp_path / "project"
    shutil.copytree(REPO / words[2], copy)
    assert container.run_command(["dockerfile", str(copy)]) == 0  # what `modelserve dockerfile` runs
    assert (copy / "Dockerfile").is_file() and (copy / ".dockerignore").is_file()
    words = shlex.split(build_line)
    assert words[:2] == ["modelserve", "build"]
    options = container.command_parser("build").parse_args(words[2:])
    assert (options.project_dir, options.tag) == (dockerfile_line.split()[2], "iris:1")


def test_the_ray_options_of_modelserve_yaml_are_the_builder_s_defaults(tmp_path: Path) -> None:
    (text,) = [block for block in blocks(RAY_PAGE, "yaml") if block.startswith("ray:")]
    project = tmp_path / "iris"
    shutil.copytree(REPO / "examples" / "iris", project)
    (project / "modelserve.yaml").write_text(text, encoding="utf-8")
    options = plan({"project": str(project)}).options  # serve run modelserve.ray:app project=examples/iris
    assert options["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8}
    assert options["ray_actor_options"] == {"num_cpus": 1}
    fixed = plan({"project": str(project), "num_replicas": "2"}).options  # ... num_replicas=2
    assert fixed["num_replicas"] == 2 and "autoscaling_config" not in fixed
    (project / "modelserve.yaml").write_text(text.replace("ray:\n", "ray:\n  num_replicas: 0\n", 1), encoding="utf-8")
    shown = re.search(r"`\.\.\./modelserve\.yaml, (ray: key 'num_replicas': [^`]+)`", RAY_PAGE)
    assert shown is not None
    with pytest.raises(ConfigError, match=re.escape(shown[1])):
        plan({"project": str(project)})


def test_the_benchmark_command_takes_the_options_shown() -> None:
    (line,) = [
        line for block in blocks(RAY_PAGE, "bash") for line in command_lines(block) if "benchmarks/ray_proxy.py" in line
    ]
    script = REPO / "benchmarks" / "ray_proxy.py"
    usage = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0, usage.stderr
    for word in shlex.split(line):
        if word.startswith("--"):
            assert word.split("=", 1)[0] in usage.stdout, word
