"""modelserve.container: the Dockerfile and .dockerignore of a project, read back with dockerfile-parse (the
parser of Red Hat's OSBS), and the Kubernetes manifest of docs/containers.md against the CLI's defaults."""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelserve import __version__, cli, container
from modelserve.config import load_project_config
from modelserve.errors import ConfigError
from tests.conftest import REPO, write_project

dockerfile_parse = pytest.importorskip("dockerfile_parse", reason="dockerfile-parse reads the Dockerfiles (dev extra)")


def parse(text: str) -> list[dict[str, Any]]:
    # an in-memory file: without one, setting the content writes ./Dockerfile (into the checkout)
    parser = dockerfile_parse.DockerfileParser(fileobj=io.BytesIO())
    parser.content = text
    return list(parser.structure)


def instructions(text: str, name: str) -> list[str]:
    return [item["value"] for item in parse(text) if item["instruction"] == name]


def pip_install(text: str) -> list[str]:
    """The arguments of the RUN that installs modelserve (exec form: a JSON list)."""
    runs = [json.loads(value) for value in instructions(text, "RUN") if value.startswith("[")]
    return next(run for run in runs if run[:4] == ["python", "-m", "pip", "install"])


@pytest.mark.parametrize(
    ("example", "extras"),
    [
        ("iris", ["schema"]),
        ("iris-onnx", ["onnx", "schema"]),
        ("iris-tensorflow", ["schema", "tensorflow"]),
        ("async-sentiment", []),
        ("streaming-tokens", ["schema"]),
    ],
)
def test_each_example_gets_the_extras_its_apis_need(example: str, extras: list[str]) -> None:
    project = REPO / "examples" / example
    assert container.recipe(load_project_config(project)).extras == extras
    text = container.dockerfile(project)
    wanted = f"modelserve[{','.join(extras)}]=={__version__}" if extras else f"modelserve=={__version__}"
    assert pip_install(text)[4] == wanted


def test_the_image_serves_as_the_cli_does_as_an_unprivileged_user() -> None:
    text = container.dockerfile(REPO / "examples" / "iris")
    structure = parse(text)
    order = [item["instruction"] for item in structure]
    assert order.index("FROM") < order.index("USER") < order.index("ENTRYPOINT")
    assert instructions(text, "ARG") == [f"BASE_IMAGE={container.DEFAULT_BASE_IMAGE}"]
    assert instructions(text, "FROM") == ["${BASE_IMAGE}"]
    user = instructions(text, "USER")[0]
    assert user.split(":")[0] != "0" and user.split(":")[0] != "root"
    assert instructions(text, "EXPOSE") == [str(cli.DEFAULT_PORT)]
    assert instructions(text, "STOPSIGNAL") == ["SIGTERM"]
    healthcheck = instructions(text, "HEALTHCHECK")[0]
    assert f"http://127.0.0.1:{cli.DEFAULT_PORT}/healthz" in healthcheck
    entrypoint = json.loads(instructions(text, "ENTRYPOINT")[0])
    assert entrypoint[:4] == ["python", "-m", "modelserve", container.PROJECT_DIR]
    assert entrypoint[4:] == ["--host", "0.0.0.0", "--port", str(cli.DEFAULT_PORT)]
    # the project is copied after the install, so that a code change does not reinstall the dependencies
    copy_project = next(i for i, item in enumerate(structure) if item["value"].endswith(f". {container.PROJECT_DIR}"))
    install = next(i for i, item in enumerate(structure) if "pip" in item["value"])
    assert install < copy_project
    assert structure[copy_project]["value"].startswith(f"--chown={container.USER}:")


