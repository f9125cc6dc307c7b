"""What docs/batching.md and docs/runtimes.md promise, held to a real server where no other test checked exactly
that claim: admission and the waiting line of a batched API, what ``GET /<api>`` says of batching, and the 400s
for values a model's inputs cannot take (decided before numpy makes an array the body could inflate)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
import orjson
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper

from modelserve.config import parse_project
from modelserve.errors import ConfigError
from tests.batch_models import _busy_zero, _calibrated
from tests.conftest import write_project
from tests.models import IRIS_B, IRIS_W, iris_expected, iris_onnx, save_model, two_inputs_onnx

MODEL = """
import time
from pathlib import Path

import numpy as np
from pydantic import BaseModel


class Model:
    def predict(self, batch):
        with open("batches.log", "a") as log:
            log.write(f"{len(batch)}\\n")
        deadline = time.monotonic() + 20  # bounds a failing test
        while any(item.get("hold") for item in batch) and not Path("release").exists():
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        if any(item.get("array") for item in batch):
            return np.arange(len(batch))  # not a list
        return [{"x": item["x"]} for item in batch]


class Point(BaseModel):
    x: int


class Typed:
    def preprocess(self, inputs: Point):
        return inputs.x

    def predict(self, batch):
        return [{"doubled": x * 2} for x in batch]


class Streams:
    async def preprocess(self, inputs):
        return inputs["x"]

    def predict(self, batch):
        with open("streams.log", "a") as log:
            log.write(f"{len(batch)}\\n")
        time.sleep(0.05)  # long enough for the next requests to form a batch
        return [{"x": x, "batch": len(batch)} for x in batch]

    def postprocess(self, result):
        for i in range(3):
            yield {"x": result["x"], "chunk": i}


class TypedPredict:
    def predict(self, batch: list[Point]):
        return [{"received": type(item).__name__} for item in batch]
"""


def _classifier(path: Path, trips: int) -> Path:
    """What sklearn-onnx makes of a classifier: input float32 [batch, 4] -> label int64 [batch] and
    output_probability, a sequence of one {label: probability} map per row (ZipMap); each call takes `trips`
    rounds of `_busy_zero`, so that concurrent requests pile up while one runs."""
    nodes, weights = _busy_zero("input", trips)
    graph = helper.make_graph(
        [
            *nodes,
            helper.make_node("MatMul", ["input", "W"], ["logits0"]),
            helper.make_node("Add", ["logits0", "B"], ["logits1"]),
            helper.make_node("Add", ["logits1", "busy_zero"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
            helper.make_node("ArgMax", ["logits"], ["label"], axis=-1, keepdims=0),
            helper.make_node(
                "ZipMap", ["probabilities"], ["output_probability"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2]
            ),
        ],
        "classifier",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
            helper.make_value_info(
                "output_probability",
                helper.make_sequence_type_proto(
                    helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))
                ),
            ),
        ],
        [*weights, numpy_helper.from_array(IRIS_W, "W"), numpy_helper.from_array(IRIS_B, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def identity_onnx(path: Path, dtype: int) -> Path:
    """i [batch] of `dtype` -> out, the same."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["i"], ["out"])],
        "identity",
        [helper.make_tensor_value_info("i", dtype, ["batch"])],
        [helper.make_tensor_value_info("out", dtype, ["batch"])],
    )
    return save_model(graph, path)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs-claims-batching")
    iris_onnx(root / "iris.onnx")
    two_inputs_onnx(root / "two.onnx")
    _calibrated(_classifier, root / "classifier.onnx", 0.04, {"input": np.zeros((1, 4), dtype=np.float32)})
    for name, dtype in (("string", TensorProto.STRING), ("int", TensorProto.INT64), ("bool", TensorProto.BOOL)):
        identity_onnx(root / f"{name}.onnx", dtype)
    return write_project(
        root,
        {
            "model.py": MODEL,
            "modelserve.yaml": """
                apis:
                  - name: held
                    handler: {path: model.py}
                    max_queue_length: 1
                    max_queue_wait: false
                    batching: {max_batch_size: 2}
                  - name: defaults
                    handler: {path: model.py}
                    batching: {}
                  - name: streams
                    handler: {path: model.py, class: Streams}
                    batching: {max_batch_size: 8}
                  - name: typed
                    handler: {path: model.py, class: Typed}
                    batching: {max_batch_size: 4}
                  - name: typed-predict
                    handler: {path: model.py, class: TypedPredict}
                    batching: {max_batch_size: 4}
                  - name: iris
                    model: {path: iris.onnx}
                  - name: two
                    model: {path: two.onnx}
                  - name: classifier
                    model: {path: classifier.onnx, intra_op_threads: 1}
                    max_queue_length: 100
                    batching: {max_batch_size: 8}
                  - name: string
                    model: {path: string.onnx}
                  - name: int
                    model: {path: int.onnx}
                  - name: bool
                    model: {path: bool.onnx}
            """,
        },
    )


