"""docs/grpc.md held to a real server: the error map (user code's HTTPException, a 500's request id), API keys
with ``auth.apis`` for a name that is no model's, inputs in shared memory, the health service (an unknown name,
bytes that are not a request, two watchers of one name) and what is not served (reflection, Triton's
scheduling parameters). One server for the module, model control explicit, with ``later`` left unloaded."""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import REPO, write_project
from tests.grpc.test_grpc import raw_call, served

grpc = pytest.importorskip("grpc")
grpcclient = pytest.importorskip("tritonclient.grpc")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")
health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
health_pb2_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

PROJECT = """
auth:
  api_keys_env: GRPC_DOCS_KEYS
  apis: [guarded]
apis:
  - {name: open, handler: {path: model.py, class: Doubles}, max_body_size: 65536}
  - {name: guarded, handler: {path: model.py, class: Doubles}, max_body_size: 65536}
  - {name: raiser, handler: {path: model.py, class: Raiser}, max_body_size: 65536}
  - {name: later, handler: {path: model.py, class: Doubles}, max_body_size: 65536}
  - {name: small, handler: {path: model.py, class: Doubles}, max_body_size: 100}
  - {name: sleeper, handler: {path: model.py, class: Sleeper}, max_body_size: 65536, timeout: 0.2}
  - name: batched
    handler: {path: model.py, class: BatchDoubles}
    max_body_size: 65536
    batching: {max_batch_size: 8, max_wait_ms: 1}
"""

MODEL = """
import asyncio

from starlette.exceptions import HTTPException


class Doubles:
    v2_inputs = [{"name": "x", "datatype": "FP32", "shape": [-1]}]

    def predict(self, inputs):
        return {"y": inputs["x"] * 2}


class Sleeper:
    v2_inputs = [{"name": "x", "datatype": "FP32", "shape": [-1]}]

    async def predict(self, inputs):
        await asyncio.sleep(600)


class BatchDoubles:
    v2_inputs = [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}]
    v2_outputs = [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]

    def predict(self, batch):
        return [{"y": inputs["x"] * 2} for inputs in batch]


class Raiser:
    v2_inputs = [{"name": "status", "datatype": "INT32", "shape": [1]}]

    def predict(self, inputs):
        status = int(inputs["status"][0])
        if status == 500:
            raise RuntimeError("internals the caller must not see")
        raise HTTPException(status, f"refused with {status}")
"""

KEY = {"authorization": "Bearer docs-key"}
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(HTTP URL, gRPC address) of the module's server."""
    root = write_project(tmp_path_factory.mktemp("grpc-docs"), {"modelserve.yaml": PROJECT, "model.py": MODEL})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRPC_DOCS_KEYS", "docs-key")
        with served(root, load=["open", "guarded", "raiser", "small", "batched", "sleeper"]) as both:
            yield both


@pytest.fixture
def address(urls: tuple[str, str]) -> str:
    return urls[1]


@pytest.fixture
def client(address: str) -> Iterator[Any]:
    triton = grpcclient.InferenceServerClient(address)
    yield triton
    triton.close()


def x_input(values: list[float]) -> Any:
    x = grpcclient.InferInput("x", [len(values)], "FP32")
    x.set_data_from_numpy(np.asarray(values, np.float32))
    return x


def status_input(status: int) -> Any:
    value = grpcclient.InferInput("status", [1], "INT32")
    value.set_data_from_numpy(np.asarray([status], np.int32))
    return value


