"""``modelserve --grpc-port``, ``--model-control explicit`` and ``--load-model``: the real command, and the
snippets of docs/grpc.md and docs/v2.md as written."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import REPO, free_port, write_project
from tests.http.test_repository import plus_onnx, versioned_project
from tests.test_cli import second_worker_waits

grpc = pytest.importorskip("grpc")
grpcclient = pytest.importorskip("tritonclient.grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
service_pb2_grpc = pytest.importorskip("tritonclient.grpc.service_pb2_grpc")
health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
health_pb2_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")


def page(name: str) -> str:
    return (REPO / "docs" / name).read_text(encoding="utf-8")


def block(text: str, language: str, index: int = 0) -> str:
    return textwrap.dedent(re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)[index])


def test_the_grpc_page_snippets_against_the_iris_onnx_example(start_server: Any) -> None:
    command = block(page("grpc.md"), "bash").strip()
    assert command == "python -m modelserve examples/iris-onnx --grpc-port 8001"
    port = free_port()
    server = start_server(REPO / "examples" / "iris-onnx", "--grpc-port", str(port), "--no-access-log")
    server.wait_ready()
    code = block(page("grpc.md"), "python").replace("localhost:8001", f"127.0.0.1:{port}")
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/grpc.md", "exec"), namespace)  # noqa: S102 - our own docs
    assert namespace["result"].as_numpy("label").tolist() == [0]
    namespace["client"].close()


def test_with_workers_server_ready_and_health_wait_for_every_worker(start_server: Any, tmp_path: Path) -> None:
    """With --workers N every worker serves the gRPC port: ServerReady and the health service say ready only
    once every worker has loaded, as /readyz does. Before, a worker that had loaded said so alone."""
    root, gate = second_worker_waits(tmp_path)
    port = free_port()
    server = start_server(root, "--workers", "2", "--grpc-port", str(port))
    serving = health_pb2.HealthCheckResponse.SERVING

    def asked() -> tuple[bool, int, bool] | None:
        """On a new connection (so to either worker): (its model ready, the health of "", ServerReady)."""
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            try:
                ready = stub.ModelReady(service_pb2.ModelReadyRequest(name="model"), timeout=5).ready
                health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
                return ready, health.status, stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=5).ready
            except grpc.RpcError:  # not listening yet
                return None

    answer = None
    deadline = time.monotonic() + 60
    while (answer is None or not answer[0]) and time.monotonic() < deadline:  # until the loaded worker answers
        answer = asked()
    assert answer == (True, health_pb2.HealthCheckResponse.NOT_SERVING, False)

    gate.touch()
    server.wait_ready()
    deadline = time.monotonic() + 30  # each worker reads the others' state twice a second
    streak = 0  # answers in a row, new connections each, from either worker
    while streak < 10:
        assert time.monotonic() < deadline, answer
        answer = asked()
        streak = streak + 1 if answer == (True, serving, True) else 0


def test_model_control_explicit_from_the_command_line(start_server: Any, tmp_path: Path) -> None:
    port = free_port()
    root = versioned_project(tmp_path)
    server = start_server(root, "--grpc-port", str(port), "--model-control", "explicit", "--load-model", "latest")
    server.wait_ready(timeout=90)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    assert client.is_model_ready("latest") and not client.is_model_ready("every")
    client.load_model("every")
    assert client.is_model_ready("every", "2")
    assert httpx.get(f"{server.url}/v2/models/every/versions/2/ready").json()["ready"] is True
    client.close()


def test_load_model_needs_explicit_model_control(tmp_path: Path) -> None:
    root = versioned_project(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "modelserve", str(root), "--load-model", "latest"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 2 and "--load-model needs --model-control explicit" in done.stderr


def test_the_versions_snippet_of_the_v2_page_is_a_valid_project(tmp_path: Path) -> None:
    from modelserve.config import load_project_config

    text = page("v2.md")
    section = text.split("## Model versions", 1)[1]
    layout = [line.split("#")[0].strip() for line in block(section, "text").splitlines()[1:]]
    for entry in layout:
        plus_onnx(tmp_path / "models" / "plus" / entry, float(entry.split("/")[0]))
    write_project(tmp_path, {"modelserve.yaml": block(section, "yaml")})
    project = load_project_config(tmp_path)
    model = project.apis[0].model
    assert model is not None and model.version_policy is not None
    assert model.version_policy.describe() == "all"
    assert yaml.safe_load(block(section, "yaml"))["apis"][0]["model"]["path"] == "models/plus"


def test_grpc_serves_tls_with_the_https_certificate(start_server: Any, tmp_path: Path) -> None:
    import time

    from tests.http.test_tls import make_certificates

    ca, certificate, key = make_certificates(tmp_path, password=None)
    root = versioned_project(tmp_path / "project")
    port = free_port()
    server = start_server(root, "--grpc-port", str(port), "--ssl-certfile", str(certificate), "--ssl-keyfile", str(key))
    client = grpcclient.InferenceServerClient(f"localhost:{port}", ssl=True, root_certificates=str(ca))
    deadline = time.monotonic() + 60
    while True:
        try:
            if client.is_server_ready():
                break
        except Exception:
            assert server.process.poll() is None, server.log
        assert time.monotonic() < deadline, server.log
        time.sleep(0.1)
    assert client.get_model_metadata("latest").versions == ["3"]
    client.close()
    plain = grpcclient.InferenceServerClient(f"localhost:{port}")
    with pytest.raises(Exception):  # noqa: B017 - a plain-text client cannot talk to the TLS port
        plain.is_server_live(client_timeout=5)
    plain.close()


def test_without_grpcio_the_error_says_what_to_install() -> None:
    code = (
        "import sys\n"
        "sys.modules['grpc'] = None\n"
        "from modelserve.grpc import require\n"
        "try:\n"
        "    require()\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.stdout.startswith("MissingExtraError grpc is not installed"), done.stdout + done.stderr
    assert 'pip install -e ".[grpc]"' in done.stdout


def test_the_grpc_page_benchmark_command_names_its_options() -> None:
    command = block(page("grpc.md"), "bash", 1).strip()
    words = command.split()
    assert words[:2] == ["python", "benchmarks/grpc_infer.py"]
    usage = subprocess.run([sys.executable, words[1], "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0, usage.stderr
    for option in words[2::2]:
        assert option in usage.stdout, option


def test_the_grpc_page_in_process_benchmark_command_names_its_options() -> None:
    command = block(page("grpc.md"), "bash", 2).strip()
    words = command.split()
    assert words[:3] == ["python", "benchmarks/grpc_infer.py", "--in-process"]
    usage = subprocess.run([sys.executable, words[1], "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 0, usage.stderr
    for option in (word for word in words[2:] if word.startswith("--")):
        assert option in usage.stdout, option
