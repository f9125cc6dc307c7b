"""Containment: user code must be in the project folder (after symlinks), a relative model path must not
leave it, and integers must fit the input's dtype (issue #16, item 5)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from onnx import TensorProto, helper

from modelserve.config import load_project_config
from modelserve.errors import ConfigError
from tests.conftest import write_project
from tests.models import save_model

MODEL = """
class Model:
    def predict(self, inputs):
        return inputs
"""


def outside_file(tmp_path: Path) -> Path:
    return write_project(tmp_path / "elsewhere", {"evil.py": MODEL}) / "evil.py"


def test_a_symlinked_handler_outside_the_project_is_refused_by_the_server(tmp_path: Path, start_server: Any) -> None:
    evil = outside_file(tmp_path)
    root = write_project(
        tmp_path / "project", {"modelserve.yaml": "apis:\n  - name: m\n    handler: {path: model.py, class: Model}\n"}
    )
    (root / "model.py").symlink_to(evil)
    server = start_server(root)
    assert server.wait_exit() == 2
    assert "modelserve: error:" in server.log
    assert "'model.py' leads to" in server.log and "outside the project folder" in server.log
    assert str(evil) in server.log


@pytest.mark.parametrize("path", ["../elsewhere/evil.py", "ABSOLUTE", "sub/../../elsewhere/evil.py"])
def test_a_handler_path_outside_the_project_is_a_config_error(tmp_path: Path, path: str) -> None:
    evil = outside_file(tmp_path)
    path = str(evil) if path == "ABSOLUTE" else path
    root = write_project(
        tmp_path / "project", {"modelserve.yaml": f"apis:\n  - name: m\n    handler: {{path: {path}}}\n"}
    )
    with pytest.raises(ConfigError, match="outside the project folder") as info:
        load_project_config(root)
    assert repr(path) in str(info.value)


def test_a_cortex_handler_outside_the_project_is_refused(tmp_path: Path) -> None:
    outside_file(tmp_path)
    root = write_project(
        tmp_path / "project",
        {"cortex.yaml": "- name: m\n  kind: RealtimeAPI\n  handler: {type: python, path: ../elsewhere/evil.py}\n"},
    )
    with pytest.raises(ConfigError, match="'../elsewhere/evil.py' leads to .* outside the project folder"):
        load_project_config(root)


def test_a_cortex_python_path_outside_the_project_is_refused(tmp_path: Path) -> None:
    outside_file(tmp_path)
    handler = "handler: {type: python, path: model.py, python_path: ../elsewhere}"
    root = write_project(tmp_path / "project", {"model.py": MODEL, "cortex.yaml": f"- name: m\n  {handler}\n"})
    with pytest.raises(ConfigError, match="key 'python_path': '../elsewhere' leads to .* outside the project folder"):
        load_project_config(root)


def test_a_truss_model_file_symlinked_outside_the_project_is_refused(tmp_path: Path) -> None:
    evil = outside_file(tmp_path)
    root = write_project(tmp_path / "project", {"config.yaml": "model_name: m\n"})
    (root / "model").mkdir()
    (root / "model" / "model.py").symlink_to(evil)
    with pytest.raises(ConfigError, match="'model/model.py' leads to .* outside the project folder"):
        load_project_config(root)


def test_a_relative_model_path_may_not_leave_the_project_but_an_absolute_one_may(tmp_path: Path) -> None:
    model = int64_identity(tmp_path / "shared" / "m.onnx")
    yaml = "apis:\n  - name: m\n    model: {{path: {}}}\n"
    root = write_project(tmp_path / "project", {"modelserve.yaml": yaml.format("../shared/m.onnx")})
    with pytest.raises(ConfigError, match="'../shared/m.onnx' leaves the project folder"):
        load_project_config(root)
    (root / "modelserve.yaml").write_text(yaml.format(model))
    assert load_project_config(root).apis[0].model.path == str(model)  # type: ignore[union-attr]


def test_import_file_refuses_a_path_outside_the_project(tmp_path: Path) -> None:
    from modelserve.errors import LoadError
    from modelserve.project import import_file

    evil = outside_file(tmp_path)
    root = write_project(tmp_path / "project", {"ok.py": "x = 1\n"})
    with pytest.raises(LoadError, match="outside the project folder"):
        import_file(root, os.path.relpath(evil, root))


# ------------------------------------------------------------------------------------------------
# Integers out of the input dtype's range: a 400 naming the input and the range


def int64_identity(path: Path) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["ids"], ["out"])],
        "ids",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("out", TensorProto.INT64, [None])],
    )
    return save_model(graph, path)


@pytest.fixture(scope="module")
def int_server(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> Any:
    pytest.importorskip("onnxruntime")
    root = tmp_path_factory.mktemp("ints")
    int64_identity(root / "ids.onnx")
    write_project(root, {"modelserve.yaml": "apis:\n  - name: ids\n    model: {path: ids.onnx}\n"})
    server = start_server_module(root)
    server.wait_ready()
    return server


@pytest.mark.parametrize(
    "body, shown",
    [
        ("[-9223372036854775809, 1]", "-9.223372036854776e+18"),  # JSON parsers give it as the nearest float
        ("[9223372036854775808]", "9223372036854775808"),
        ("[1, 18446744073709551616]", "1.8446744073709552e+19"),
        ("[9.3e18]", "9.3e+18"),
    ],
)
def test_an_integer_out_of_range_is_a_400_naming_the_input_and_the_range(
    int_server: Any, body: str, shown: str
) -> None:
    answer = httpx.post(int_server.url + "/ids", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert "input 'ids'" in error and shown in error
    assert "-9223372036854775808 to 9223372036854775807" in error


@pytest.mark.parametrize("body", ["[-9223372036854775808, 9223372036854775807]", "[1.0, 2.0]"])
def test_integers_in_range_are_served_exactly(int_server: Any, body: str) -> None:
    answer = httpx.post(int_server.url + "/ids", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert [int(x) for x in answer.json()["out"]] == [
        int(float(x)) if "." in x else int(x) for x in body[1:-1].split(",")
    ]


@pytest.mark.parametrize(
    "dtype, value, shown",
    [
        ("uint64", [-1], "-1"),
        ("uint64", [1.8446744073709552e19], "1.8446744073709552e+19"),  # 2**64 as a JSON parser gives it
        ("uint8", [300], "300"),
        ("int32", [[1], [2**31]], "2147483648"),
        ("int64", [[1, 2], [3, -(2**63) - 1]], "-9223372036854775809"),  # a Python int numpy cannot hold
    ],
)
def test_the_converter_names_the_value_and_the_range(dtype: str, value: Any, shown: str) -> None:
    import numpy as np

    from modelserve.runtimes._tensors import _Unusable, converter_for

    info = np.iinfo(dtype)
    with pytest.raises(_Unusable, match=rf"holds {re.escape(shown)}, .*{info.min} to {info.max}"):
        converter_for(np.dtype(dtype))(value)


# ------------------------------------------------------------------------------------------------
# create_app that fails leaves the caller in its own folder (issue #28)


@pytest.fixture
def back_home() -> Any:
    """Put the working directory back after the test, whatever create_app did."""
    import modelserve.project

    before, moved = os.getcwd(), modelserve.project._moved
    yield
    os.chdir(before)
    modelserve.project._moved = moved


@pytest.mark.parametrize(
    "source", ["class Model:\n    def predict(self, inputs)\n", "raise ImportError('no torch')\n", "x = 1\n"]
)
def test_create_app_that_fails_restores_the_working_directory(tmp_path: Path, back_home: None, source: str) -> None:
    import modelserve
    from modelserve.errors import LoadError

    caller = tmp_path / "caller"
    caller.mkdir()
    write_project(caller / "broken", {"model.py": source})
    os.chdir(caller)
    with pytest.raises(LoadError):
        modelserve.create_app("broken")
    assert os.getcwd() == str(caller)


def test_after_a_failed_create_app_relative_paths_are_the_programs(tmp_path: Path, back_home: None) -> None:
    import modelserve
    from modelserve.errors import LoadError

    caller = tmp_path / "caller"
    write_project(caller / "good", {"model.py": MODEL})
    write_project(caller / "broken", {"model.py": "raise ValueError('bad')\n"})
    os.chdir(caller)
    first = modelserve.create_app("good")  # moves into good/, as a served project does
    assert os.getcwd() == str(caller / "good")
    with pytest.raises(LoadError):
        modelserve.create_app("broken")  # relative to the program's folder, not good/
    assert os.getcwd() == str(caller / "good")
    again = modelserve.create_app("good")  # still relative to the program's folder
    assert again.server.project.root == first.server.project.root == caller / "good"
