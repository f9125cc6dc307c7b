"""docs/ray.md, docs/deploy.md, docs/install.md, docs/contributing.md and docs/index.md against what the code does:
the builder's arguments and refusals, what a client meets through Ray's proxy (one X-Request-ID, WebSockets, Ray's
own 503, a project that fails to load), the extras and the install hints, the test script's options.

The checks through Ray run one local Ray instance in private network and PID namespaces that hold only loopback
(as tests/deploy/test_ray.py does, and with its probe): `drive` is the driver run there.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelserve.config import RAY_KEYS
from modelserve.errors import EXTRA_OF_MODULE, ConfigError, install_hint
from modelserve.ray import ARGUMENTS, RAY_MAX_REPLICAS, Replica, plan
from modelserve.runtimes import RUNTIMES
from tests.conftest import REPO, free_port, write_project
from tests.deploy.test_ray import _namespaces_work, settings
from tests.test_install_hints import cli_without
from tests.test_readme import blocks, command_lines

DOCS = REPO / "docs"
RAY_PAGE = (DOCS / "ray.md").read_text(encoding="utf-8")
DEPLOY_PAGE = (DOCS / "deploy.md").read_text(encoding="utf-8")
INSTALL_PAGE = (DOCS / "install.md").read_text(encoding="utf-8")
CONTRIBUTING_PAGE = (DOCS / "contributing.md").read_text(encoding="utf-8")
INDEX_PAGE = (DOCS / "index.md").read_text(encoding="utf-8")


def flat(text: str) -> str:
    return " ".join(text.split())


def section(page: str, heading: str) -> str:
    """The text of a page's section, from its heading to the next heading of any level."""
    return page.split(heading + "\n", 1)[1].split("\n#", 1)[0]


# --- ray.md: the builder ----------------------------------------------------------------------------------------


def test_the_arguments_table_names_every_argument_of_the_builder() -> None:
    table = section(RAY_PAGE, "## Arguments")
    named = {
        name
        for row in table.splitlines()
        if row.startswith("| `")
        for name in re.findall(r"`(\w+)`", row.split(" | ")[0])
    }
    assert named == set(ARGUMENTS)


def test_the_ray_keys_of_modelserve_yaml_are_the_ones_listed() -> None:
    sentence = flat(section(RAY_PAGE, "## Ray's options in modelserve.yaml")).split("Serve's names: ", 1)[1]
    listed = set(re.findall(r"`(\w+)`", sentence.split(". ", 1)[0]))
    assert listed == set(RAY_KEYS)


@pytest.mark.parametrize(
    "argument",
    [
        "grpc_port=9000",
        "tracing=true",
        "workers=2",
        "server=granian",
        "secrets_dir=/run/secrets",
        "model_control=explicit",
        "log_format=json",
        "header_timeout=5",
    ],
)
def test_what_ray_does_not_serve_is_refused_by_the_builder(tmp_path: Path, argument: str) -> None:
    """The page's "Not through Ray": these command-line options have no argument, and naming one is a mistake."""
    key, value = argument.split("=")
    project = write_project(tmp_path / "p", {"model.py": "class Model:\n    def predict(self, x):\n        return x\n"})
    with pytest.raises(ConfigError, match=re.escape(f"unknown argument {key!r}")):
        plan({"project": str(project), key: value})
    not_through_ray = flat(section(RAY_PAGE, "### Not through Ray"))
    assert f"--{key.replace('_', '-')}" in not_through_ray


@pytest.mark.parametrize(
    ("key", "value"),
    [("jobs_store", "mongo://db/0"), ("api_key_env", "MODEL KEYS"), ("cors_origins", "https://a.example.com/app")],
)
def test_the_builder_refuses_what_the_command_line_s_option_refuses(tmp_path: Path, key: str, value: str) -> None:
    """Before, these reached the replicas, which failed three times each before Ray gave up."""
    project = write_project(tmp_path / "p", {"model.py": "class Model:\n    def predict(self, x):\n        return x\n"})
    with pytest.raises(ConfigError, match=re.escape(f"modelserve.ray: argument {key!r}: expected ")):
        plan({"project": str(project), key: value})
    assert "`cors_origins` that the command line's option would refuse" in flat(RAY_PAGE)


