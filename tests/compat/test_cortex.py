"""Cortex projects served as they are: published cortex.yaml, hook, handler and predictor files (copied byte for
byte into tests/data/cortex, see SOURCES.md) with tiny stand-in models built here, each through a real server.

The only change to a published file is made here, in the open: a model path in cloud storage (``s3://...``),
which modelserve refuses (see test_a_cloud_model_path_is_a_config_error_saying_to_download_it), is replaced by
the local path of the stand-in model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import REPO
from tests.models import save_model

pytestmark = pytest.mark.slow

DATA = Path(__file__).parents[1] / "data" / "cortex"

#: Mean sepal length, sepal width, petal length, petal width of each species in Fisher's iris data: the stand-in
#: models are nearest-centroid classifiers (score_k = x . mu_k - |mu_k|^2 / 2), so that they answer what the
#: published examples document for their sample (setosa).
MEANS = np.array(
    [[5.006, 3.428, 1.462, 0.246], [5.936, 2.770, 4.260, 1.326], [6.588, 2.974, 5.552, 2.026]], dtype=np.float32
)
WEIGHTS = MEANS.T.copy()
BIAS = (-0.5 * (MEANS**2).sum(axis=1)).astype(np.float32)
FEATURES = ("sepal_length", "sepal_width", "petal_length", "petal_width")


def iris_onnx(path: Path, batch: Any) -> Path:
    """What sklearn-onnx / onnxmltools export for a classifier: input float32 [batch, 4] -> label int64 [batch],
    probabilities float32 [batch, 3]; `batch` is None (no name), a name, or a fixed size."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["input", "weights"], ["product"]),
            helper.make_node("Add", ["product", "bias"], ["scores"]),
            helper.make_node("ArgMax", ["scores"], ["label"], axis=1, keepdims=0),
            helper.make_node("Softmax", ["scores"], ["probabilities"], axis=1),
        ],
        "iris",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 4])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, [batch]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [batch, 3]),
        ],
        [numpy_helper.from_array(WEIGHTS, "weights"), numpy_helper.from_array(BIAS, "bias")],
    )
    return save_model(graph, path)


def iris_estimator_saved_model(path: Path) -> Path:
    """What Cortex's iris TensorFlow example exported (an Estimator): one float32 [None] input per measurement
    -> class_ids int64 [None, 1], probabilities float32 [None, 3]."""
    import tensorflow as tf

    class Iris(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name=name) for name in FEATURES])
        def predict(self, sepal_length, sepal_width, petal_length, petal_width):  # type: ignore[no-untyped-def]
            x = tf.stack([sepal_length, sepal_width, petal_length, petal_width], axis=1)
            scores = tf.matmul(x, WEIGHTS) + BIAS
            return {"class_ids": tf.argmax(scores, axis=1)[:, None], "probabilities": tf.nn.softmax(scores)}

    module = Iris()
    tf.saved_model.save(module, str(path), signatures={"predict": module.predict})
    return path


def generator_saved_model(path: Path) -> Path:
    """A stand-in for GPT-2's export: context int32 [None, None] -> sample int32 [None, None], the context
    followed by the tokens 2 and 3 (what the stand-in encoder decodes as "is fun")."""
    import tensorflow as tf

    class Generator(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="context")])
        def serve(self, context):  # type: ignore[no-untyped-def]
            rows = tf.shape(context)[0]
            return {"sample": tf.concat([context, tf.tile([[2, 3]], [rows, 1])], axis=1)}

    module = Generator()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


#: A stand-in for the text generator's encoder.py (GPT-2's byte-pair encoder, which downloads its vocabulary):
#: the same get_encoder() / encode(text) / decode(tokens) interface over a word list.
STAND_IN_ENCODER = """
WORDS = ["machine", "learning", "is", "fun"]


class Encoder:
    def encode(self, text):
        return [WORDS.index(word) for word in text.split()]

    def decode(self, tokens):
        return " ".join(WORDS[token] for token in tokens)


def get_encoder():
    return Encoder()
"""


#: A stand-in for the sklearn classifiers that Cortex 0.11's sklearn example unpickles: predict(rows) -> labels.
STAND_IN_MODEL = """
class NearestCentroid:
    def __init__(self, centroids):
        self.centroids = centroids

    def predict(self, rows):
        return [min(range(len(self.centroids)), key=lambda k: sum((a - b) ** 2 for a, b in zip(row, self.centroids[k])))
                for row in rows]
"""