def stream_answers(client: Any, requests: list[tuple[str, Any, str]]) -> list[tuple[Any, Any]]:
    """Each (model, input, request id) sent on one ModelStreamInfer stream; the (result, error) of each."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for model, tensor, request_id in requests:
        client.async_stream_infer(model, [tensor], request_id=request_id)
    got = [answers.get(timeout=30) for _ in requests]
    client.stop_stream()
    return got


# ------------------------------------------------------------------------------------------------
# errors


def _page_error_table() -> list[tuple[int, str]]:
    page = (REPO / "docs" / "grpc.md").read_text()
    section = page.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    return [(int(http), code) for http, code in re.findall(r"^\| (\d{3}) \| `([A-Z_]+)` \|", section, re.M)]


def test_the_page_s_error_table_is_the_server_s_map() -> None:
    from modelserve.grpc.servicer import code_of

    table = _page_error_table()
    assert len(table) >= 10
    assert [(http, code_of(http).name) for http, _ in table] == table


@pytest.mark.parametrize(
    ("status", "code"),
    [(400, "INVALID_ARGUMENT"), (403, "PERMISSION_DENIED"), (422, "INVALID_ARGUMENT"), (429, "RESOURCE_EXHAUSTED")]
    + [(501, "UNIMPLEMENTED"), (503, "UNAVAILABLE")],
)
def test_user_code_s_http_exception_keeps_its_status_and_detail(client: Any, status: int, code: str) -> None:
    with pytest.raises(InferenceServerException) as error:
        client.infer("raiser", [status_input(status)])
    assert (error.value.status(), error.value.message()) == (f"StatusCode.{code}", f"refused with {status}")


def test_the_api_s_timeout_is_deadline_exceeded_and_an_unloaded_api_unavailable(client: Any) -> None:
    with pytest.raises(InferenceServerException) as error:
        client.infer("sleeper", [x_input([1.0])], client_timeout=60)
    assert error.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert error.value.message() == "the call took longer than the timeout of 0.2 s"
    with pytest.raises(InferenceServerException) as error:
        client.infer("later", [x_input([1.0])])
    assert error.value.status() == "StatusCode.UNAVAILABLE"
    assert error.value.message() == "api 'later' is unloaded; RepositoryModelLoad loads it"
    with pytest.raises(InferenceServerException) as error:
        client.get_model_metadata("later")
    assert error.value.message() == "api 'later' is unloaded; RepositoryModelLoad loads it"


def test_in_a_stream_an_http_exception_is_its_request_s_error_message(client: Any) -> None:
    (first, error), (second, _) = stream_answers(
        client, [("raiser", status_input(422), "a"), ("open", x_input([1.0]), "b")]
    )
    assert first is None and error.message() == "refused with 422"
    assert second.as_numpy("y").tolist() == [2.0]


def test_a_user_code_failure_is_internal_and_names_the_request_id(client: Any) -> None:
    with pytest.raises(InferenceServerException) as error:
        client.infer("raiser", [status_input(500)], request_id="docs-500")
    assert error.value.status() == "StatusCode.INTERNAL"
    assert "request id docs-500" in error.value.message() and "internals" not in error.value.message()
    with pytest.raises(InferenceServerException) as error:
        client.infer("raiser", [status_input(500)], headers={"x-request-id": "from-metadata"})
    assert "request id from-metadata" in error.value.message()
    with pytest.raises(InferenceServerException) as error:
        client.infer("raiser", [status_input(500)])
    assert re.search(r"request id [0-9a-f]{32}\)", error.value.message())
    [(result, failed)] = stream_answers(client, [("raiser", status_input(500), "docs-stream-500")])
    assert result is None and "request id docs-stream-500" in failed.message()


# ------------------------------------------------------------------------------------------------
# ModelConfig


def test_a_batching_model_s_config_dims_leave_the_batch_dimension_out(client: Any, urls: tuple[str, str]) -> None:
    """As in Triton's configuration: ``max_batch_size`` 8 and ``dims`` [2] for the metadata's shape [-1, 2]."""
    config = client.get_model_config("batched").config
    assert config.max_batch_size == 8
    assert [list(tensor.dims) for tensor in (*config.input, *config.output)] == [[2], [2]]
    assert client.get_model_metadata("batched").inputs[0].shape == [-1, 2]
    unbatched = client.get_model_config("open").config
    assert (unbatched.max_batch_size, list(unbatched.input[0].dims)) == (0, [-1])
    answer = httpx.get(f"{urls[0]}/v2/models/batched/config").json()
    assert (answer["max_batch_size"], answer["input"][0]["dims"]) == (8, [2])


# ------------------------------------------------------------------------------------------------
# API keys: with auth.apis, a name that is no model's needs a key, as an unknown path does over HTTP


CALLS = {
    "ModelInfer": lambda client, name, headers: client.infer(name, [x_input([1.0])], headers=headers),
    "ModelReady": lambda client, name, headers: client.is_model_ready(name, headers=headers),
    "ModelMetadata": lambda client, name, headers: client.get_model_metadata(name, headers=headers),
    "ModelStatistics": lambda client, name, headers: client.get_inference_statistics(name, headers=headers),
}


@pytest.mark.parametrize("method", list(CALLS))
def test_with_auth_apis_a_name_that_is_no_model_s_needs_a_key(client: Any, method: str) -> None:
    call = CALLS[method]
    for name in ("nothing", "guarded"):  # a caller without a key cannot tell a guarded model from no model
        with pytest.raises(InferenceServerException) as error:
            call(client, name, None)
        assert error.value.status() == "StatusCode.UNAUTHENTICATED", name
    if method == "ModelReady":
        assert call(client, "nothing", KEY) is False
    else:
        with pytest.raises(InferenceServerException) as error:
            call(client, "nothing", KEY)
        assert error.value.status() == "StatusCode.NOT_FOUND"
    assert call(client, "open", None)  # the models auth.apis leaves open need none


# ------------------------------------------------------------------------------------------------
# inputs


def test_an_input_in_shared_memory_is_refused_naming_it(client: Any, address: str) -> None:
    x = grpcclient.InferInput("x", [2], "FP32")
    x.set_shared_memory("region", 8)
    with pytest.raises(InferenceServerException) as error:
        client.infer("open", [x])
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert error.value.message() == "input 'x': shared memory is not supported by modelserve; send the data"
    request = service_pb2.ModelInferRequest(model_name="open")  # the region named beside the data itself
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[2])
    tensor.parameters["shared_memory_region"].string_param = "region"
    request.raw_input_contents.append(np.ones(2, np.float32).tobytes())
    with pytest.raises(grpc.RpcError) as refused:
        raw_call(address, "ModelInfer", request, service_pb2.ModelInferResponse)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "shared memory" in refused.value.details()


def test_triton_s_scheduling_parameters_are_ignored(client: Any) -> None:
    answer = client.infer("open", [x_input([1.5])], sequence_id=7, sequence_start=True, priority=1, timeout=1)
    assert answer.as_numpy("y").tolist() == [3.0]


def _doubled(name: str, count: int, request_id: str) -> Any:
    request = service_pb2.ModelInferRequest(model_name=name, id=request_id)
    request.inputs.add(name="x", datatype="FP32", shape=[count])
    request.raw_input_contents.append(np.ones(count, np.float32).tobytes())
    return request


def test_a_stream_goes_on_past_an_api_s_limit_and_ends_at_grpc_s(address: str) -> None:
    """gRPC's own limit is the largest max_body_size (64 KiB here); ``small`` takes 100 bytes."""
    requests = [_doubled("open", 2, "a"), _doubled("small", 40, "b"), _doubled("open", 2, "c")]
    requests += [_doubled("open", 20_000, "d"), _doubled("open", 2, "e")]
    answers = []
    with grpc.insecure_channel(address) as channel:
        stream = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as error:
            for response in stream(iter(requests), timeout=30):
                answers.append(response.infer_response.id or response.error_message)
    size = requests[1].ByteSize()
    assert answers == ["a", f"the request of {size} bytes is larger than the limit of 100 bytes", "c"]
    assert error.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_grpc_port_with_an_encrypted_key_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    from modelserve.cli import main

    project = str(REPO / "examples" / "iris-onnx")
    tls = ["--ssl-certfile", "cert.pem", "--ssl-keyfile", "key.pem", "--ssl-keyfile-password-env", "KEY_PASSWORD"]
    assert main([project, "--port", "18888", "--grpc-port", "18001", *tls]) == 2
    assert "modelserve: error: --grpc-port serves TLS with an unencrypted private key only" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------
