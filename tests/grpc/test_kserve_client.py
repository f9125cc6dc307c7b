"""kserve's own gRPC client (`kserve.InferenceGRPCClient`) against a real modelserve gRPC server.

kserve is not in the ``dev`` extra: kserve 0.21 requires ``protobuf<7`` while ``grpcio-health-checking`` 1.85
(the ``grpc`` extra) requires ``protobuf>=7.35.1``, and it brings kubernetes, pandas and FastAPI (about 70
packages, 450 MB, 3.5 minutes to install into a fresh venv on the 2-core machine). The client therefore runs in
a subprocess (tests/data/kserve/grpc_client.py) with the interpreter named by ``KSERVE_PYTHON`` (a venv of its
own: ``python -m venv /tmp/kserve && /tmp/kserve/bin/pip install kserve``), or with this one when it has
kserve; the test is skipped when neither has it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, write_project
from tests.grpc.test_grpc import served
from tests.http.test_triton_examples import simple_onnx

CLIENT = REPO / "tests" / "data" / "kserve" / "grpc_client.py"


def kserve_python() -> str:
    python = os.environ.get("KSERVE_PYTHON") or sys.executable
    found = subprocess.run([python, "-c", "import kserve"], capture_output=True, timeout=120)
    if found.returncode != 0:
        pytest.skip(f"kserve is not installed for {python} (set KSERVE_PYTHON to a venv that has it)")
    return python


@pytest.fixture
def address(tmp_path: Path) -> Iterator[str]:
    root = write_project(tmp_path, {"modelserve.yaml": "apis:\n  - name: simple\n    model: {path: simple.onnx}\n"})
    simple_onnx(root / "simple.onnx")
    with served(root) as (_, grpc_address):
        yield grpc_address


def test_kserve_s_grpc_client_infers_raw_and_typed_and_gets_not_found(address: str) -> None:
    python = kserve_python()
    done = subprocess.run([python, str(CLIENT), address], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert (got["live"], got["ready"], got["model_ready"]) == (True, True, True)
    a = list(range(16))
    for binary in ("True", "False"):
        assert got[f"binary={binary}"] == {
            "id": f"kserve-{binary}",
            "model": "simple",
            "outputs": {"OUTPUT0": [[x + 1 for x in a]], "OUTPUT1": [[x - 1 for x in a]]},
        }
    assert got["unknown"] == ["NOT_FOUND", "Request for unknown model: 'nothing' is not found"]