def pickled_models(root: Path, models: dict[str, list[list[float]]]) -> None:
    """Write stand_in_model.py in the project and a pickle of a NearestCentroid per model file."""
    import importlib.util
    import pickle

    (root / "stand_in_model.py").write_text(STAND_IN_MODEL, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("stand_in_model", root / "stand_in_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["stand_in_model"] = module
    try:
        spec.loader.exec_module(module)
        for name, centroids in models.items():
            (root / name).write_bytes(pickle.dumps(module.NearestCentroid(centroids)))
    finally:
        del sys.modules["stand_in_model"]


def project(tmp: Path, case: str, models: dict[str, str] | None = None, name: str | None = None) -> Path:
    """A copy of a published case, with each cloud model path replaced by a local one."""
    root = tmp / (name or case)
    shutil.copytree(DATA / case, root)
    for name in ("cortex.yaml", "cortex.yml"):
        config = root / name
        if config.is_file() and models:
            text = config.read_text(encoding="utf-8")
            for remote, local in models.items():
                assert remote in text, f"{remote} not in {case}/{name}"
                text = text.replace(remote, local)
            config.write_text(text, encoding="utf-8")
    return root


def sample(case: str) -> Any:
    return json.loads((DATA / case / "sample.json").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------------------------------
# servers: every project is started at once, then each test waits for its own (TensorFlow loads slowly)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("cortex")
    roots: dict[str, Path] = {}

    root = project(
        tmp, "v011-xgboost-iris", {"s3://cortex-examples/xgboost/iris-classifier/gbtree.onnx": "gbtree.onnx"}
    )
    iris_onnx(root / "gbtree.onnx", None)  # converter-style: [None, 4]
    roots["v011-xgboost-iris"] = root
    root = project(
        tmp,
        "v011-xgboost-iris",
        {"s3://cortex-examples/xgboost/iris-classifier/gbtree.onnx": "gbtree.onnx"},
        name="v011-xgboost-iris-1x4",
    )
    iris_onnx(root / "gbtree.onnx", 1)  # a fixed batch of one: [1, 4]
    roots["v011-xgboost-iris-1x4"] = root

    root = project(tmp, "v031-onnx-predictor-iris", {"s3://cortex-examples/onnx/iris-classifier/": "models/"})
    iris_onnx(root / "models" / "1" / "gbtree.onnx", "N")  # a version folder holding the .onnx, as on S3
    roots["v031-onnx-predictor-iris"] = root

    root = project(tmp, "v035-onnx-model-client-iris", {"s3://cortex-examples/onnx/iris-classifier/": "models/"})
    iris_onnx(root / "models" / "1" / "gbtree.onnx", 1)
    roots["v035-onnx-model-client-iris"] = root

    roots["v035-sleep"] = project(tmp, "v035-sleep")

    root = project(
        tmp,
        "v011-sklearn-iris-predictor",
        {
            "s3://cortex-examples/sklearn/iris-classifier/model.pkl": "model.pkl",
            "s3://cortex-examples/sklearn/iris-classifier/another-model.pkl": "another-model.pkl",
        },
    )
    means = MEANS.tolist()
    pickled_models(root, {"model.pkl": means, "another-model.pkl": means[::-1]})  # the other one's classes reversed
    roots["v011-sklearn-iris-predictor"] = root

    roots["logging"] = project(tmp, "v035-structured-logging")

    root = project(tmp, "v011-tensorflow-iris", {"s3://cortex-examples/tensorflow/iris-classifier/nn": "nn"})
    iris_estimator_saved_model(root / "nn" / "1560263597")  # Cortex 0.11 wanted a version folder
    roots["v011-tensorflow-iris"] = root

    root = project(
        tmp, "v011-tensorflow-text-generator", {"s3://cortex-examples/tensorflow/text-generator/gpt-2/124M": "124M"}
    )
    (root / "encoder.py").write_text(STAND_IN_ENCODER, encoding="utf-8")
    generator_saved_model(root / "124M" / "1")
    roots["v011-tensorflow-text-generator"] = root

    for case in ("v035-tensorflow-iris", "v035-async-tensorflow"):
        root = project(tmp, case, {"s3://cortex-examples/tensorflow/iris-classifier/nn/": "nn/"})
        shutil.copytree(roots["v011-tensorflow-iris"] / "nn", root / "nn")
        roots[case] = root

    started = {case: start_server_module(root, "--log-format", "json") for case, root in roots.items()}
    yield started


def ready(servers: dict[str, Any], case: str) -> str:
    server = servers[case]
    server.wait_ready(timeout=90)
    return str(server.url)


# --------------------------------------------------------------------------------------------------
# Cortex 0.11: kind: api with onnx: / tensorflow: and request_handler hooks


@pytest.mark.parametrize("case", ["v011-xgboost-iris", "v011-xgboost-iris-1x4"])
def test_v011_xgboost_iris_hooks_on_a_converter_style_model(servers: dict[str, Any], case: str) -> None:
    """pre_inference returns a flat list of four numbers for an input of [None, 4] or [1, 4]: reshaped to
    [1, 4] as Cortex did; post_inference indexes the list of outputs and its label is sent as JSON."""
    url = ready(servers, case)
    answer = httpx.post(f"{url}/classifier", json=sample("v011-xgboost-iris"))
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.json() == "iris-setosa"


def test_v011_a_value_that_cannot_be_reshaped_stays_a_400(servers: dict[str, Any]) -> None:
    url = ready(servers, "v011-xgboost-iris")
    body = {"sepal_length": 5.2, "sepal_width": [3.6, 1.0], "petal_length": 1.4, "petal_width": 0.3}
    answer = httpx.post(f"{url}/classifier", json=body)
    assert answer.status_code == 400, answer.text
    assert "input 'input'" in answer.json()["error"]


def test_v011_tensorflow_iris_scalars_for_none_inputs_and_flat_outputs(servers: dict[str, Any]) -> None:
    """The sample is four scalars for four [None] inputs; post_inference reads prediction["class_ids"][0]."""
    url = ready(servers, "v011-tensorflow-iris")
    answer = httpx.post(f"{url}/classifier", json=sample("v011-tensorflow-iris"))
    assert answer.status_code == 200, answer.text
    assert answer.json() == "iris-setosa"


def test_v011_text_generator_decodes_the_flat_sample(servers: dict[str, Any]) -> None:
    """post_inference passes prediction["sample"] to the tokenizer's decode, which needs a flat list."""
    url = ready(servers, "v011-tensorflow-text-generator")
    answer = httpx.post(f"{url}/generator", json=sample("v011-tensorflow-text-generator"))
    assert answer.status_code == 200, answer.text
    assert answer.json() == "machine learning is fun"


def test_v011_predictor_module_per_api_globals(servers: dict[str, Any]) -> None:
    """Two APIs share predictor.py, whose init() loads its API's model into a module-level global: each API
    has its own module, as each had its own process in Cortex, so each answers with its own model."""
    url = ready(servers, "v011-sklearn-iris-predictor")
    body = sample("v011-sklearn-iris-predictor")
    assert httpx.post(f"{url}/classifier", json=body).json() == "iris-setosa"
    assert httpx.post(f"{url}/another-classifier", json=body).json() == "iris-virginica"


# --------------------------------------------------------------------------------------------------
# Cortex 0.19-0.35: handler and predictor classes


def test_v031_onnx_predictor_with_onnx_client(servers: dict[str, Any]) -> None:
    """ONNXPredictor(onnx_client, config).predict(payload): client.predict(a flat list) on a [N, 4] model."""
    url = ready(servers, "v031-onnx-predictor-iris")
    answer = httpx.post(f"{url}/iris-classifier", json=sample("v031-onnx-predictor-iris"))
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")  # Cortex 0.19+ sent a str as text
    assert answer.text == "setosa"


def test_v035_python_handler_with_model_client_and_load_model(servers: dict[str, Any]) -> None:
    """Handler(model_client, config): load_model(model_path) gets the model's version folder; handle_post
    runs the onnxruntime session that client.get_model() returns."""
    url = ready(servers, "v035-onnx-model-client-iris")
    answer = httpx.post(f"{url}/iris-classifier", json=sample("v035-onnx-model-client-iris"))
    assert answer.status_code == 200, answer.text
    assert answer.text == "setosa"


def test_v035_tensorflow_handler_with_tensorflow_client(servers: dict[str, Any]) -> None:
    url = ready(servers, "v035-tensorflow-iris")
    answer = httpx.post(f"{url}/iris-classifier", json=sample("v035-tensorflow-iris"))
    assert answer.status_code == 200, answer.text
    assert answer.text == "setosa"


def test_v035_realtime_handler_takes_query_params(servers: dict[str, Any]) -> None:
    """sleep's handle_post(payload, query_params) sleeps for ?sleep= seconds and answers "ok" (as text)."""
    url = ready(servers, "v035-sleep")
    started = time.perf_counter()
    answer = httpx.post(f"{url}/sleep", params={"sleep": "0.3"}, json=sample("v035-sleep"))
    assert answer.status_code == 200, answer.text
    assert answer.text == "ok" and answer.headers["content-type"].startswith("text/plain")
    assert time.perf_counter() - started >= 0.3


def test_get_describes_the_api_and_never_runs_the_handler(servers: dict[str, Any]) -> None:
    url = ready(servers, "v035-sleep")
    # handle_post would sleep an hour: a request that ran it would fail on httpx's timeout (5 s).
    answer = httpx.get(f"{url}/sleep", params={"sleep": "3600"})
    assert answer.status_code == 200
    assert answer.json()["backend"] == "cortex_handler"
    assert answer.json()["method"] == {"name": "handle_post", "async": False, "takes": ["payload", "query_params"]}
    for method, status in (("HEAD", 200), ("PUT", 405), ("DELETE", 405)):
        assert httpx.request(method, f"{url}/sleep", params={"sleep": "3600"}).status_code == status


def test_v035_async_api_with_tensorflow_client(servers: dict[str, Any]) -> None:
    """AsyncAPI: POST submits, GET /<api>/<id> polls; the result is what expectations.yaml documents."""
    url = ready(servers, "v035-async-tensorflow")
    submitted = httpx.post(f"{url}/async-iris-classifier", json=sample("v035-async-tensorflow"))
    assert submitted.status_code == 200, submitted.text
    job_id = submitted.json()["id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job = httpx.get(f"{url}/async-iris-classifier/{job_id}").json()
        if job["status"] not in ("in_queue", "in_progress"):
            break
        time.sleep(0.05)
    assert job["status"] == "completed", job
    assert job["result"] == {"label": "setosa"}


def test_cortex_internal_logger_writes_structured_lines(servers: dict[str, Any]) -> None:
    """Cortex's structured-logging example: `from cortex_internal.lib.log import logger as cortex_logger`,
    then cortex_logger.info("received payload", extra={"payload": payload})."""
    url = ready(servers, "logging")
    answer = httpx.post(f"{url}/text-logger", json="this movie is awesome")
    assert answer.status_code == 200, answer.text
    deadline = time.monotonic() + 5
    while "received payload" not in servers["logging"].log and time.monotonic() < deadline:
        time.sleep(0.05)
    lines = [json.loads(line) for line in servers["logging"].log.splitlines() if "received payload" in line]
    assert lines, servers["logging"].log
    assert lines[0]["payload"] == "this movie is awesome"
    assert lines[0]["api"] == "text-logger"


# --------------------------------------------------------------------------------------------------
# what cannot be served is said before serving starts


def run_cli(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modelserve", str(root), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(REPO),
    )


def test_a_cloud_model_path_is_a_config_error_saying_to_download_it(tmp_path: Path) -> None:
    """The published cortex.yaml, unchanged: its model is on S3."""
    result = run_cli(project(tmp_path, "v011-xgboost-iris"))
    assert result.returncode == 2, result.stderr
    assert "s3://cortex-examples/xgboost/iris-classifier/gbtree.onnx" in result.stderr
    assert "download the model" in result.stderr and "local path" in result.stderr


def test_cluster_keys_are_listed_once_as_not_applied(servers: dict[str, Any]) -> None:
    ready(servers, "v035-tensorflow-iris")
    log = servers["v035-tensorflow-iris"].log
    lines = [line for line in log.splitlines() if "not applied" in line]
    assert len(lines) == 1, log
    assert "compute" in lines[0]


def test_a_handler_class_without_hooks_next_to_a_model_is_a_load_error(tmp_path: Path) -> None:
    """A modelserve.yaml serving a model with Cortex 0.35's TensorFlow Handler class as its handler file:
    refused, saying what a model API's handler file holds and how to use the class instead."""
    root = project(tmp_path, "v035-tensorflow-iris")
    iris_onnx(root / "model.onnx", None)
    (root / "cortex.yaml").unlink()
    (root / "modelserve.yaml").write_text(
        "apis:\n  - name: iris\n    model: {path: model.onnx}\n    handler: {path: handler.py}\n", encoding="utf-8"
    )
    result = run_cli(root)
    assert result.returncode == 3, result.stderr
    assert "defines class Handler but no module-level pre_inference or post_inference" in result.stderr
    assert "post_inference(prediction, signature, metadata)" in result.stderr
    assert "handler.class: Handler" in result.stderr


# --------------------------------------------------------------------------------------------------
# without a server: the mapping of cortex.yaml, the handler contracts, the logger's import path


def write(root: Path, files: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    return root


HANDLER = "class Handler:\n    def __init__(self, config):\n        self.config = config\n\n"


def test_cortex_yaml_keys_map_onto_modelserve_apis(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from modelserve.config import load_project_config

    root = write(
        tmp_path,
        {
            "handler.py": HANDLER + "    def handle_post(self, payload):\n        return self.config\n",
            "predictor.py": "def init(model_path, metadata):\n    pass\n\ndef predict(sample, metadata):\n    pass\n",
            "model.pkl": "",
            "lib/helpers.py": "",
            "cortex.yml": """
- kind: deployment
  name: old
- kind: api
  name: old-predictor
  predictor: {path: predictor.py, model: model.pkl, metadata: {a: 1}}
  compute: {cpu: 1}
- name: realtime
  kind: RealtimeAPI
  handler:
    type: python
    path: handler.py
    threads_per_process: 4
    processes_per_replica: 2
    config: {b: 2}
    env: {MODELSERVE_TEST_CORTEX_ENV: from-cortex-yaml}
    python_path: lib
  autoscaling: {max_replicas: 3}
  networking: {endpoint: /x}
- name: jobs
  kind: AsyncAPI
  predictor: {type: python, path: handler.py}
""",
        },
    )
    with caplog.at_level("INFO", logger="modelserve"):
        config = load_project_config(root)
    old, realtime, jobs = config.apis
    assert old.cortex is not None and old.cortex.style == "module" and old.handler is not None
    assert old.handler.config == {"a": 1} and old.cortex.models[""].path.endswith("model.pkl")
    assert realtime.kind == "realtime" and realtime.max_concurrency == 4 and realtime.handler is not None
    assert realtime.handler.config == {"b": 2}
    assert realtime.env == {"MODELSERVE_TEST_CORTEX_ENV": "from-cortex-yaml"} and realtime.python_path == ["lib"]
    assert jobs.kind == "async"
    (line,) = [record.getMessage() for record in caplog.records if "not applied" in record.getMessage()]
    for key in ("kind: deployment", "compute", "processes_per_replica", "autoscaling", "networking"):
        assert key in line


def test_every_problem_of_a_cortex_yaml_is_in_one_config_error(tmp_path: Path) -> None:
    from modelserve.config import load_project_config
    from modelserve.errors import ConfigError

    root = write(
        tmp_path,
        {
            "handler.py": HANDLER,
            "cortex.yaml": """
- name: a
  kind: RealtimeAPI
  handler: {type: tensorflow, path: handler.py, models: {path: "gs://bucket/model/"}}
- name: b
  kind: BatchAPI
  handler: {type: python, path: handler.py}
- name: c
  kind: RealtimeAPI
  handler: {type: onnx, path: missing.py}
- kind: api
  name: d
  onnx: {model: s3://bucket/model.onnx}
- name: metrics
  handler: {path: handler.py}
""",
        },
    )
    with pytest.raises(ConfigError) as caught:
        load_project_config(root)
    message = str(caught.value)
    assert "api 'a', handler: key 'models.path': 'gs://bucket/model/' is in cloud storage" in message
    assert "api 'b': kind BatchAPI is not served by modelserve" in message
    assert "api 'c', handler: key 'path': file 'missing.py' not found" in message
    assert "api 'd', onnx: key 'model': 's3://bucket/model.onnx'" in message
    assert "api 'metrics': key 'name': 'metrics' is reserved" in message


@pytest.mark.parametrize(
    ("code", "fragments"),
    [
        (
            HANDLER + "    def handle_get(self, query_params):\n        return 1\n",
            ["needs a method handle_post(self, payload, query_params, headers)", "handle_get are not served"],
        ),
        (
            "class Handler:\n    def __init__(self, config, tokenizer):\n        pass\n\n"
            "    def handle_post(self, payload):\n        pass\n",
            ["Handler.__init__(self, config, tokenizer) requires ['tokenizer']", "config, python_client"],
        ),
        (
            HANDLER + "    def handle_post(self, payload, body):\n        pass\n",
            ["Handler.handle_post(self, payload, body) requires ['body']", "payload, query_params, headers"],
        ),
        ("class Other:\n    pass\n", ["has no class Handler or PythonPredictor"]),
    ],
)
def test_a_handler_class_is_checked_when_the_app_is_created(tmp_path: Path, code: str, fragments: list[str]) -> None:
    import modelserve
    from modelserve.errors import LoadError

    root = write(tmp_path, {"handler.py": code, "cortex.yaml": "- name: api\n  handler: {path: handler.py}\n"})
    with pytest.raises(LoadError) as caught:
        modelserve.create_app(root)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_handlers_get_payload_query_params_and_headers_by_name_and_callbacks_run_after(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    import modelserve

    root = write(
        tmp_path,
        {
            "handler.py": "import os\nimport threading\n\nran = threading.Event()\n\n"
            + HANDLER
            + "    def handle_post(self, headers, query_params, payload):\n"
            + "        seen = {'payload': payload, 'q': query_params['q'], 'h': headers['x-name']}\n"
            + "        seen['env'] = os.environ['MODELSERVE_TEST_CORTEX_GREETING']\n"
            + "        return seen, ran.set\n",
            "predictor.py": "def predict(sample, metadata):\n    return 'label-' + sample['x'] + metadata['suffix']\n",
            "predictor_class.py": "import threading\n\nseen = []\nran = threading.Event()\n\n\n"
            "class PythonPredictor:\n    def __init__(self, config):\n"
            "        pass\n\n    def predict(self, payload):\n        return {'echo': payload}\n\n"
            "    def post_predict(self, response, payload):\n"
            "        seen.append((response.body, response.status_code, payload))\n        ran.set()\n",
            "cortex.yaml": "- name: api\n  kind: RealtimeAPI\n"
            "  handler: {path: handler.py, env: {MODELSERVE_TEST_CORTEX_GREETING: hi}}\n"
            "- kind: api\n  name: old\n  predictor: {path: predictor.py, metadata: {suffix: '!'}}\n"
            "- name: pred\n  kind: RealtimeAPI\n  predictor: {type: python, path: predictor_class.py}\n",
        },
    )
    app = modelserve.create_app(root)
    with TestClient(app) as client:
        client.portal.call(app.server.wait_loaded)
        answer = client.post("/api?q=1", json={"a": 1}, headers={"x-name": "n"})
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"payload": {"a": 1}, "q": "1", "h": "n", "env": "hi"}
        from modelserve.project import import_file

        assert import_file(root, "handler.py", "api").ran.wait(30)  # the (result, callback) pair's callback ran
        text = client.post("/api?q=2", content="plain", headers={"content-type": "text/plain", "x-name": "n"})
        assert text.json()["payload"] == "plain"  # text/plain arrives as a str, as in Cortex
        os.environ.pop("MODELSERVE_TEST_CORTEX_GREETING")
        old = client.post("/old", json={"x": "a"})
        assert old.json() == "label-a!"  # a v0.11 predictor's str is jsonify-ed
        predicted = client.post("/pred", json=[1])
        assert predicted.json() == {"echo": [1]}
    post = import_file(root, "predictor_class.py", "pred")
    assert post.ran.wait(30)  # post_predict ran once the answer was ready, and saw it
    assert post.seen == [(b'{"echo":[1]}', 200, [1])]


def test_a_handlers_own_response_is_sent_as_it_is_and_its_callback_runs_after(tmp_path: Path) -> None:
    """A (Response, callback) pair: the handler's Response goes out unchanged (its own media type), and the
    callback runs after it, through Starlette's background."""
    from starlette.testclient import TestClient

    import modelserve
    from modelserve.project import import_file

    root = write(
        tmp_path,
        {
            "handler.py": "import threading\n\nfrom starlette.responses import Response\n\n"
            "ran = threading.Event()\n\n\n" + HANDLER + "    def handle_post(self, payload):\n"
            "        return Response('a,b\\n', media_type='text/csv'), ran.set\n",
            "cortex.yaml": "- name: api\n  kind: RealtimeAPI\n  handler: {path: handler.py}\n",
        },
    )
    app = modelserve.create_app(root)
    with TestClient(app) as client:
        client.portal.call(app.server.wait_loaded)
        answer = client.post("/api", json={})
        assert answer.status_code == 200, answer.text
        assert answer.text == "a,b\n" and answer.headers["content-type"].startswith("text/csv")
        assert import_file(root, "handler.py", "api").ran.wait(30)


def test_cortex_internal_logger_is_modelserves_unless_a_real_one_is_installed(tmp_path: Path) -> None:
    fake = write(tmp_path / "site", {"cortex_internal/__init__.py": "", "cortex_internal/lib/__init__.py": ""})
    (fake / "cortex_internal" / "lib" / "log.py").write_text("logger = 'the real one'\n", encoding="utf-8")
    root = write(tmp_path / "project", {"model.py": "class Model:\n    def predict(self, x):\n        return x\n"})
    script = f"""
import sys
{{setup}}
from modelserve.project import prepare_environment
prepare_environment(__import__("pathlib").Path({str(root)!r}))
import modelserve
from cortex_internal.lib.log import logger
print("real" if logger == "the real one" else "modelserve" if logger is modelserve.logger else "other")
"""
    for setup, expected in (("", "modelserve"), (f"sys.path.insert(0, {str(fake)!r})", "real")):
        result = subprocess.run(
            [sys.executable, "-c", script.format(setup=setup)], capture_output=True, text=True, cwd=str(REPO)
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == expected


def test_a_model_with_a_handler_class_in_modelserve_yaml_is_a_cortex_handler(tmp_path: Path) -> None:
    """`model:` plus `handler.class`: the class is constructed with the client of that model (here Cortex
    0.31's ONNXPredictor, unchanged, on a [N, 4] model)."""
    from starlette.testclient import TestClient

    import modelserve

    root = project(tmp_path, "v031-onnx-predictor-iris")
    iris_onnx(root / "iris.onnx", "N")
    (root / "modelserve.yaml").write_text(
        "apis:\n  - name: iris\n    model: {path: iris.onnx}\n"
        "    handler: {path: predictor.py, class: ONNXPredictor}\n",
        encoding="utf-8",
    )
    app = modelserve.create_app(root)
    with TestClient(app) as client:
        client.portal.call(app.server.wait_loaded)
        answer = client.post("/iris", json=sample("v031-onnx-predictor-iris"))
        assert answer.status_code == 200, answer.text
        assert answer.text == "setosa"
        assert client.get("/iris").json()["backend"] == "cortex_handler"
        bad = client.post("/iris", json={**sample("v031-onnx-predictor-iris"), "petal_width": [1, 2]})
        assert bad.status_code == 400 and "input 'input'" in bad.json()["error"]  # the client's 400 passes through


# --------------------------------------------------------------------------------------------------
# Cortex 0.31's AsyncAPI (predict) and 0.25-0.35's server_side_batching of a python handler, each published
# example served unchanged, with stand-ins for boto3 (a folder for S3) and torch (tests/stand_ins.py)


def stand_in_s3(tmp: Path, files: dict[str, bytes]) -> dict[str, str]:
    for key, data in files.items():
        (tmp / "s3" / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "s3" / key).write_bytes(data)
    return {"STAND_IN_S3": str(tmp / "s3")}


def nearest(row: list[float]) -> str:
    scores = np.asarray(row, dtype=np.float32) @ WEIGHTS + BIAS
    return ["setosa", "versicolor", "virginica"][int(np.argmax(scores))]


def test_v031_async_api_predict_runs_each_job(tmp_path: Path, start_server: Any) -> None:
    """Cortex 0.31's AsyncAPI called PythonPredictor.predict(payload) (0.32 renamed it handle_async)."""
    from tests.stand_ins import BOTO3, write

    root = project(tmp_path, "v031-async-iris")
    write(root, BOTO3)
    pickled_models(root, {"model.pkl": MEANS.tolist()})
    env = stand_in_s3(
        tmp_path, {"cortex-examples/sklearn/iris-classifier/model.pkl": (root / "model.pkl").read_bytes()}
    )
    server = start_server(root, env=env)
    server.wait_ready()
    submitted = httpx.post(f"{server.url}/iris-classifier", json=sample("v031-async-iris"))
    assert submitted.status_code == 200, server.log
    job_id = submitted.json()["id"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        job = httpx.get(f"{server.url}/iris-classifier/{job_id}").json()
        if job["status"] not in ("in_queue", "in_progress"):
            break
        time.sleep(0.05)
    assert job["status"] == "completed", job
    assert job["result"] == {"result": "setosa"}
    assert httpx.get(f"{server.url}/iris-classifier").json()["method"]["name"] == "predict"


def iris_net_weights() -> bytes:
    """IrisNet's state dict (4 -> 100 -> 100 -> 3) as a nearest-centroid rule: fc1 and fc2 pass the four
    measurements through, fc3 scores each class (x . mu_k - |mu_k|^2 / 2)."""
    import pickle

    fc1, fc2, fc3 = np.zeros((100, 4)), np.zeros((100, 100)), np.zeros((3, 100))
    fc1[:4, :4] = fc2[:4, :4] = np.eye(4)
    fc3[:, :4] = MEANS
    state = {"fc1.weight": fc1, "fc1.bias": np.zeros(100), "fc2.weight": fc2, "fc2.bias": np.zeros(100)}
    state.update({"fc3.weight": fc3, "fc3.bias": BIAS})
    return pickle.dumps(state)


def test_v035_server_side_batching_gives_a_python_handler_lists(tmp_path: Path, start_server: Any) -> None:
    """Cortex's pytorch server-side-batching example: handle_post(payload) iterates over a list of payloads and
    returns a list of labels; each request gets its own, as text. Eight concurrent requests (max_batch_size 8,
    batch_interval 0.1s) share fewer than eight calls."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.stand_ins import BOTO3, TORCH, write

    root = project(tmp_path, "v035-server-side-batching")
    write(root, {**BOTO3, **TORCH})
    env = stand_in_s3(tmp_path, {"cortex-examples/pytorch/iris-classifier/weights.pth": iris_net_weights()})
    server = start_server(root, env=env)
    server.wait_ready()
    rows = [[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.5, 2.0], list(sample_row())] * 2
    bodies = [dict(zip(FEATURES, row, strict=True)) for row in rows]
    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda body: httpx.post(f"{server.url}/iris-classifier", json=body), bodies))
    for answer, row in zip(answers, rows, strict=True):
        assert answer.status_code == 200, server.log
        assert answer.headers["content-type"].startswith("text/plain")
        assert answer.text == nearest(row)
    metrics = httpx.get(f"{server.url}/metrics").text
    count = next(line for line in metrics.splitlines() if line.startswith("modelserve_batch_size_count"))
    assert 1 <= float(count.split()[-1]) < len(bodies), metrics
    described = httpx.get(f"{server.url}/iris-classifier").json()
    assert described["server_side_batching"] == {"max_batch_size": 8, "batch_interval_ms": 100.0}


def sample_row() -> list[float]:
    body = sample("v035-server-side-batching")
    return [body[name] for name in FEATURES]


def test_server_side_batching_is_checked(tmp_path: Path) -> None:
    from modelserve.config import load_project_config
    from modelserve.errors import ConfigError

    root = write(
        tmp_path,
        {
            "handler.py": HANDLER + "    def handle_post(self, payload):\n        return payload\n",
            "cortex.yaml": """
- name: a
  handler: {path: handler.py, server_side_batching: {max_batch_size: 0}}
- name: b
  handler: {path: handler.py, server_side_batching: {max_batch_size: 4, batch_interval: 1x}}
- name: c
  handler: {path: handler.py, server_side_batching: {max_batch_size: 4, batch_interval: 1m5ms}}
""",
        },
    )
    with pytest.raises(ConfigError) as caught:
        load_project_config(root)
    assert "api 'a', handler, server_side_batching: key 'max_batch_size'" in str(caught.value)
    assert "api 'b', handler, server_side_batching: key 'batch_interval'" in str(caught.value)
    assert "api 'c'" not in str(caught.value)
