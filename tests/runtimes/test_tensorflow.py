"""TensorFlow SavedModel APIs: signatures, conversion and its 400s, hooks, description.

The SavedModels are built once for the module (importing TensorFlow takes seconds).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.testclient import TestClient

import modelserve
from tests.conftest import REPO, write_project
from tests.models import iris_expected, iris_saved_model, two_inputs_saved_model

pytest.importorskip("tensorflow")

ROW = [5.1, 3.5, 1.4, 0.2]

HOOKS = """
labels = ["setosa", "versicolor", "virginica"]

def pre_inference(sample, signature, metadata):
    name = next(iter(signature[metadata["key"]].inputs))
    return {name: [sample]}

def post_inference(prediction, signature, metadata):
    return {
        "label": labels[int(prediction["label"][0])],
        "outputs": sorted(prediction),
        "signatures": sorted(signature),
    }
"""

BROKEN = """
def post_inference(prediction, signature, metadata):
    return prediction["logits"]
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tf_project")
    iris_saved_model(root / "iris")
    two_inputs_saved_model(root / "two")
    return write_project(
        root,
        {
            "hooks.py": HOOKS,
            "broken.py": BROKEN,
            "modelserve.yaml": """
                apis:
                  - name: iris
                    model: {path: iris, intra_op_threads: 1, inter_op_threads: 1}
                  - name: two
                    model: {path: two, format: tensorflow}
                  - name: scaled
                    model: {path: two, signature_key: scaled}
                  - name: hooked
                    model: {path: iris}
                    handler: {path: hooks.py, config: {key: serving_default}}
                  - name: broken
                    model: {path: iris}
                    handler: {path: broken.py}
            """,
        },
    )


@pytest.fixture(scope="module")
def client(project: Path) -> Iterator[TestClient]:
    app = modelserve.create_app(project)
    with TestClient(app) as client:
        client.portal.call(app.server.wait_loaded)
        yield client


def test_iris_without_hooks_answers_every_output(client: TestClient) -> None:
    probabilities, label = iris_expected([ROW])
    for body in ([ROW], {"x": [ROW]}):
        answer = client.post("/iris", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["label"] == label.tolist()
        np.testing.assert_allclose(answer.json()["probabilities"], probabilities, rtol=1e-5)


@pytest.mark.parametrize(("api", "factor"), [("two", 1), ("scaled", 10)])
def test_multiple_inputs_dtype_conversion_and_signature_key(client: TestClient, api: str, factor: int) -> None:
    answer = client.post(f"/{api}", json={"a": [[1, 2]], "b": [[3.0, -4.0]]})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"sum": [[4.0 * factor, -2.0 * factor]]}


@pytest.mark.parametrize(
    ("api", "body", "fragments"),
    [
        ("iris", [[1, 2, 3, "x"]], ["input 'x'", "float32", "[null, 4]", "'x'"]),
        ("iris", [1, 2, 3], ["input 'x'", "[null, 4] (rank 2)", "received shape [3] (rank 1), and its 3 values"]),
        ("iris", [[1, 2, 3]], ["input 'x'", "dimension 1 is 3, not 4"]),
        ("two", {"a": [[1, 2]], "b": [[0.5, 1]]}, ["input 'b'", "int32", "0.5"]),
        ("two", {"a": [[1, 2]]}, ["missing input 'b'", "'b' (int32 [null, 2])"]),
        ("two", {"a": [[1, 2]], "b": [[1, 2]], "c": 1}, ["unknown input 'c'", "'a' (float32 [null, 2])"]),
    ],
)
def test_bad_input_is_a_400_naming_the_input(client: TestClient, api: str, body: Any, fragments: list[str]) -> None:
    answer = client.post(f"/{api}", json=body)
    assert answer.status_code == 400, answer.text
    for fragment in fragments:
        assert fragment in answer.json()["error"]


def test_hooks_receive_signature_defs_and_a_dict_of_outputs(client: TestClient) -> None:
    answer = client.post("/hooked", json=[6.7, 3.0, 5.2, 2.3])
    assert answer.status_code == 200, answer.text
    label = ["setosa", "versicolor", "virginica"][int(iris_expected([[6.7, 3.0, 5.2, 2.3]])[1][0])]
    assert answer.json() == {"label": label, "outputs": ["label", "probabilities"], "signatures": ["serving_default"]}


def test_a_hook_that_raises_is_a_500_naming_the_hook_in_the_log(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="modelserve"):
        answer = client.post("/broken", json=[ROW])
    assert answer.status_code == 500
    assert "logits" not in answer.text
    assert "api 'broken': post_inference raised KeyError: 'logits'" in caplog.text


def test_get_describes_the_signature(client: TestClient) -> None:
    model = client.get("/iris").json()["model"]
    assert model["format"] == "tensorflow"
    assert model["signature_key"] == "serving_default"
    assert model["inputs"] == [{"name": "x", "dtype": "float32", "shape": [None, 4]}]
    assert model["outputs"] == [
        {"name": "label", "dtype": "int64", "shape": [None]},
        {"name": "probabilities", "dtype": "float32", "shape": [None, 3]},
    ]
    assert client.get("/scaled").json()["model"]["signature_key"] == "scaled"


def test_an_unknown_signature_key_fails_the_load_naming_the_signatures(project: Path) -> None:
    model = project / "two"  # a model outside the project folder is given by its absolute path
    write_project(
        project / "bad",
        {"modelserve.yaml": f"apis:\n  - name: bad\n    model: {{path: {model}, signature_key: nope}}\n"},
    )
    errors: list[modelserve.LoadError] = []
    app = modelserve.create_app(project / "bad", on_load_error=errors.append)
    with TestClient(app) as client:
        client.portal.call(app.server.wait_loaded)
        assert client.get("/readyz").status_code == 503
    assert len(errors) == 1
    assert "no signature 'nope' (signatures: scaled, serving_default)" in str(errors[0])


@pytest.mark.slow
def test_the_example_answers_what_its_readme_says(start_server: Any) -> None:
    from tests.runtimes.test_onnx import readme_requests

    example = REPO / "examples" / "iris-tensorflow"
    requests = readme_requests(example / "README.md")
    assert len(requests) == 2
    server = start_server(example, "--no-access-log")
    server.wait_ready()
    for path, body, expected in requests:
        answer = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
        assert answer.status_code == 200, answer.text
        assert answer.text == expected
