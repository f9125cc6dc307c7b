"""More published Cortex examples served unchanged (0.20, 0.35 and 0.40; copied byte for byte into tests/data/cortex,
see SOURCES.md): multi-model TensorFlow clients, a python handler's model_client with versions, a bytes body, a
handler whose arguments come in another order, and the kinds of API that modelserve refuses at start.

Heavy libraries the examples import (transformers, torch, mlflow, requests, cv2, scipy) are tiny stand-ins written
here into the project folder, where the published code imports them unchanged; models are tiny local ones built
here. As in tests/compat/test_cortex.py, the one change to a published file is made in the open: a model path in
cloud storage is replaced by a local path.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.compat.test_cortex import DATA, MEANS, iris_estimator_saved_model, project, sample
from tests.conftest import REPO, free_port
from tests.stand_ins import write

pytestmark = pytest.mark.slow

#: transformers' pipeline() for the text analyzer: "sentiment-analysis" counts positive and negative words,
#: "summarization" keeps the first sentence. torch only answers cuda.is_available().
TEXT_ANALYZER = {
    "torch/__init__.py": """
class cuda:
    @staticmethod
    def is_available():
        return False
""",
    "transformers/__init__.py": """
POSITIVE = {"best", "good", "great", "love"}
NEGATIVE = {"worst", "bad", "awful", "hate"}


def pipeline(task, device=-1):
    def sentiment(text):
        words = text.lower().split()
        score = sum(word in POSITIVE for word in words) - sum(word in NEGATIVE for word in words)
        return [{"label": "POSITIVE" if score >= 0 else "NEGATIVE", "score": float(abs(score))}]

    def summarize(text):
        return [{"summary_text": text.split(". ")[0]}]

    return {"sentiment-analysis": sentiment, "summarization": summarize}[task]
""",
}

#: mlflow.sklearn.load_model(folder): a linear model whose coefficients are in the folder's model.json.
MLFLOW = {
    "mlflow/__init__.py": "",
    "mlflow/sklearn.py": """
import json
import os

import numpy as np


class LinearModel:
    def __init__(self, coef, intercept):
        self.coef = np.asarray(coef)
        self.intercept = intercept

    def predict(self, rows):
        return np.asarray(rows, dtype=float) @ self.coef + self.intercept


def load_model(path):
    with open(os.path.join(path, "model.json")) as f:
        saved = json.load(f)
    return LinearModel(saved["coef"], saved["intercept"])
""",
}

#: requests.get() answers the one URL these handlers fetch at start (ImageNet's class index) from a local copy;
#: any other URL raises, so nothing reaches the network. cv2 is only imported by the multi-model handlers.
IMAGE_HELPERS = {
    "requests/__init__.py": """
import json

CLASS_INDEX = "https://s3.amazonaws.com/deep-learning-models/image-models/imagenet_class_index.json"


class Response:
    def json(self):
        return {"0": ["n01440764", "tench"], "1": ["n01443537", "goldfish"]}


def get(url, stream=False):
    if url != CLASS_INDEX:
        raise ConnectionError(f"no network in the tests: {url}")
    return Response()
""",
    "cv2/__init__.py": "",
}

#: scipy.io.wavfile.read: (rate, samples) of a PCM (16-bit) or IEEE float (32-bit) RIFF WAVE file.
SCIPY = {
    "scipy/__init__.py": "",
    "scipy/io/__init__.py": "",
    "scipy/io/wavfile.py": """
import struct

import numpy as np


def read(file):
    data = file.read()
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("not a WAVE file")
    at, fmt, rate, samples = 12, None, None, None
    while at + 8 <= len(data):
        chunk, size = data[at : at + 4], struct.unpack("<I", data[at + 4 : at + 8])[0]
        body = data[at + 8 : at + 8 + size]
        if chunk == b"fmt ":
            fmt, _, rate, _, _, bits = struct.unpack("<HHIIHH", body[:16])
        elif chunk == b"data":
            samples = body
        at += 8 + size + size % 2
    dtype = {(1, 16): np.int16, (3, 32): np.float32}[(fmt, bits)]
    return rate, np.frombuffer(samples, dtype=dtype)