@pytest.fixture(scope="module")
def server(project: Path, start_server_module: Any) -> Any:
    server = start_server_module(project)
    server.wait_ready()
    return server


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


# --------------------------------------------------------------------------------------------------
# docs/batching.md: admission, the waiting line, GET /<api>


def test_a_batched_api_admits_a_batch_more_than_it_runs_then_its_line_then_503(server: Any, project: Path) -> None:
    """'Admission counts (max_concurrency + 1) x max_batch_size requests as in flight [...] max_queue_length more
    may wait; beyond that, 503.' With max_batch_size 2 and max_queue_length 1: 4 in flight, 1 waiting, the
    sixth refused; the others get their own answers once the model goes on."""

    async def scenario() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            first = [asyncio.ensure_future(http.post("/held", json={"x": x, "hold": True})) for x in range(5)]
            # 4 admitted (running or forming the next batch), 1 waiting in the line
            lines = {'modelserve_requests_in_flight{api="held"} 4.0', 'modelserve_requests_waiting{api="held"} 1.0'}
            deadline = time.monotonic() + 30  # bounds a failing test; a passing one waits for the server alone
            while not lines <= set((await http.get("/metrics")).text.splitlines()):
                assert time.monotonic() < deadline, server.log
                await asyncio.sleep(0.01)
            refused = await http.post("/held", json={"x": 5, "hold": True})
            (project / "release").touch()
            return [refused, *await asyncio.gather(*first)]

    refused, *answers = asyncio.run(scenario())
    assert refused.status_code == 503
    assert refused.headers["retry-after"]
    assert refused.json()["request_id"] == refused.headers["x-request-id"]
    assert [answer.json() for answer in answers] == [{"x": x} for x in range(5)]
    sizes = [int(line) for line in (project / "batches.log").read_text().split()]
    assert sum(sizes) == 5 and max(sizes) <= 2


@pytest.mark.parametrize(("api", "size"), [("held", 2), ("defaults", 8)])
def test_get_shows_a_model_class_apis_batching(client: httpx.Client, api: str, size: int) -> None:
    """A batched Model class's GET /<api> says it batches, with its settings (max_batch_size 8 and max_wait_ms 0
    by default, as the page's configuration says) and the requests waiting for a batch, as a model file's does."""
    batching = client.get(f"/{api}").json()["batching"]
    assert batching == {"max_batch_size": size, "max_wait_ms": 0.0, "waiting": 0}


def test_get_shows_no_batching_for_an_api_without_it(client: httpx.Client) -> None:
    assert client.get("/iris").json()["batching"] is None


def test_a_predict_that_returns_no_list_fails_with_a_500_and_the_log_says_why(server: Any) -> None:
    """'A predict that returns [...] no list at all (a numpy array [...]) fails every request of that batch with a
    500, and the log says why'."""
    answer = httpx.post(server.url + "/defaults", json={"x": 1, "array": True})
    assert answer.status_code == 500
    assert answer.json()["request_id"] == answer.headers["x-request-id"]
    assert "got a list of 1 inputs and returned ndarray; it must return a list of the same length" in server.log