def test_base_image_port_and_a_wheel_of_modelserve(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", {"model.py": "class Model:\n    def predict(self, x):\n        return x\n"})
    (project / "modelserve-0.1.0-py3-none-any.whl").write_bytes(b"")
    text = container.dockerfile(
        project, base_image="registry.local/python:3.12", port=9000, modelserve="modelserve-0.1.0-py3-none-any.whl"
    )
    assert instructions(text, "ARG") == ["BASE_IMAGE=registry.local/python:3.12"]
    assert instructions(text, "EXPOSE") == ["9000"]
    assert json.loads(instructions(text, "ENTRYPOINT")[0])[-1] == "9000"
    copied = [json.loads(value) for value in instructions(text, "COPY") if value.startswith("[")]
    assert ["modelserve-0.1.0-py3-none-any.whl", "/tmp/modelserve-install/"] in copied
    assert pip_install(text)[4] == "/tmp/modelserve-install/modelserve-0.1.0-py3-none-any.whl"


def test_truss_requirements_system_packages_and_python(tmp_path: Path) -> None:
    config = """
    model_name: t
    python_version: py310
    requirements: ["numpy>=1.26", "tokenizers==0.19.1"]
    requirements_file: ./extra-requirements.txt
    system_packages: [libgomp1, ffmpeg]
    model_cache: [{repo_id: org/model}]
    """
    model = "class Model:\n    def predict(self, x):\n        return x\n"
    project = write_project(
        tmp_path / "t",
        {"config.yaml": config, "model/model.py": model, "extra-requirements.txt": "orjson\n"},
    )
    text = container.dockerfile(project)
    assert instructions(text, "ARG") == ["BASE_IMAGE=python:3.10-slim"]
    apt = [value for value in instructions(text, "RUN") if "apt-get" in value]
    assert len(apt) == 1 and "libgomp1 ffmpeg" in apt[0]
    arguments = pip_install(text)
    assert arguments[4] == f"modelserve[truss-cache]=={__version__}"
    assert arguments[5:] == ["-r", "/tmp/requirements/0-extra-requirements.txt", "numpy>=1.26", "tokenizers==0.19.1"]
    assert '["extra-requirements.txt", "/tmp/requirements/0-extra-requirements.txt"]' in instructions(text, "COPY")


def test_a_system_package_that_is_not_a_package_name_is_refused(tmp_path: Path) -> None:
    model = "class Model:\n    def predict(self, x):\n        return x\n"
    config = "system_packages: ['curl && rm -rf /']\n"
    project = write_project(tmp_path / "t", {"config.yaml": config, "model/model.py": model})
    with pytest.raises(ConfigError, match="system_packages: not Debian package names: 'curl && rm -rf /'"):
        container.dockerfile(project)


def test_cortex_dependencies_and_a_redis_store(tmp_path: Path) -> None:
    cortex = """
    - name: iris
      kind: AsyncAPI
      handler:
        type: python
        path: handler.py
        dependencies: {pip: deps/pip.txt, shell: setup.sh}
    """
    handler = """
    class Handler:
        def __init__(self, config):
            pass

        def handle_async(self, payload):
            return 1
    """
    project = write_project(
        tmp_path / "c",
        {"cortex.yaml": cortex, "handler.py": handler, "deps/pip.txt": "orjson\n", "setup.sh": "true\n"},
    )
    needs = container.recipe(load_project_config(project))
    assert needs.requirement_files == ["deps/pip.txt"] and needs.scripts == ["setup.sh"]
    text = container.dockerfile(project)
    assert pip_install(text)[5:] == ["-r", "/tmp/requirements/0-pip.txt"]
    assert json.dumps(["bash", "setup.sh"]) in instructions(text, "RUN")
    order = [(item["instruction"], item["value"]) for item in parse(text)]
    assert order.index(("WORKDIR", container.PROJECT_DIR)) < order.index(("RUN", '["bash", "setup.sh"]'))

    yaml_text = "jobs: {store: 'redis://cache:6379/0'}\napis: [{name: j, kind: async, handler: {path: handler.py}}]\n"
    redis_project = write_project(tmp_path / "r", {"modelserve.yaml": yaml_text, "handler.py": handler})
    assert container.recipe(load_project_config(redis_project)).extras == ["redis"]


def test_dockerignore_from_the_projects_ignore_file(tmp_path: Path) -> None:
    model = "class Model:\n    def predict(self, x):\n        return x\n"
    ignore = "# data of local runs\nscratch/\n/build\nlogs/*.log\n*.ckpt\n!keep.ckpt\n"
    project = write_project(tmp_path / "p", {"model.py": model, ".modelserveignore": ignore})
    lines = [line for line in container.dockerignore(project).splitlines() if not line.startswith("#")]
    for pattern in ("**/.git", "**/__pycache__", "**/.env", "**/.modelserve"):
        assert pattern in lines
    assert lines[-5:] == ["**/scratch", "build", "logs/*.log", "**/*.ckpt", "!**/keep.ckpt"]


def test_write_keeps_an_existing_dockerfile_unless_forced(tmp_path: Path) -> None:
    model = "class Model:\n    def predict(self, x):\n        return x\n"
    project = write_project(tmp_path / "p", {"model.py": model})
    written = container.write(project)
    assert [path.name for path in written] == ["Dockerfile", ".dockerignore"]
    with pytest.raises(ConfigError, match="--force replaces them"):
        container.write(project)
    assert container.write(project, port=9001, force=True)
    assert "EXPOSE 9001" in (project / "Dockerfile").read_text()


def test_build_without_a_container_tool_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker, podman or buildah
    with pytest.raises(ConfigError, match="needs docker, podman or buildah"):
        container.build(REPO / "examples" / "iris", "iris:1")
    assert container.build_command("/p", "iris:1", "podman", ["BASE_IMAGE=x"]) == [
        "podman", "build", "-t", "iris:1", "-f", "/p/Dockerfile", "--build-arg", "BASE_IMAGE=x", "/p",
    ]  # fmt: skip


def manifests() -> list[dict[str, Any]]:
    """The Kubernetes documents of docs/containers.md's ```yaml blocks that hold a ``kind``."""
    text = (REPO / "docs" / "containers.md").read_text(encoding="utf-8")
    documents = []
    for block in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL):
        documents += [doc for doc in yaml.safe_load_all(block) if isinstance(doc, dict) and "kind" in doc]
    return documents