""",
}

#: requests.get(url) for the inception predictor: an https URL is answered with the file of the same name in the
#: project's web/ folder (written by the test); anything else raises, so nothing reaches the network. PIL's
#: Image.open reads the stand-in "image" files, which are .npy arrays [height, width, 3] of 0-255.
WEB = {
    "requests/__init__.py": """
import os

WEB = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "web")


class Response:
    def __init__(self, content):
        self.content = content
        self.text = content.decode("utf-8", "replace")


def get(url, stream=False):
    path = os.path.join(WEB, url.rsplit("/", 1)[-1])
    if not url.startswith("https://") or not os.path.isfile(path):
        raise ConnectionError(f"no network in the tests: {url}")
    with open(path, "rb") as f:
        return Response(f.read())
""",
    "PIL/__init__.py": "",
    "PIL/Image.py": """
import numpy as np


def open(fp):
    return np.load(fp)
""",
}
COLOURS = ["background", "red", "green", "blue"]


def colour_saved_model(path: Path) -> Path:
    """A stand-in for Inception: images float32 [None, None, None, 3] -> classes float32 [None, 4], the score of
    "background" (0) then each channel's mean, so that the label is the image's dominant colour."""
    import tensorflow as tf

    class Colour(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, None, None, 3], tf.float32, name="images")])
        def serve(self, images):  # type: ignore[no-untyped-def]
            means = tf.reduce_mean(images, axis=[1, 2])
            return {"classes": tf.concat([tf.zeros_like(means[:, :1]), means], axis=1)}

    module = Colour()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def image_bytes(colour: int) -> bytes:
    import io

    image = np.zeros((8, 8, 3), dtype=np.uint8)
    image[..., colour] = 200
    buffer = io.BytesIO()
    np.save(buffer, image)
    return buffer.getvalue()


SPEECH, SILENCE = 0, 494  # rows of class_names.csv (after its header): "Speech", "Silence"


def sound_saved_model(path: Path) -> Path:
    """A stand-in for YAMNet: waveform float32 [None] -> output_0 float32 [1, 521], all on "Silence" when the
    waveform's peak is under 0.01, else on "Speech"."""
    import tensorflow as tf

    class Sound(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="waveform")])
        def serve(self, waveform):  # type: ignore[no-untyped-def]
            peak = tf.reduce_max(tf.abs(waveform))
            index = tf.where(peak < 0.01, SILENCE, SPEECH)
            return {"output_0": tf.one_hot([index], 521)}

    module = Sound()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def wav16(samples: np.ndarray, rate: int = 16000) -> bytes:
    """A 16-bit PCM mono WAVE file."""
    data = samples.astype("<i2").tobytes()
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


TF_MULTI_MODEL = {
    "v020-tensorflow-multi-model": {
        "s3://cortex-examples/tensorflow/image-classifier/inception": "nn",
        "s3://cortex-examples/tensorflow/iris-classifier/nn": "nn",
        "s3://cortex-examples/tensorflow/resnet50": "nn",
    },
    "v035-tensorflow-multi-model": {
        "s3://cortex-examples/tensorflow/image-classifier/inception/": "nn/",
        "s3://cortex-examples/tensorflow/iris-classifier/nn/": "nn/",
        "s3://cortex-examples/tensorflow/resnet50/": "nn/",
    },
}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("cortex-wide")
    roots: dict[str, Path] = {}

    root = project(tmp, "v035-multi-model-text-analyzer")
    write(root, TEXT_ANALYZER)
    roots["text-analyzer"] = root

    root = project(
        tmp, "v035-live-reloading-mpg-estimator", {"s3://cortex-examples/sklearn/mpg-estimator/linreg/": "linreg/"}
    )
    write(root, MLFLOW)
    for version, intercept in (("1", 10.0), ("2", 20.0)):  # the latest version is the highest
        write(root, {f"linreg/{version}/model.json": f'{{"coef": [1, 0, 0, 0, 0], "intercept": {intercept}}}'})
    roots["mpg"] = root

    nn = None
    for case, models in TF_MULTI_MODEL.items():
        root = project(tmp, case, models)
        write(root, IMAGE_HELPERS)
        if nn is None:
            nn = iris_estimator_saved_model(root / "nn" / "1")
        else:
            shutil.copytree(nn, root / "nn" / "1")
        roots[case] = root

    root = project(
        tmp, "v035-sound-classifier", {"s3://cortex-examples/tensorflow/sound-classifier/yamnet/": "yamnet/"}
    )
    write(root, SCIPY)
    sound_saved_model(root / "yamnet" / "1")
    roots["sound"] = root

    # Cortex 0.20 deployed this file by name (cortex deploy cortex_server_side_batching.yaml): here it is the
    # project's cortex.yaml
    root = project(tmp, "v020-tensorflow-inception-batching")
    text = (root / "cortex_server_side_batching.yaml").read_text(encoding="utf-8")
    remote = "s3://cortex-examples/tensorflow/image-classifier/inception"
    assert remote in text
    (root / "cortex.yaml").write_text(text.replace(remote, "inception"), encoding="utf-8")
    write(root, WEB)
    colour_saved_model(root / "inception" / "1")
    (root / "web").mkdir()
    (root / "web" / "ImageNetLabels.txt").write_text("\n".join(COLOURS), encoding="utf-8")
    (root / "web" / "PzXprwl.jpg").write_bytes(image_bytes(2))  # the sample's URL: a blue image
    for index in range(3):
        (root / "web" / f"{COLOURS[index + 1]}.jpg").write_bytes(image_bytes(index))
    roots["inception"] = root

    yield {case: start_server_module(root) for case, root in roots.items()}