@pytest.mark.anyio
async def test_a_replica_without_the_api_key_variable_fails_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The variable is read where the replica runs: the builder cannot see it; the replica's constructor fails."""
    monkeypatch.delenv("MODEL_KEYS", raising=False)
    project = write_project(tmp_path / "p", {"model.py": "class Model:\n    def predict(self, x):\n        return x\n"})
    assert plan({"project": str(project), "api_key_env": "MODEL_KEYS"}).settings["api_key_env"] == "MODEL_KEYS"
    with pytest.raises(ConfigError) as failed:
        await Replica.__init__(Replica.__new__(Replica), str(project), settings(api_key_env="MODEL_KEYS"))
    assert f"`{failed.value}`" in flat(RAY_PAGE)


JOBS = "class Handler:\n    def handle_async(self, payload):\n        return payload\n"


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        ({"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}}, False),
        ({"autoscaling_config": {"min_replicas": 1}}, False),  # Ray's default max_replicas: 1 (refused before)
        ({"autoscaling_config": {"max_replicas": 2}}, True),
        ({"num_replicas": "auto"}, True),
        ({"num_replicas": 1}, False),
    ],
)
def test_a_store_of_one_replica_is_refused_when_more_may_run(
    tmp_path: Path, args: dict[str, Any], refused: bool
) -> None:
    files = {"jobs.py": JOBS, "modelserve.yaml": "apis: [{name: a, kind: async, handler: {path: jobs.py}}]\n"}
    project = write_project(tmp_path / "p", files)
    if refused:
        with pytest.raises(ConfigError, match="cannot share"):
            plan({"project": str(project), **args})
    else:
        plan({"project": str(project), **args})
    assert "an `autoscaling_config` whose `max_replicas` is above 1; Ray's default is 1), is refused" in flat(RAY_PAGE)
    ray_serve = pytest.importorskip("ray.serve.config", reason='Ray Serve is the "ray" extra (dev installs it)')
    assert ray_serve.AutoscalingConfig().max_replicas == RAY_MAX_REPLICAS  # the default the builder assumes


BAD_YAML = "apis: [{name: x, handler: {path: m.py}, max_concurrency: 0, bogus: 1}]\n"


def serve_run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("ray.serve", reason='Ray Serve is the "ray" extra (the dev extra installs it)')
    serve = Path(sys.executable).with_name("serve")
    command = [str(serve), "run", "modelserve.ray:app", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=folder)


def test_serve_run_prints_a_projects_mistakes_one_a_line_and_exits_1(tmp_path: Path) -> None:
    """The arguments are checked first, in one line; the project's modelserve.yaml after, one line a problem."""
    write_project(tmp_path / "bad", {"modelserve.yaml": BAD_YAML})
    run = serve_run(tmp_path, "project=bad")
    assert run.returncode == 1
    assert f"Error: {tmp_path / 'bad' / 'modelserve.yaml'} is not valid:\n" in run.stderr
    problems = [line for line in run.stderr.splitlines() if line.startswith("  - api 'x'")]
    assert len(problems) == 3  # the unknown key, the missing file, the concurrency of 0
    assert "Traceback" not in run.stderr + run.stdout

    both = serve_run(tmp_path, "project=bad", "replicas=2")
    assert both.returncode == 1
    assert "Error: modelserve.ray: unknown argument 'replicas'" in both.stderr
    assert "is not valid" not in both.stderr  # the project is read once the arguments are right

    text = flat(RAY_PAGE)
    assert "`Error: modelserve.ray: unknown argument 'replicas' (modelserve.ray knows: ...)`" in text
    assert "`Error: .../modelserve.yaml is not valid:` and one line a problem" in text


# --- ray.md: the replica's answers, without Ray ------------------------------------------------------------------


