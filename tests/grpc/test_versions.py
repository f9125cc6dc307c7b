"""Model versions over gRPC: each served version by its number, the highest without one, metadata listing them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from tests.grpc.test_grpc import grpc_served
from tests.http.test_repository import versioned_project

grpcclient = pytest.importorskip("tritonclient.grpc")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with grpc_served(versioned_project(tmp_path_factory.mktemp("grpc_versions"))) as address:
        triton = grpcclient.InferenceServerClient(address)
        yield triton
        triton.close()


def plus(client: Any, name: str, version: str = "") -> tuple[float, str]:
    x = grpcclient.InferInput("x", [1], "FP32")
    x.set_data_from_numpy(np.array([10], np.float32))
    result = client.infer(name, [x], model_version=version)
    return float(result.as_numpy("y")[0]), result.get_response().model_version


def test_each_version_by_its_number(client: Any) -> None:
    assert [plus(client, "every", v) for v in ("1", "2", "3")] == [(11.0, "1"), (12.0, "2"), (13.0, "3")]
    assert plus(client, "every") == (13.0, "3") and plus(client, "chosen") == (13.0, "3")
    assert client.get_model_metadata("every").versions == ["1", "2", "3"]
    assert client.get_model_metadata("chosen", "1").versions == ["1", "3"]
    assert client.is_model_ready("chosen", "3") and not client.is_model_ready("chosen", "2")
    stats = client.get_inference_statistics("every", "2").model_stats
    assert [(entry.name, entry.version) for entry in stats] == [("every", "2")]


@pytest.mark.parametrize(("name", "version"), [("latest", "2"), ("chosen", "2"), ("every", "x")])
def test_a_version_not_served_is_not_found(client: Any, name: str, version: str) -> None:
    with pytest.raises(InferenceServerException) as error:
        plus(client, name, version)
    assert error.value.status() == "StatusCode.NOT_FOUND"
    assert f"Request for unknown model: '{name}' version {version} is not found" in error.value.message()
