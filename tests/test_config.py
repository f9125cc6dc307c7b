"""modelserve.yaml: what is accepted, and errors that name the API, the key and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from modelserve.config import DEFAULT_MAX_BODY_SIZE, load_project_config, parse_project
from modelserve.errors import ConfigError
from tests.conftest import write_project

MODEL = "class Model:\n    def predict(self, inputs):\n        return inputs\n"


def project(tmp_path: Path, yaml_text: str | None, files: dict[str, str] | None = None) -> Path:
    content = {"model.py": MODEL, **(files or {})}
    if yaml_text is not None:
        content["modelserve.yaml"] = yaml_text
    return write_project(tmp_path / "project", content)


def config_error(tmp_path: Path, yaml_text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_project_config(project(tmp_path, yaml_text))
    return str(caught.value)


def test_full_api_is_read_with_every_key(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        """
        apis:
          - name: echo
            kind: realtime
            handler:
              path: model.py
              class: Model
              config: {greeting: hi}
            max_concurrency: 2
            max_queue_length: 0
            timeout: 1.5
            max_body_size: 1000
        """,
    )
    config = load_project_config(root)
    assert config.root == root.resolve()
    (api,) = config.apis
    assert api.name == "echo" and api.kind == "realtime"
    assert api.handler is not None
    assert (api.handler.path, api.handler.class_name, api.handler.config) == ("model.py", "Model", {"greeting": "hi"})
    assert (api.max_concurrency, api.max_queue_length, api.timeout, api.max_body_size) == (2, 0, 1.5, 1000)


def test_defaults(tmp_path: Path) -> None:
    (api,) = load_project_config(project(tmp_path, "apis:\n  - name: echo\n    handler: {path: model.py}\n")).apis
    assert api.kind == "realtime"
    assert api.handler is not None and api.handler.class_name is None and api.handler.config == {}
    assert (api.max_concurrency, api.max_queue_length, api.timeout) == (1, 100, None)
    assert api.max_body_size == DEFAULT_MAX_BODY_SIZE == 10 * 1024 * 1024


def test_a_bare_list_of_apis_is_accepted(tmp_path: Path) -> None:
    root = project(
        tmp_path,
        """
        - name: one
          handler: {path: model.py}
        - name: two
          handler: {path: model.py}
          max_concurrency: 3
        """,
    )
    apis = load_project_config(root).apis
    assert [api.name for api in apis] == ["one", "two"]
    assert apis[1].max_concurrency == 3


def test_a_folder_with_only_model_py_is_one_realtime_api(tmp_path: Path) -> None:
    config = load_project_config(project(tmp_path, None))
    (api,) = config.apis
    assert api.name == "model" and api.kind == "realtime"
    assert api.handler is not None and (api.handler.path, api.handler.class_name) == ("model.py", "Model")


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        (
            "apis:\n  - name: echo\n    handler: {path: model.py}\n    timout: 3\n",
            "api 'echo': unknown key 'timout' (known keys: batching, data_dir, description, devices, handler, kind,",
        ),
        (
            "apis:\n  - name: echo\n    handler: {path: model.py, klass: Model}\n",
            "api 'echo', handler: unknown key 'klass' (known keys: class, config, path)",
        ),
        (
            "apis:\n  - name: echo\n    handler: {path: model.py}\n    max_concurrency: two\n",
            "api 'echo': key 'max_concurrency': expected a positive integer, got 'two' (str)",
        ),
        (
            "apis:\n  - name: echo\n    handler: {path: model.py}\n    max_concurrency: 0\n",
            "api 'echo': key 'max_concurrency': expected a positive integer, got 0 (int)",
        ),
        (
            "apis:\n  - name: echo\n    handler: {path: model.py}\n    max_concurrency: true\n",
            "api 'echo': key 'max_concurrency': expected a positive integer, got True (bool)",
        ),
        (
            "apis:\n  - name: echo\n    handler: {path: model.py}\n    max_queue_length: -1\n",
            "api 'echo': key 'max_queue_length': expected an integer >= 0, got -1 (int)",
        ),
        (
            "apis:\n  - name: echo\n    handler: {path: model.py}\n    timeout: soon\n",
            "api 'echo': key 'timeout': expected a number > 0, got 'soon' (str)",
        ),
        (
            "apis:\n  - name: echo\n    handler: {path: model.py}\n    max_body_size: 1.5\n",
            "api 'echo': key 'max_body_size': expected a positive integer, got 1.5 (float)",
        ),
        (
            "apis:\n  - name: echo\n    handler: {path: model.py}\n    kind: batch\n",
            "api 'echo': key 'kind': expected one of 'realtime', 'async', got 'batch' (str)",
        ),
        (
            "apis:\n  - name: echo\n    handler: {path: model.py, config: [1, 2]}\n",
            "api 'echo', handler: key 'config': expected a mapping, got [1, 2] (list)",
        ),
        (
            "apis:\n  - name: echo\n    handler: model.py\n",
            "api 'echo': key 'handler': expected a mapping, got 'model.py' (str)",
        ),
        (
            "apis:\n  - name: echo\n    handler: {class: Model}\n",
            "api 'echo', handler: key 'path' is required",
        ),
        (
            "apis:\n  - name: echo\n    max_concurrency: 2\n",
            "api 'echo': needs a 'handler'",
        ),
        (
            "apis:\n  - handler: {path: model.py}\n",
            "api #1: key 'name': expected a URL segment",
        ),
        (
            "apis:\n  - name: a/b\n    handler: {path: model.py}\n",
            "api #1: key 'name': expected a URL segment (letters, digits, '-', '_', '.'), got 'a/b' (str)",
        ),
        (
            "apis:\n  - name: healthz\n    handler: {path: model.py}\n",
            "api 'healthz': key 'name': 'healthz' is reserved",
        ),
        (
            "apis:\n  - name: v2\n    handler: {path: model.py}\n",
            "api 'v2': key 'name': 'v2' is reserved",
        ),
        (
            "protocols: [native, grpc]\napis:\n  - name: echo\n    handler: {path: model.py}\n",
            "top level: key 'protocols': expected a list of 'native', 'v2', got ['native', 'grpc'] (list)",
        ),
        (
            "apis:\n  - name: echo\n    handler: {path: model.py}\n  - name: echo\n    handler: {path: model.py}\n",
            "api 'echo': key 'name': two APIs have this name",
        ),
        (
            "apis:\n  - just a string\n",
            "api #1: expected a mapping, got 'just a string' (str)",
        ),
        (
            "apis: []\n",
            "top level: key 'apis': expected a non-empty list of APIs, got [] (list)",
        ),
        (
            "api:\n  - name: echo\n    handler: {path: model.py}\n",
            "top level: unknown key 'api' "
            "(known keys: allowed_hosts, apis, auth, cors, docs, jobs, protocols, ray, tracing)",
        ),
        (
            "tracing: yes please\napis:\n  - name: echo\n    handler: {path: model.py}\n",
            "top level: key 'tracing': expected true or false, got 'yes please' (str)",
        ),
        (
            "42\n",
            "expected a mapping with 'apis:' or a list of APIs",
        ),
    ],
)
def test_invalid_files_name_the_api_the_key_and_the_expectation(tmp_path: Path, yaml_text: str, expected: str) -> None:
    message = config_error(tmp_path, yaml_text)
    assert "modelserve.yaml is not valid" in message
    assert expected in message


def test_a_missing_handler_file_is_named_with_the_folder(tmp_path: Path) -> None:
    message = config_error(tmp_path, "apis:\n  - name: iris\n    handler: {path: modle.py}\n")
    assert "api 'iris', handler: key 'path': file 'modle.py' not found in" in message
    assert str((tmp_path / "project").resolve()) in message


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    message = config_error(
        tmp_path,
        """
        apis:
          - name: iris
            handler: {path: modle.py}
            max_concurrency: two
          - name: echo
            handler: {path: model.py}
            timout: 3
        """,
    )
    lines = [line for line in message.splitlines() if line.startswith("  - ")]
    assert len(lines) == 3
    assert any("api 'iris'" in line and "'max_concurrency'" in line for line in lines)
    assert any("api 'iris'" in line and "modle.py" in line for line in lines)
    assert any("api 'echo'" in line and "'timout'" in line for line in lines)


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"modelserve.yaml, line 2, column 3: not valid YAML"):
        load_project_config(project(tmp_path, "apis: [\n  - name: echo\n"))


def test_a_missing_folder_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"project folder '.*nowhere' does not exist"):
        load_project_config(tmp_path / "nowhere")


def test_a_folder_with_neither_yaml_nor_model_py(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"has neither modelserve.yaml nor a model.py with a class Model"):
        load_project_config(tmp_path / "empty")


def test_parse_project_takes_already_parsed_data(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text(MODEL)
    config = parse_project([{"name": "echo", "handler": {"path": "model.py"}, "timeout": 2}], tmp_path)
    assert config.apis[0].timeout == 2.0