def test_the_typed_inputs_of_a_batched_model_class_are_those_of_preprocess(client: httpx.Client) -> None:
    """'Typed inputs are those of preprocess: a body that does not fit its annotation is a 400 for that request
    alone. An annotation of the batched predict validates nothing and converts nothing'."""
    assert client.post("/typed", json={"x": 3}).json() == {"doubled": 6}
    refused = client.post("/typed", json={"x": "three"})
    assert refused.status_code == 400
    assert refused.json()["detail"][0]["loc"] == ["x"]
    assert client.post("/typed-predict", json={"x": "three"}).json() == {"received": "dict"}


def test_async_and_generator_stages_run_as_in_any_api_around_a_batched_predict(server: Any, project: Path) -> None:
    """'With an async or generator preprocess/postprocess, those run as in any API and only predict is batched':
    each request streams its own chunks (NDJSON), from a predict that received lists."""
    answers = asyncio.run(post_many(server.url + "/streams", [{"x": x} for x in range(6)]))
    for x, answer in enumerate(answers):
        assert answer.headers["content-type"].startswith("application/x-ndjson")
        assert [orjson.loads(line) for line in answer.text.splitlines()] == [{"x": x, "chunk": i} for i in range(3)]
    sizes = [int(line) for line in (project / "streams.log").read_text().split()]
    assert sum(sizes) == 6 and max(sizes) > 1


def test_a_classifiers_sequence_output_is_split_by_rows_and_stacked(server: Any) -> None:
    """'every output is cut back into each request's rows': a sklearn-onnx classifier's probabilities are a
    sequence of one map per row, which has the batch's length; such a model ran every request alone, with a
    warning that its output had no batch dimension."""
    before = httpx.get(server.url + "/classifier").json()["batching"]
    rows = [[[5.1 + i / 8, 3.5, 1.4 + i / 4, 0.2]] for i in range(16)]
    answers = asyncio.run(post_many(server.url + "/classifier", rows))
    for row, answer in zip(rows, answers, strict=True):
        probabilities, label = iris_expected(row)
        assert answer.json()["label"] == label.tolist()
        (got,) = answer.json()["output_probability"]
        assert [got[key] for key in ("0", "1", "2")] == pytest.approx(probabilities[0].tolist(), rel=1e-5)
    after = httpx.get(server.url + "/classifier").json()["batching"]
    assert after["requests"] - before["requests"] == 16
    assert after["model_calls"] - before["model_calls"] < 16  # 40 ms a call: requests shared calls
    assert "has no batch dimension" not in server.log


def test_max_batch_size_counts_requests_not_rows(server: Any) -> None:
    """'max_batch_size counts requests, not rows': requests of 9 rows each, at max_batch_size 8, still share
    calls (each such call has 18 rows or more)."""
    before = httpx.get(server.url + "/classifier").json()["batching"]
    bodies = [[[5.0 + i, 3.0, 1.5, 0.2 + j / 10] for j in range(9)] for i in range(8)]
    answers = asyncio.run(post_many(server.url + "/classifier", bodies))
    for body, answer in zip(bodies, answers, strict=True):
        assert answer.json()["label"] == iris_expected(body)[1].tolist()
    after = httpx.get(server.url + "/classifier").json()["batching"]
    assert after["stacked_calls"] > before["stacked_calls"]
    assert after["model_calls"] - before["model_calls"] < 8