# the health service


def test_check_of_an_unknown_name_is_not_found_naming_it(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        with pytest.raises(grpc.RpcError) as error:
            stub.Check(health_pb2.HealthCheckRequest(service="nothing"), metadata=list(KEY.items()))
        assert error.value.code() == grpc.StatusCode.NOT_FOUND and "'nothing'" in error.value.details()
        with pytest.raises(grpc.RpcError) as error:  # with keys on, a name that is no model's needs one
            stub.Check(health_pb2.HealthCheckRequest(service="nothing"))
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert stub.Check(health_pb2.HealthCheckRequest(service="open")).status == SERVING
        assert stub.Check(health_pb2.HealthCheckRequest(service="later")).status == NOT_SERVING


@pytest.mark.parametrize("method", ["Check", "Watch"])
def test_bytes_that_are_not_a_health_request_are_invalid_argument(address: str, method: str) -> None:
    with grpc.insecure_channel(address) as channel:
        path = f"/grpc.health.v1.Health/{method}"
        call = channel.unary_unary(path) if method == "Check" else channel.unary_stream(path)
        with pytest.raises(grpc.RpcError) as error:
            answer = call(b"\xff\xff", timeout=30)
            if method == "Watch":
                next(answer)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
        assert "HealthCheckRequest" in error.value.details()


def test_watch_of_an_unknown_name_is_service_unknown(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        request = health_pb2.HealthCheckRequest(service="nothing")
        watch = health_pb2_grpc.HealthStub(channel).Watch(request, metadata=list(KEY.items()))
        assert next(watch).status == SERVICE_UNKNOWN
        watch.cancel()


def test_a_watcher_is_told_of_a_change_after_another_watcher_of_its_name_left(address: str, client: Any) -> None:
    """Two callers watch ``later`` (unloaded); one leaves; a load makes it SERVING, and the other is told."""
    seen: queue.Queue[tuple[str, int]] = queue.Queue()
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        watches = {tag: stub.Watch(health_pb2.HealthCheckRequest(service="later")) for tag in ("leaves", "stays")}

        def follow(tag: str) -> None:
            try:
                for answer in watches[tag]:
                    seen.put((tag, answer.status))
            except grpc.RpcError:
                pass

        threads = [threading.Thread(target=follow, args=(tag,), daemon=True) for tag in watches]
        for thread in threads:
            thread.start()
        assert sorted(seen.get(timeout=30) for _ in watches) == [("leaves", NOT_SERVING), ("stays", NOT_SERVING)]
        watches["leaves"].cancel()
        time.sleep(0.2)  # let the server end the first watch before the change: the change must still be told
        client.load_model("later", headers=KEY)
        try:
            assert seen.get(timeout=30) == ("stays", SERVING)
        finally:
            client.unload_model("later", headers=KEY)
            watches["stays"].cancel()
            for thread in threads:
                thread.join(timeout=30)


# ------------------------------------------------------------------------------------------------
# not served


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_server_reflection_is_not_served(address: str, version: str) -> None:
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo")
        with pytest.raises(grpc.RpcError) as error:
            next(call(iter([b""]), timeout=30))
        assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED
