"""modelserve.ray: the builder's checks (no Ray started), then a real Ray Serve deployment of a project.

Ray's services talk over the machine's non-loopback address, and tests may use loopback only: the deployment
runs in a driver process (tests/deploy/ray_driver.py) inside private network and PID namespaces that hold
only loopback (``unshare``, as root), so Ray uses 127.0.0.1 throughout and every process it started ends
with the namespace.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelserve.errors import ConfigError, MissingExtraError
from modelserve.ray import DEFAULT_GRACE, plan
from tests.conftest import REPO, write_project

DRIVER = Path(__file__).with_name("ray_driver.py")
REDIS_PORT = 6399  # inside the test's own network namespace, where nothing else listens

MODEL = """
import os
import time

class Who:
    def predict(self, inputs):
        return {"pid": os.getpid()}

class Boom:
    def predict(self, inputs):
        raise RuntimeError("boom")

class Tokens:
    def predict(self, inputs):
        for index in range(3):
            yield f"t{index} "

class Drip:
    def predict(self, inputs):
        ended = "finished"
        try:
            for index in range(400):
                yield f"{index} "
                time.sleep(0.05)
        except GeneratorExit:
            ended = "closed"
            raise
        finally:
            with open(inputs["marker"], "w") as file:
                file.write(ended)
"""
JOBS = """
import os
import time

class Handler:
    def __init__(self, config):
        pass

    def handle_async(self, payload, request_id):
        if "started" in payload:  # a folder: which process started the job, once per attempt
            with open(os.path.join(payload["started"], payload["text"]), "a") as file:
                file.write(f"{os.getpid()}\\n")
        time.sleep(payload.get("sleep", 0))
        return {"pid": os.getpid(), "text": payload["text"]}
"""


def project_yaml(store: str) -> str:
    return f"""
    jobs: {{store: "{store}"}}
    apis:
      - {{name: who, handler: {{path: model.py, class: Who}}, max_body_size: 100, max_concurrency: 2}}
      - {{name: boom, handler: {{path: model.py, class: Boom}}}}
      - {{name: tokens, handler: {{path: model.py, class: Tokens}}, max_queue_length: 7}}
      - {{name: drip, handler: {{path: model.py, class: Drip}}}}
      - {{name: job, kind: async, handler: {{path: jobs.py, class: Handler}}}}
    """


@pytest.fixture
def project(tmp_path: Path) -> Path:
    files = {"model.py": MODEL, "jobs.py": JOBS, "modelserve.yaml": project_yaml(f"redis://127.0.0.1:{REDIS_PORT}/0")}
    return write_project(tmp_path / "project", files)


def test_plan_derives_ray_options_from_the_project(project: Path) -> None:
    result = plan({"project": str(project), "num_replicas": "2", "ray_actor_options": '{"num_cpus": 0.5}'})
    # who: 2 + 100, boom: 1 + 100, tokens: 1 + 7, drip: 1 + 100, job: 1 + 100 (modelserve.yaml's default limits)
    assert result.options == {
        "num_replicas": 2,
        "ray_actor_options": {"num_cpus": 0.5},
        "max_ongoing_requests": 413,
        "graceful_shutdown_timeout_s": DEFAULT_GRACE,
    }
    assert result.project == str(project.resolve())
    assert result.settings["workers"] == 2
    assert plan({"project": str(project), "max_ongoing_requests": 8}).options["max_ongoing_requests"] == 8


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ({"num_replicas": 2, "replicas": 2}, "unknown argument 'replicas'"),
        ({"num_replicas": "two"}, "argument 'num_replicas': expected a positive integer or 'auto'"),
        ({"ray_actor_options": {"num_gpu": 1}}, "unknown option 'num_gpu'"),
        ({"autoscaling_config": "{not json"}, "argument 'autoscaling_config': expected a mapping"),
        ({"num_replicas": 2, "autoscaling_config": {"max_replicas": 2}}, "not both"),
    ],
)
def test_plan_refuses_a_mistake_naming_it(project: Path, args: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        plan({"project": str(project), **args})


RAY_YAML = """
ray:
  autoscaling_config: {min_replicas: 1, max_replicas: 3, target_ongoing_requests: 2}
  ray_actor_options: {num_cpus: 0.5}
  max_queued_requests: 50