async def post_many(url: str, bodies: list[Any]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as http:
        return await asyncio.gather(*(http.post(url, json=body) for body in bodies))


# --------------------------------------------------------------------------------------------------
# docs/runtimes.md: values converted to each input's dtype; one that does not fit is a 400, never a 500


def post_json(client: httpx.Client, api: str, value: Any) -> httpx.Response:
    return client.post(f"/{api}", content=orjson.dumps(value), headers={"content-type": "application/json"})


@pytest.mark.parametrize(
    ("api", "value", "fragment"),
    [
        # numpy would make one string dtype as wide as the longest string of the list, for every item: these
        # bodies of ~1 MB asked for about 0.8 TB, a MemoryError answered 500 (and smaller ones got it).
        ("string", [""] * 200_000 + ["x" * 1_000_000, 1], "input 'i': expected string with shape [batch]"),
        ("int", [1] * 200_000 + ["x" * 1_000_000], "input 'i': expected int64 with shape [batch]"),
        ("bool", [1] * 200_000 + ["x" * 1_000_000], "input 'i': expected bool with shape [batch]"),
    ],
)
def test_a_long_string_among_many_items_is_a_400_not_an_inflated_array(
    client: httpx.Client, api: str, value: Any, fragment: str
) -> None:
    answer = post_json(client, api, value)
    assert answer.status_code == 400, answer.text[:300]
    assert fragment in answer.json()["error"]
    assert len(answer.content) < 1000  # the value is quoted short, never whole


@pytest.mark.parametrize(
    ("api", "value", "fragment"),
    [
        ("string", ["a", 1], "which holds a value that is not a string"),
        ("int", ["12", 3], "which holds a string, which is not a number"),
        ("int", [True, 3], "which holds true or false, which is not a number"),
        ("bool", ["true"], "which holds a value that is not true, false, 0 or 1"),
    ],
)
def test_strings_go_to_string_inputs_and_numbers_to_numeric_ones(
    client: httpx.Client, api: str, value: Any, fragment: str
) -> None:
    """'numbers to float or integer tensors, true/false/0/1 to bool, strings to string tensors'."""
    answer = post_json(client, api, value)
    assert answer.status_code == 400
    assert fragment in answer.json()["error"]


@pytest.mark.parametrize(
    ("api", "value", "expected"),
    [("string", ["a", "bc"], ["a", "bc"]), ("string", "solo", ["solo"]), ("int", [2.0, 3], [2, 3])],
)
def test_values_that_fit_are_converted(client: httpx.Client, api: str, value: Any, expected: Any) -> None:
    assert post_json(client, api, value).json() == {"out": expected}


@pytest.mark.parametrize(
    ("api", "content_type", "status", "answer"),
    [
        ("string", "text/plain", 200, {"out": ["hello"]}),
        ("iris", "text/plain", 400, "input 'input': expected float32 with shape [batch, 4]; received 'hello'"),
        ("two", "text/plain", 400, "expected an object keyed by the model's input names ('a' (float32 [null, 2])"),
        ("string", "application/octet-stream", 400, "expected a JSON body (Content-Type: application/json)"),
        ("iris", "application/x-www-form-urlencoded", 400, "expected a JSON body (Content-Type: application/json)"),
    ],
)
def test_a_text_body_is_one_string_and_other_bodies_are_refused(
    client: httpx.Client, api: str, content_type: str, status: int, answer: Any
) -> None:
    """'A text/* body is one string: the value of a model's single input'; a body neither JSON nor text gets
    'expected a JSON body'."""
    got = client.post(f"/{api}", content=b"hello", headers={"content-type": content_type})
    assert got.status_code == status
    if status == 200:
        assert got.json() == answer
    else:
        assert got.json()["error"].startswith(answer)


def test_a_float_input_reads_a_string_that_spells_a_number(client: httpx.Client) -> None:
    """docs/runtimes.md and docs/compatibility.md: `"5.1"` is read as numpy reads it; `"x"` is a 400."""
    assert (
        post_json(client, "iris", [["5.1", 3.5, 1.4, 0.2]]).json()
        == post_json(client, "iris", [[5.1, 3.5, 1.4, 0.2]]).json()
    )
    refused = post_json(client, "iris", [["x", 3.5, 1.4, 0.2]])
    assert refused.status_code == 400
    assert "input 'input'" in refused.json()["error"]


def test_a_message_from_numpy_quotes_the_value_short(client: httpx.Client) -> None:
    """The 400 names the input and what was wrong; numpy's own message, which quotes the value whole, is cut
    short (a string of 5 MB was sent back whole)."""
    answer = post_json(client, "iris", [[1.0, 2.0, 3.0, "x" * 1_000_000]])
    assert answer.status_code == 400
    assert answer.json()["error"].startswith("input 'input': expected float32 with shape [batch, 4]; received")
    assert len(answer.content) < 1000


def test_a_model_with_a_handler_class_is_a_cortex_handler_without_batching(tmp_path: Path) -> None:
    """'With handler.class as well, the API is no longer a model API with hooks: the class is served as a Cortex
    TensorFlow/ONNX handler [...], and batching and inline_threshold_ms do not apply to it.'"""
    iris_onnx(tmp_path / "iris.onnx")
    write_project(tmp_path, {"handler.py": "class Handler:\n    pass\n"})
    api = "apis:\n  - name: a\n    model: {path: iris.onnx%s}\n    handler: {path: handler.py, class: Handler}\n"
    assert parse_project(yaml.safe_load(api % ""), tmp_path).apis[0].backend == "cortex_handler"
    with pytest.raises(ConfigError) as refused:
        parse_project(yaml.safe_load(api % ", inline_threshold_ms: 2" + "    batching: {}\n"), tmp_path)
    assert "key 'batching' applies to a Model class or a model file" in str(refused.value)
    assert "key 'inline_threshold_ms' applies to a model file served with hooks or none" in str(refused.value)


@pytest.mark.parametrize(
    ("api", "datatype", "data", "fragment"),
    [
        ("int", "INT64", [1] * 200_000 + ["x" * 1_000_000], "'data' of a INT64 tensor must be integers, not strings"),
        ("bool", "BOOL", [True] * 200_000 + ["x" * 1_000_000], "'data' of a BOOL tensor must be true or false"),
        ("iris", "FP32", [1.0] * 3 + ["x" * 1_000_000], "input 'input': 'data' is not a list of FP32 values"),
    ],
)
def test_the_v2_route_of_a_model_file_refuses_a_long_string_with_a_short_400(
    client: httpx.Client, api: str, datatype: str, data: list[Any], fragment: str
) -> None:
    """The same model's V2 route: numpy made the INT64 and BOOL data one string array as wide as the long string
    (a 500), and an FP32 400 quoted the string whole."""
    shape = [1, 4] if api == "iris" else [len(data)]
    body = {"inputs": [{"name": "input" if api == "iris" else "i", "datatype": datatype, "shape": shape, "data": data}]}
    answer = post_json(client, f"v2/models/{api}/infer", body)
    assert answer.status_code == 400, answer.text[:300]
    assert fragment in answer.json()["error"]
    assert len(answer.content) < 1000


@pytest.mark.parametrize(
    ("type_name", "said"),
    [
        ("tensor(bfloat16)", "input 'x' is a tensor of bfloat16, a dtype numpy lacks"),
        ("seq(tensor(float))", "input 'x' is of type seq(tensor(float)), not a tensor"),
    ],
)
def test_an_input_modelserve_cannot_convert_to_is_refused_naming_it(type_name: str, said: str) -> None:
    """'A model with an input of a dtype numpy lacks (bfloat16 [...]) or an input that is not a tensor [...] is
    refused when the API loads, with an error that names the input' (a bfloat16 tensor was said to be none)."""
    from modelserve.runtimes._tensors import InputConverter, TensorSpec

    with pytest.raises(TypeError) as refused:
        InputConverter([TensorSpec("x", None, ("batch",), type_name)])
    assert str(refused.value).startswith(said)


def test_the_tensorflow_thread_settings_one_api_loses_are_named_in_a_warning(tmp_path: Path, start_server: Any) -> None:
    """'with two TensorFlow APIs in one project (they load at once), the settings of the one whose model loads
    first win, and a warning names the other's as ignored': both were set, silently, the last before the
    runtime started winning."""
    pytest.importorskip("tensorflow")
    import shutil

    from tests.models import iris_saved_model

    iris_saved_model(tmp_path / "first")
    shutil.copytree(tmp_path / "first", tmp_path / "second")
    project = write_project(
        tmp_path,
        {
            "modelserve.yaml": """
                apis:
                  - name: first
                    model: {path: first, intra_op_threads: 1}
                  - name: second
                    model: {path: second, intra_op_threads: 2}
            """
        },
    )
    server = start_server(project)
    server.wait_ready()
    ignored = [line for line in server.log.splitlines() if "are ignored" in line]
    assert len(ignored) == 1, server.log
    first, second = "of first are ignored", "of second are ignored"
    said = ignored[0]
    assert (first in said and "set for second" in said) or (second in said and "set for first" in said)