def ready(servers: dict[str, Any], case: str) -> str:
    server = servers[case]
    server.wait_ready(timeout=90)
    return str(server.url)


def test_v035_handler_arguments_are_passed_by_name_in_any_order(servers: dict[str, Any]) -> None:
    """The text analyzer's handle_post(self, query_params, payload) names its arguments in the other order."""
    url = ready(servers, "text-analyzer")
    body = json.loads((DATA / "v035-multi-model-text-analyzer" / "sample-sentiment.json").read_text(encoding="utf-8"))
    answer = httpx.post(f"{url}/multi-model-text-analyzer", params={"model": "sentiment"}, json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"label": "POSITIVE", "score": 1.0}
    answer = httpx.post(f"{url}/multi-model-text-analyzer", params={"model": "summarizer"}, json={"text": "One. Two"})
    assert answer.status_code == 200, answer.text
    assert answer.text == "One"
    # the handler's own JSONResponse for an unknown model is sent as it is
    answer = httpx.post(f"{url}/multi-model-text-analyzer", params={"model": "other"}, json={"text": "x"})
    assert answer.status_code == 400
    assert answer.json() == {"error": "unknown model: other"}


def test_v035_python_handler_model_client_serves_versions_of_a_folder(servers: dict[str, Any]) -> None:
    """multi_model_reloading.path is a folder of numbered versions: get_model(model_version="latest") is the
    highest, get_model(model_version="1") that one; load_model gets each version's folder."""
    url = ready(servers, "mpg")
    body = sample("v035-live-reloading-mpg-estimator")
    answer = httpx.post(f"{url}/mpg-estimator", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"prediction": body["cylinders"] + 20.0, "model": {"version": "latest"}}
    answer = httpx.post(f"{url}/mpg-estimator", params={"version": "1"}, json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"prediction": body["cylinders"] + 10.0, "model": {"version": "1"}}
    answer = httpx.post(f"{url}/mpg-estimator", params={"version": "9"}, json=body)
    assert answer.status_code == 400, answer.text
    assert "version '9'" in answer.json()["error"] and "1, 2" in answer.json()["error"]


@pytest.mark.parametrize("case", list(TF_MULTI_MODEL))
def test_tensorflow_client_with_named_models_and_a_query_param(servers: dict[str, Any], case: str) -> None:
    """0.20's models: [{name, model_path}] and 0.35's models: paths: client.predict(payload, "iris") runs the
    named model; the nested config reaches the constructor."""
    url = ready(servers, case)
    body = json.loads((DATA / case / "sample-iris.json").read_text(encoding="utf-8"))
    answer = httpx.post(f"{url}/multi-model-classifier", params={"model": "iris"}, json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"label": "setosa"}
    virginica = dict(zip(body["input"], MEANS[2].tolist(), strict=True))
    answer = httpx.post(f"{url}/multi-model-classifier", params={"model": "iris"}, json={"input": virginica})
    assert answer.json() == {"label": "virginica"}