def test_the_kubernetes_manifest_matches_the_cli_defaults() -> None:
    documents = {doc["kind"]: doc for doc in manifests()}
    assert {"Deployment", "Service"} <= set(documents)
    pod = documents["Deployment"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= cli.DEFAULT_GRACE
    (server,) = pod["containers"]
    assert server["ports"][0]["containerPort"] == cli.DEFAULT_PORT
    assert server["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": cli.DEFAULT_PORT}
    assert server["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": cli.DEFAULT_PORT}
    assert server["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert server["securityContext"]["runAsUser"] == container.UID
    service = documents["Service"]["spec"]
    assert service["ports"][0]["targetPort"] == cli.DEFAULT_PORT
    assert service["selector"] == documents["Deployment"]["spec"]["selector"]["matchLabels"]


def test_the_extras_named_are_extras_of_modelserve() -> None:
    from importlib import metadata

    offered = set(metadata.metadata("modelserve").get_all("Provides-Extra") or [])
    assert {"onnx", "tensorflow", "redis", "schema", "truss-cache"} <= offered


@pytest.mark.slow
def test_the_entrypoint_serves_and_the_healthcheck_and_stopsignal_work(tmp_path: Path) -> None:
    """The image's own command lines, run as written (``python`` this interpreter, ``/srv/project`` a copy of
    the example) in a network namespace with only loopback, where ``--host 0.0.0.0`` reaches nothing else."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("the server binds 0.0.0.0 in a private network namespace here (unshare as root)")
    project = tmp_path / "project"
    shutil.copytree(REPO / "examples" / "iris", project)
    text = container.dockerfile(project)

    def local(command: list[str]) -> str:
        mapped = [
            sys.executable if part == "python" else part.replace(container.PROJECT_DIR, str(project))
            for part in command
        ]
        return shlex.join(mapped)

    serve = local(json.loads(instructions(text, "ENTRYPOINT")[0]))
    probe = local(json.loads(instructions(text, "HEALTHCHECK")[0].split("CMD ", 1)[1]))
    stop = instructions(text, "STOPSIGNAL")[0].removeprefix("SIG")
    body = '{"sepal_length": 5.1, "sepal_width": 3.5, "petal_length": 1.4, "petal_width": 0.2}'
    url = f"http://127.0.0.1:{cli.DEFAULT_PORT}/iris"
    call = (
        "import urllib.request as u; "
        f"r = u.Request({url!r}, data={body!r}.encode(), headers={{'content-type': 'application/json'}}); "
        "print(u.urlopen(r).read().decode())"
    )
    ask = local(["python", "-c", call])
    script = f"""
    ip link set lo up
    {serve} >{tmp_path}/server.log 2>&1 &
    server=$!
    healthy=1
    for attempt in $(seq 1 300); do if {probe} 2>/dev/null; then healthy=0; break; fi; sleep 0.1; done
    echo "healthy=$healthy"
    {ask}
    kill -{stop} $server
    wait $server
    echo "exit=$?"
    """
    run = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--kill-child", "sh", "-c", textwrap.dedent(script)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    log = (tmp_path / "server.log").read_text() if (tmp_path / "server.log").exists() else ""
    lines = run.stdout.splitlines()
    assert lines[0] == "healthy=0", run.stdout + run.stderr + log
    assert json.loads(lines[1])["label"] == "setosa"
    assert lines[2] == "exit=0", log  # SIGTERM: a graceful stop


def modelserve_command(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path} if path is not None else None
    return subprocess.run(
        [sys.executable, "-m", "modelserve", *args], capture_output=True, text=True, timeout=120, cwd=REPO, env=env
    )


def test_the_dockerfile_command_writes_refuses_to_overwrite_and_prints(tmp_path: Path) -> None:
    project = tmp_path / "iris-onnx"
    shutil.copytree(REPO / "examples" / "iris-onnx", project)
    written = modelserve_command("dockerfile", str(project))
    assert written.returncode == 0, written.stderr
    assert written.stdout.split() == ["wrote", str(project / "Dockerfile"), "wrote", str(project / ".dockerignore")]
    assert (project / "Dockerfile").read_text() == container.dockerfile(project)
    again = modelserve_command("dockerfile", str(project))
    assert again.returncode == cli.EXIT_USAGE and "--force replaces them" in again.stderr
    printed = modelserve_command("dockerfile", str(project), "--stdout", "--port", "9000")
    assert printed.returncode == 0 and printed.stdout == container.dockerfile(project, port=9000)


def test_the_build_command_without_a_container_tool_exits_2_saying_so(tmp_path: Path) -> None:
    built = modelserve_command("build", str(REPO / "examples" / "iris"), "-t", "iris:1", path=str(tmp_path))
    assert built.returncode == cli.EXIT_USAGE
    assert "needs docker, podman or buildah" in built.stderr
    assert not (REPO / "examples" / "iris" / "Dockerfile").exists()  # nothing written before the tool is found
    missing_tag = modelserve_command("build", str(REPO / "examples" / "iris"))
    assert missing_tag.returncode == cli.EXIT_USAGE and "--tag" in missing_tag.stderr


def test_a_project_that_is_not_valid_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    project = write_project(tmp_path / "bad", {"modelserve.yaml": "apis: [{name: x}]"})
    refused = modelserve_command("dockerfile", str(project))
    assert refused.returncode == cli.EXIT_USAGE and "needs a 'handler'" in refused.stderr
    assert not (project / "Dockerfile").exists()


def test_the_container_defaults_are_the_clis() -> None:
    assert container.DEFAULT_PORT == cli.DEFAULT_PORT
