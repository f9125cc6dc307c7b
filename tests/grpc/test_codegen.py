"""The vendored protocol's generated modules are what `scripts/grpc_codegen.py` makes of the .proto files."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytest.importorskip("grpc_tools")

PROTO = REPO / "modelserve" / "grpc" / "_proto"
#: The generator the checked-in modules came from (the dev extra pins it): another protoc writes other bytes.
PINNED = "1.76.0"


def test_regenerating_the_protocol_modules_changes_nothing(tmp_path: Path) -> None:
    installed = importlib.metadata.version("grpcio-tools")
    if installed != PINNED:
        pytest.skip(f"grpcio-tools {installed} is installed; the modules were generated with {PINNED}")
    subprocess.run([sys.executable, str(REPO / "scripts" / "grpc_codegen.py"), str(tmp_path)], check=True)
    for name in ("grpc_service_pb2.py", "model_config_pb2.py"):
        assert (tmp_path / name).read_text() == (PROTO / name).read_text(), (
            f"{name} differs: run scripts/grpc_codegen.py"
        )


def test_the_modules_use_a_pool_of_their_own_beside_tritonclient() -> None:
    """tritonclient defines the same inference.* messages in protobuf's default pool: both load in one process."""
    code = (
        "import tritonclient.grpc.service_pb2 as theirs\n"
        "from modelserve.grpc._proto import grpc_service_pb2 as ours\n"
        "request = ours.ModelInferRequest(model_name='m', raw_input_contents=[b'x'])\n"
        "print(theirs.ModelInferRequest.FromString(request.SerializeToString()).model_name)\n"
    )
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "m"