apis:
  - {name: who, handler: {path: model.py, class: Who}}
"""


def test_modelserve_yaml_ray_options_are_the_defaults_the_arguments_override(tmp_path: Path) -> None:
    folder = write_project(tmp_path / "p", {"model.py": MODEL, "modelserve.yaml": RAY_YAML})
    from_file = plan({"project": str(folder)}).options
    assert from_file["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 2}
    assert from_file["ray_actor_options"] == {"num_cpus": 0.5}
    assert from_file["max_queued_requests"] == 50
    assert from_file["max_ongoing_requests"] == 101  # still from the API's limits: the file did not name it
    overridden = plan({"project": str(folder), "num_replicas": "2", "max_queued_requests": 9}).options
    assert "autoscaling_config" not in overridden and overridden["num_replicas"] == 2  # one choice replaces the other
    assert overridden["max_queued_requests"] == 9 and overridden["ray_actor_options"] == {"num_cpus": 0.5}


@pytest.mark.parametrize(
    ("ray_yaml", "named"),
    [
        ("{replicas: 2}", "ray: unknown key 'replicas' (known keys: autoscaling_config,"),
        ("[num_replicas]", "top level: key 'ray': expected a mapping"),
        ("{num_replicas: 0}", "ray: key 'num_replicas': expected a positive integer or 'auto', got 0"),
        ("{ray_actor_options: {num_gpu: 1}}", "ray: key 'ray_actor_options': unknown option 'num_gpu'"),
        ("{num_replicas: 2, autoscaling_config: {max_replicas: 2}}", "give 'num_replicas' or 'autoscaling_config'"),
    ],
)
def test_a_mistake_in_modelserve_yaml_ray_is_named(tmp_path: Path, ray_yaml: str, named: str) -> None:
    text = f"ray: {ray_yaml}\napis: [{{name: who, handler: {{path: model.py, class: Who}}}}]\n"
    folder = write_project(tmp_path / "p", {"model.py": MODEL, "modelserve.yaml": text})
    with pytest.raises(ConfigError, match=re.escape(named)):
        plan({"project": str(folder)})


def test_plan_refuses_a_missing_or_invalid_project(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="argument 'project' is required"):
        plan({"num_replicas": 1})
    with pytest.raises(ConfigError, match="does not exist"):
        plan({"project": str(tmp_path / "nowhere")})
    invalid = "apis: [{name: x, handler: {path: m.py}, max_concurrency: 0}]"
    bad = write_project(tmp_path / "bad", {"modelserve.yaml": invalid})
    with pytest.raises(ConfigError, match="max_concurrency"):
        plan({"project": str(bad)})


@pytest.mark.parametrize(
    ("store", "args"),
    [
        ("sqlite", {"num_replicas": 2}),
        ("memory", {"autoscaling_config": {"min_replicas": 1, "max_replicas": 3}}),
        ("sqlite", {"num_replicas": "auto"}),
    ],
)
def test_async_apis_on_several_replicas_need_a_shared_store(tmp_path: Path, store: str, args: dict[str, Any]) -> None:
    folder = write_project(tmp_path / "p", {"jobs.py": JOBS, "modelserve.yaml": project_yaml(store)})
    folder.joinpath("model.py").write_text(MODEL)
    with pytest.raises(ConfigError, match=r"cannot share .* jobs_store=redis://"):
        plan({"project": str(folder), **args})
    assert plan({"project": str(folder)}).settings["workers"] == 1  # one replica may keep its own store
    plan({"project": str(folder), **args, "jobs_store": "redis://127.0.0.1:1/0"})  # a shared store is fine


def test_without_ray_the_error_says_what_to_install(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import modelserve.ray

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(MissingExtraError, match=re.escape("modelserve[ray]")):
        modelserve.ray.app({"project": str(project)})


def _namespaces_work() -> bool:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "sh", "-c", "ip link set lo up"],
        capture_output=True,
    )
    return probe.returncode == 0


REQUESTS: list[list[Any]] = [
    ["POST", "/who", "{bad", {"content-type": "application/json"}],  # 400: not JSON
    ["POST", "/who", "[" + "1," * 60 + "1]", {"content-type": "application/json"}],  # 413: max_body_size 100
    ["POST", "/boom", "{}", {"content-type": "application/json"}],  # 500: user code raised
    ["POST", "/tokens", "{}", {"content-type": "application/json"}],  # a stream
    ["GET", "/nowhere", None, {}],  # 404
    ["GET", "/readyz", None, {}],
    ["GET", "/v2/health/ready", None, {}],
    ["GET", "/v2/models/tokens", None, {}],
]


def _without_request_id(text: str) -> Any:
    try:
        document = json.loads(text)
    except ValueError:
        return text
    if isinstance(document, dict):
        document.pop("request_id", None)
    return document


@pytest.mark.slow
def test_a_project_on_ray_serve_answers_as_modelserve_does(project: Path, start_server: Any) -> None:
    """One Ray instance for every check (Ray's start is most of the time): the answers, both replicas serving
    and exporting metrics, an async job; then a client that leaves a stream (the replica's generator is
    closed), a replica killed with ``ray.kill`` while jobs are accepted (replaced, no job lost), and a second
    application that Ray autoscales from 1 to 2 replicas under a bounded load."""
    pytest.importorskip("ray.serve", reason='Ray Serve is the "ray" extra (the dev extra installs it)')
    if os.geteuid() != 0 or not _namespaces_work():
        pytest.skip("Ray runs in a private network namespace here (unshare as root), and none can be made")
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/test installs it)")
    started = project.parent / "started"
    started.mkdir()
    autoscaled = write_project(project.parent / "autoscaled", {"model.py": NAP, "modelserve.yaml": AUTOSCALED})
    redis = f"redis-server --port {REDIS_PORT} --bind 127.0.0.1 --save '' --appendonly no --daemonize yes"
    script = f'ip link set lo up && {redis} >/dev/null && exec "$0" "$@"'
    run = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "sh", "-c", script]
        + [
            sys.executable,
            str(DRIVER),
            str(project),
            json.dumps({"num_replicas": 2, "metrics_interval_s": 1}),
            json.dumps(REQUESTS),
            json.dumps(
                {
                    "marker": str(project.parent / "drip-ended"),
                    "jobs": 6,
                    "started": str(started),
                    "autoscale": [str(autoscaled), NAPS],
                }
            ),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=240,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stdout[-3000:] + run.stderr[-6000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))

    assert len(result["pids"]) == 2  # both replicas answered
    assert len(result["metrics"]) == 2  # and the metrics of each reached Ray's metrics export
    assert result["job"]["status"] == "completed", result["job"]  # submitted, run and polled through the proxy
    assert result["job"]["result"]["text"] == "x"
    assert result["stream_end"] == "closed"  # the client left: Ray's proxy and modelserve closed the stream
    # a replica killed while it ran a job and more were accepted: Ray replaced it, and every job ran to its end
    assert result["killed"] not in result["replicas_after"] and len(result["replicas_after"]) == 2, result
    assert [job["status"] for job in result["jobs"]] == ["completed"] * 6, result["jobs"]
    assert [job["result"]["text"] for job in result["jobs"]] == [str(index) for index in range(6)]
    interrupted = [job for job in result["jobs"] if result["starts"][job["result"]["text"]][0] == result["killed_pid"]]
    assert interrupted, result  # the killed replica was running one: it was requeued when its lease expired
    assert all(job["result"]["pid"] != result["killed_pid"] for job in interrupted)  # and run by a replica alive
    # the second application, autoscaled by its modelserve.yaml: one replica, two under the load, every nap answered
    scaled = result["autoscale"]
    assert scaled["replicas_before"] == 1 and scaled["replicas_most"] == 2, scaled
    assert len(scaled["statuses"]) >= NAPS and set(scaled["statuses"]) == {200}, scaled
    assert len(scaled["pids"]) == 2, scaled  # the replica the load added took some of it

    direct = start_server(project, "--jobs-store", "memory")  # python -m modelserve, the same project
    direct.wait_ready()
    expected = []
    for method, path, body, headers in REQUESTS:
        answer = httpx.request(method, direct.url + path, content=body, headers=headers)
        expected.append([answer.status_code, answer.headers.get("content-type"), answer.text])
    statuses = [status for status, _, _ in result["answers"]]
    assert statuses == [400, 413, 500, 200, 404, 200, 200, 200]
    for (status, kind, text), (want_status, want_kind, want_text) in zip(result["answers"], expected, strict=True):
        assert (status, kind) == (want_status, want_kind)
        assert _without_request_id(text) == _without_request_id(want_text)
    assert "request_id" in json.loads(result["answers"][2][2])  # the 500 names the request, not the traceback


NAP = """
import os
import time

class Nap:
    def predict(self, inputs):
        time.sleep(0.5)
        return {"pid": os.getpid()}
"""
#: Autoscaled from Ray's options in modelserve.yaml: 1 to 2 replicas, one request each at a time (the target),
#: metrics every 0.2 s and no upscale delay, so that a few seconds of load are enough. No CPU reserved: the
#: first application's two replicas hold the driver's two.
AUTOSCALED = """
ray:
  autoscaling_config:
    {min_replicas: 1, max_replicas: 2, target_ongoing_requests: 1, upscale_delay_s: 0, look_back_period_s: 1,
     metrics_interval_s: 0.2}
  max_ongoing_requests: 2
  ray_actor_options: {num_cpus: 0}
apis:
  - {name: nap, handler: {path: model.py, class: Nap}}
"""
NAPS = 16


FAILING = """
class Model:
    def load(self):
        raise OSError("weights.bin is missing")

    def predict(self, inputs):
        return inputs
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def settings(**changes: Any) -> dict[str, Any]:
    values: dict[str, Any] = {"jobs_store": None, "workers": 1, "api_key_env": None, "cors_origins": [], "docs": True}
    return {**values, "graceful_timeout": 1.0, "metrics_interval_s": 0, **changes}


@pytest.mark.anyio
async def test_a_replica_takes_traffic_once_loaded_and_fails_with_the_load_error(tmp_path: Path) -> None:
    """`Replica` without Ray: its constructor returns once the project loaded (Ray routes to it from then
    on), or raises modelserve's error, which Ray shows as the replica's failure."""
    from modelserve.errors import LoadError
    from modelserve.ray import Replica

    good = write_project(tmp_path / "good", {"model.py": "class Model:\n    def predict(self, x):\n        return x\n"})
    replica = Replica.__new__(Replica)
    await Replica.__init__(replica, str(good), settings())
    assert replica.__serve_build_asgi_app__().app.server.ready
    replica.check_health()
    await replica.__serve_build_asgi_app__().app.server.close()

    bad = write_project(tmp_path / "bad", {"model.py": FAILING})
    with pytest.raises(LoadError, match="failed to load in this replica: .*weights.bin is missing"):
        await Replica.__init__(Replica.__new__(Replica), str(bad), settings())


def test_serve_run_prints_a_mistake_on_one_line(tmp_path: Path) -> None:
    """``serve run`` calls the builder before it starts Ray: a mistake is its one-line error, no traceback."""
    pytest.importorskip("ray.serve", reason='Ray Serve is the "ray" extra (the dev extra installs it)')
    serve = Path(sys.executable).with_name("serve")
    command = [str(serve), "run", "modelserve.ray:app", f"project={tmp_path / 'nowhere'}", "num_replica=2"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode != 0
    assert "Error: modelserve.ray: unknown argument 'num_replica'" in run.stderr
    assert "Traceback" not in run.stderr + run.stdout