WHO = "class Model:\n    def predict(self, inputs):\n        raise RuntimeError('boom')\n"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_the_replica_leaves_the_request_s_id_header_to_ray_s_proxy(tmp_path: Path) -> None:
    """Ray's proxy adds X-Request-ID (its id, or the client's) to every answer: the replica's app sends none of the
    same id (before, a client got the header twice); an id modelserve made itself, the client's being refused, is
    kept, as the error body names it."""
    project = write_project(tmp_path / "p", {"model.py": WHO})
    replica = Replica.__new__(Replica)
    await Replica.__init__(replica, str(project), settings())
    app = replica.__serve_build_asgi_app__()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as client:
            given = await client.post("/model", json={}, headers={"x-request-id": "abc123"})
            assert given.status_code == 500 and given.json()["request_id"] == "abc123"
            assert given.headers.get_list("x-request-id") == []
            refused = await client.post("/model", json={}, headers={"x-request-id": "not a sane id!"})
            assert refused.headers.get_list("x-request-id") == [refused.json()["request_id"]]
    finally:
        await app.app.server.close()


# --- ray.md: through a real Ray Serve --------------------------------------------------------------------------


GATED = """
import os
import time

class Who:
    def predict(self, inputs):
        return {"pid": os.getpid()}

class Gate:
    def predict(self, inputs):
        open(inputs["started"], "a").close()
        while not os.path.exists(inputs["gate"]):  # the driver opens it once Ray has refused a request
            time.sleep(0.05)
        return {"passed": True}
"""
#: One request at a replica and one in Ray's queue: the next is Ray's to refuse.
GATED_YAML = """
ray: {max_ongoing_requests: 1, max_queued_requests: 1}
apis:
  - {name: who, handler: {path: model.py, class: Who}}
  - {name: gate, handler: {path: model.py, class: Gate}}
"""
FAILING = """
class Model:
    def load(self):
        raise OSError("weights.bin is missing")

    def predict(self, inputs):
        return inputs
"""
PROXY = "http://127.0.0.1:8000"