def test_v035_bytes_body_and_files_relative_to_the_project(servers: dict[str, Any]) -> None:
    """The sound classifier reads class_names.csv from the working folder at start (Cortex ran it in the
    project folder) and gets a WAVE file's bytes as payload."""
    url = ready(servers, "sound")
    silence = (DATA / "v035-sound-classifier" / "silence.wav").read_bytes()
    headers = {"content-type": "application/octet-stream"}
    answer = httpx.post(f"{url}/sound-classifier", content=silence, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.text == "Silence"
    loud = wav16((np.sin(np.arange(16000) / 10) * 8000).astype(np.int16))
    answer = httpx.post(f"{url}/sound-classifier", content=loud, headers=headers)
    assert answer.status_code == 200, answer.text
    assert answer.text == "Speech"


# --------------------------------------------------------------------------------------------------
# kinds of API that modelserve does not serve: refused at start, with what to do instead


def start_error(root: Path) -> str:
    """What `python -m modelserve <root>` says when it refuses to start (it must exit, not serve)."""
    done = subprocess.run(
        [sys.executable, "-m", "modelserve", str(root), "--port", str(free_port())],
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0, done.stdout + done.stderr
    return done.stdout + done.stderr


REFUSED = {
    "v035-batch-sum": ["api 'summing-api': kind BatchAPI is not served", "kind: AsyncAPI"],
    "v035-task-hello-world": ["api 'hello-world': kind TaskAPI is not served", "python <definition.path>"],
    "v035-traffic-splitter": ["api 'iris-classifier': kind TrafficSplitter is not served", "POST /<name>"],
    "v035-grpc-iris-classifier": ["key 'protobuf_path'", "gRPC", "handle_post"],
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_kinds_modelserve_does_not_serve_are_refused_saying_what_to_do(tmp_path: Path, case: str) -> None:
    from modelserve.config import load_project_config
    from modelserve.errors import ConfigError

    models = {"s3://cortex-examples/onnx/iris-classifier/": "models/"} if case == "v035-traffic-splitter" else None
    root = project(tmp_path, case, models)
    (root / "models").mkdir()
    with pytest.raises(ConfigError) as caught:
        load_project_config(root)
    for fragment in REFUSED[case]:
        assert fragment in str(caught.value)


def test_a_cortex_040_container_api_is_refused_at_start_saying_to_run_its_image(tmp_path: Path) -> None:
    """Cortex 0.36+ APIs are container images (pod: containers:), with no handler code; the published file is
    cortex_cpu.yaml (deployed with `cortex deploy cortex_cpu.yaml`), here as the project's cortex.yaml."""
    root = tmp_path / "hello-world"
    shutil.copytree(DATA / "v040-realtime-hello-world", root)
    shutil.copyfile(root / "cortex_cpu.yaml", root / "cortex.yaml")
    message = start_error(root)
    assert "api 'hello-world': key 'pod'" in message
    assert "Cortex 0.36+" in message and "run the image" in message


def test_v020_tensorflow_predictor_threads_per_process_and_its_batching_not_applied(servers: dict[str, Any]) -> None:
    """0.20's TensorFlowPredictor with one model_path, threads_per_process: 2 and server_side_batching, which
    Cortex left to TensorFlow Serving: listed as not applied, and each request answered on its own."""
    from concurrent.futures import ThreadPoolExecutor

    url = ready(servers, "inception")
    answer = httpx.post(f"{url}/image-classifier-inception", json=sample("v020-tensorflow-inception-batching"))
    assert answer.status_code == 200, answer.text
    assert answer.text == "blue"
    urls = [f"https://example.com/{colour}.jpg" for colour in COLOURS[1:]] * 2
    with ThreadPoolExecutor(len(urls)) as pool:
        answers = list(pool.map(lambda u: httpx.post(f"{url}/image-classifier-inception", json={"url": u}), urls))
    assert [answer.text for answer in answers] == [u.rsplit("/", 1)[1][:-4] for u in urls]
    described = httpx.get(f"{url}/image-classifier-inception").json()
    assert described["max_concurrency"] == 2
    assert "server_side_batching" not in described
    (line,) = [line for line in servers["inception"].log.splitlines() if "accepted but not applied here" in line]
    assert "server_side_batching (tensorflow handler)" in line