def drive(gated: str, failing: str, marks: str) -> None:
    """In the namespace: deploy `gated`, then `failing` as a second application; print ``RESULT {...}``."""
    import ray
    import websockets
    from ray import serve

    import modelserve.ray

    result: dict[str, Any] = {}
    ray.init(_temp_dir=tempfile.mkdtemp(prefix="ray-"), num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.run(modelserve.ray.app({"project": gated, "metrics_interval_s": 0}))
        with httpx.Client(base_url=PROXY, timeout=60) as client:
            answers = []
            for headers in ({}, {"x-request-id": "abc123"}):
                answer = client.post("/nowhere", json={}, headers=headers)
                answers.append([answer.status_code, answer.headers.get_list("x-request-id"), answer.json()])
            result["ids"] = answers

            async def over_websocket() -> list[Any]:
                async with websockets.connect(PROXY.replace("http", "ws") + "/who/ws") as websocket:
                    await websocket.send("{}")
                    return [message async for message in websocket]

            result["websocket"] = asyncio.run(over_websocket())

            started, gate = os.path.join(marks, "started"), os.path.join(marks, "gate")
            answered: list[httpx.Response] = []

            def call(path: str) -> None:
                if path == "/readyz":
                    answered.append(client.get(path))
                else:
                    answered.append(client.post(path, json={"started": started, "gate": gate}))

            first = threading.Thread(target=call, args=("/gate",))
            first.start()
            deadline = time.monotonic() + 60
            while not os.path.exists(started) and time.monotonic() < deadline:
                time.sleep(0.05)
            # the replica holds its one request: of these two, Ray queues one and refuses the other (/readyz
            # counts as any request does)
            more = [threading.Thread(target=call, args=(path,)) for path in ("/readyz", "/gate")]
            for thread in more:
                thread.start()
            while not answered and time.monotonic() < deadline:
                time.sleep(0.05)
            open(gate, "w").close()
            for thread in [first, *more]:
                thread.join(60)
            result["gated"] = [
                [answer.status_code, answer.headers.get("content-type"), answer.text[:300]] for answer in answered
            ]
        try:
            serve.run(modelserve.ray.app({"project": failing}), name="failing", route_prefix="/failing")
            result["failing_raised"] = False
        except RuntimeError:
            result["failing_raised"] = True
        status = serve.status().applications["failing"]
        result["failing"] = [status.status, status.deployments[modelserve.ray.DEFAULT_NAME].message]
    finally:
        print("RESULT " + json.dumps(result), flush=True)
        ray.shutdown()


@pytest.fixture(scope="module")
def through_ray(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pytest.importorskip("ray.serve", reason='Ray Serve is the "ray" extra (the dev extra installs it)')
    pytest.importorskip("websockets")
    if os.geteuid() != 0 or not _namespaces_work():
        pytest.skip("Ray runs in a private network namespace here (unshare as root), and none can be made")
    root = tmp_path_factory.mktemp("through-ray")
    gated = write_project(root / "gated", {"model.py": GATED, "modelserve.yaml": GATED_YAML})
    failing = write_project(root / "failing", {"model.py": FAILING})
    marks = root / "marks"
    marks.mkdir()
    code = "import sys; from tests.deploy.test_docs_claims_deploy import drive; drive(*sys.argv[1:])"
    run = subprocess.run(
        [
            "unshare",
            "--net",
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            "sh",
            "-c",
            'ip link set lo up && exec "$0" "$@"',
        ]
        + [sys.executable, "-c", code, str(gated), str(failing), str(marks)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=240,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stdout[-3000:] + run.stderr[-6000:]
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


@pytest.mark.slow
def test_through_ray_an_answer_has_one_request_id_header(through_ray: dict[str, Any]) -> None:
    (made, made_ids, made_body), (given, given_ids, given_body) = through_ray["ids"]
    assert made == given == 404
    assert made_ids == [made_body["request_id"]]  # Ray's id, which modelserve used, once
    assert given_ids == ["abc123"] == [given_body["request_id"]]  # the client's
    assert "one `X-Request-ID`" in flat(section(RAY_PAGE, "## What each replica is"))


@pytest.mark.slow
def test_through_ray_the_websocket_route_answers(through_ray: dict[str, Any]) -> None:
    (message,) = through_ray["websocket"]  # the one result, then the server closed
    assert set(json.loads(message)) == {"pid"}
    assert "WebSocket routes" in flat(RAY_PAGE.split("\n## ", 1)[0])


@pytest.mark.slow
def test_through_ray_beyond_max_queued_requests_ray_answers_its_own_503(through_ray: dict[str, Any]) -> None:
    """One request at the replica, then a /readyz and a call: Ray queues one and refuses the other itself."""
    statuses = sorted(status for status, _, _ in through_ray["gated"])
    assert statuses == [200, 200, 503], through_ray["gated"]
    ((_, kind, body),) = [answer for answer in through_ray["gated"] if answer[0] == 503]
    assert not kind.startswith("application/json")  # Ray's answer, not modelserve's error body
    with pytest.raises(ValueError):
        json.loads(body)
    backpressure = flat(section(RAY_PAGE, "### Backpressure: max_ongoing_requests"))
    assert "Ray's own answer: plain text, not modelserve's JSON error body" in backpressure
    assert "Ray counts every request a replica holds, `/readyz` and `/metrics` as well" in backpressure
    assert "Ray's own" in flat(DEPLOY_PAGE)


@pytest.mark.slow
def test_through_ray_a_project_that_fails_to_load_fails_its_deployment(through_ray: dict[str, Any]) -> None:
    assert through_ray["failing_raised"]  # serve.run raises
    status, message = through_ray["failing"]
    assert status == "DEPLOY_FAILED"
    last = message.strip().splitlines()[-1]
    shown = re.search(r"ends with modelserve's \(`([^`]+)`\)", flat(RAY_PAGE))
    assert shown is not None
    assert last.endswith(shown.group(1))
    assert "modelserve.ray: the project failed to load in this replica: " in flat(
        section(RAY_PAGE, "## What each replica is")
    )


# --- install.md: the extras and the hints ------------------------------------------------------------------------


def pyproject() -> dict[str, Any]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    with open(REPO / "pyproject.toml", "rb") as file:
        document: dict[str, Any] = tomllib.load(file)
    return document["project"]


def extras_block() -> list[tuple[str, str]]:
    """(extra or "" for the core, its comment) of each ``pip install -e`` line of install.md's Extras section."""
    (block,) = [block for block in blocks(section(INSTALL_PAGE, "## Extras"), "bash")]
    rows: list[tuple[str, str]] = []
    for line in block.splitlines():
        found = re.match(r'pip install -e (?:\.|"\.\[([\w-]+)\]")\s+# (.*)', line)
        if found:
            rows.append((found.group(1) or "", found.group(2)))
        elif rows and line.strip().startswith("#"):
            rows[-1] = (rows[-1][0], rows[-1][1] + " " + line.strip().lstrip("# "))
    return rows


def names(requirements: list[str]) -> list[str]:
    return [re.split(r"[<>=;\s]", requirement, maxsplit=1)[0] for requirement in requirements]


def test_install_md_lists_every_extra_and_what_all_holds() -> None:
    project = pyproject()
    rows = extras_block()
    listed = [extra for extra, _ in rows]
    assert sorted(listed) == sorted(["", *project["optional-dependencies"]])
    core_comment = dict(rows)[""]
    assert names(project["dependencies"]) == re.findall(r"[\w\[\]-]+", core_comment.split(":", 1)[1])
    (all_of,) = project["optional-dependencies"]["all"]
    in_all = all_of.split("[", 1)[1].rstrip("]").split(",")
    assert listed[1 : listed.index("all")] == in_all  # "all of the above"
    assert dict(rows)["all"] == "all of the above"
    (dev_extras,) = [item for item in project["optional-dependencies"]["dev"] if item.startswith("modelserve[")]
    assert sorted(dev_extras.split("[", 1)[1].rstrip("]").split(",")) == sorted(listed[listed.index("all") : -1])


def test_examples_iris_needs_the_schema_extra_as_install_md_and_index_md_say() -> None:
    """index.md's first command installs the schema extra before it serves examples/iris: without pydantic, the
    example exits 3 with the command that adds it."""
    assert 'pip install -e ".[schema]" && python -m modelserve examples/iris' in INDEX_PAGE
    assert "`examples/iris` has typed inputs, so it needs the `schema` extra" in INSTALL_PAGE
    listed = flat(INSTALL_PAGE).split("own code imports a package that one of the extras installs (", 1)[1]
    assert listed.split(")", 1)[0].split(", ") == list(EXTRA_OF_MODULE)
    result = cli_without("pydantic", str(REPO / "examples" / "iris"), "--port", str(free_port()))
    assert result.returncode == 3, result.stderr
    assert f"Install it with: {install_hint('schema')}" in result.stderr


@pytest.mark.parametrize(
    ("line", "hint"),
    [("import msgpack", "truss-binary"), ("from pydantic import NoSuchName", None), ("import pydantic.no_such", None)],
)
def test_a_project_s_own_import_of_an_extra_s_package_says_what_adds_it(
    tmp_path: Path, line: str, hint: str | None
) -> None:
    """The hint comes when the package itself is missing, not for a name or a submodule it lacks."""
    files = {"model.py": f"{line}\n\nclass Model:\n    def predict(self, x):\n        return x\n"}
    root = write_project(tmp_path / "p", files)
    result = cli_without("msgpack", str(root), "--port", str(free_port()))
    assert result.returncode == 3, result.stderr
    assert "importing it raised" in result.stderr
    if hint is None:
        assert "Install it with" not in result.stderr
    else:
        assert f"the {hint} extra installs msgpack. Install it with: {install_hint(hint)}" in result.stderr


def test_the_wheel_is_named_as_install_md_says_and_carries_every_extra(tmp_path: Path) -> None:
    from hatchling.builders.wheel import WheelBuilder

    import modelserve

    wheel = Path(next(WheelBuilder(str(REPO)).build(directory=str(tmp_path))))
    other_machines = flat(section(INSTALL_PAGE, "## Once published, and on other machines"))
    shown = re.search(r'pip install "(modelserve-VERSION-py3-none-any\.whl)\[onnx\]"', other_machines)
    assert shown is not None and f"dist/{shown.group(1)}" in other_machines
    assert wheel.name == shown.group(1).replace("VERSION", modelserve.__version__)
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        provided = re.findall(r"^Provides-Extra: (.+)$", archive.read(metadata).decode(), flags=re.MULTILINE)
    assert sorted(provided) == sorted(pyproject()["optional-dependencies"])


def test_install_md_names_the_programs_scripts_test_installs() -> None:
    script = (REPO / "scripts" / "test").read_text(encoding="utf-8")
    installed = re.findall(r'command -v ([\w-]+) >/dev/null 2>&1 \|\| missing="\$missing', script)
    dev_comment = dict(extras_block())["dev"]
    for program in installed:
        assert program in dev_comment


def hinted_extras() -> set[str]:
    """Every extra that modelserve's messages tell a user to install."""
    found = {runtime.extra for runtime in RUNTIMES.values()}
    for source in (REPO / "modelserve").rglob("*.py"):
        text = source.read_text(encoding="utf-8")
        found |= set(re.findall(r"install_hint\(['\"]([\w-]+)['\"]", text))
        found |= set(re.findall(r"MissingExtraError\([^()]*,\s*['\"]([\w-]+)['\"]\)", text))
    return found


def test_every_install_hint_names_an_extra_that_exists() -> None:
    extras = set(pyproject()["optional-dependencies"])
    hinted = hinted_extras()
    assert {"onnx", "tensorflow", "schema", "redis", "ray", "grpc"} <= hinted  # the scan finds the hints
    assert hinted <= extras
    for extra in hinted:
        assert install_hint(extra).startswith(f'pip install -e ".[{extra}]" in a clone of modelserve')


def test_every_pip_command_of_these_pages_names_extras_that_exist() -> None:
    extras = set(pyproject()["optional-dependencies"])
    for page in (RAY_PAGE, DEPLOY_PAGE, INSTALL_PAGE, CONTRIBUTING_PAGE, INDEX_PAGE):
        for group in re.findall(r'pip install (?:-e )?"(?:\.|modelserve)\[([\w,-]+)\]"', page):
            assert set(group.split(",")) <= extras, group


# --- contributing.md: the test script's options ------------------------------------------------------------------


def test_the_quick_loop_leaves_out_what_the_page_says() -> None:
    script = (REPO / "scripts" / "test").read_text(encoding="utf-8")
    (marks,) = re.findall(r'exec python -m pytest -m "([^"]+)" "\$@"', script)
    assert marks == "not slow and not server"
    (block,) = [block for block in blocks(CONTRIBUTING_PAGE, "bash") if "scripts/test --quick" in block]
    quick = [line for line in command_lines(block) if "--quick" in line]
    assert quick == ["bash scripts/test --quick"]
    comment = block.split("--quick", 1)[1].splitlines()[0]
    assert "marked slow" in comment and "a server process" in comment
    running = flat(section(CONTRIBUTING_PAGE, "## Running the tests"))
    assert "marked `slow`" in running and "and every test that starts a server process (the `server` marker" in running
    assert "`--quick` must come first" in running  # the script reads it as its first argument only
    assert 'if [ "${1:-}" = "--quick" ]; then' in script


def test_kserve_python_is_an_interpreter() -> None:
    """scripts/test runs kserve's clients with "$KSERVE_PYTHON", as a command: the page names a python, not a folder."""
    script = (REPO / "scripts" / "test").read_text(encoding="utf-8")
    assert 'export KSERVE_PYTHON="$kserve_venv/bin/python"' in script
    assert 'python scripts/kserve_v2.py "$KSERVE_PYTHON"' in script
    assert "`KSERVE_PYTHON` names the python of a venv of your own" in flat(CONTRIBUTING_PAGE)
