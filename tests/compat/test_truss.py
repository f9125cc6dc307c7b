"""Truss folders served as they are: published Truss code (tests/data/truss, see SOURCES.md there), each
served unchanged through a real server, each sent the request its own tests send and checked against the
answer they assert. Then the pieces that need no server: the config.yaml mapping, the constructor
arguments, the log filter.

The Truss tests quoted are in basetenlabs/truss ``truss/tests/test_model_inference.py`` unless named.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelserve.backends.model_class import check_constructor, construct
from modelserve.compat.truss import api_name, read_truss_config
from modelserve.compat.truss_backend import CONSTRUCTOR_ARGS, truss_arguments
from modelserve.config import ApiConfig, HandlerConfig, load_project_config
from modelserve.errors import ConfigError, LoadError
from modelserve.logs import LibraryLevelFilter, add_user_code_dir
from modelserve.secrets import Secrets

DATA = Path(__file__).resolve().parents[1] / "data" / "truss"


def post(server: Any, path: str, payload: Any = None, timeout: float = 10, **kwargs: Any) -> httpx.Response:
    return httpx.post(server.url + path, json={} if payload is None else payload, timeout=timeout, **kwargs)


def served(start_server: Any, case: str | Path, *args: str, env: dict[str, str] | None = None) -> Any:
    server = start_server(case if isinstance(case, Path) else DATA / case, *args, env=env)
    server.wait_ready()
    return server


#: Cases served with no extra arguments: their servers start together, once per module, while the first
#: tests run (one at a time, each would cost a second of start-up).
POOLED = (
    "test_basic_truss",
    "test_truss",
    "test_async_truss",
    "test_concurrency_truss",
    "test_streaming_truss",
    "test_streaming_async_generator_truss",
    "test_truss_with_error",
    "test_streaming_truss_with_error",
    "test_pyantic_v2",
    "annotated_types_truss",
    "python_version",
    "test_build_commands_truss",
    "bundled_package",
    "external_package/truss",
    "env_vars",
    "jsonformatter",
    "init_environment",
    "postprocess",
    "streaming_postprocess",
    "postprocess_async_generator",
    "preprocess_async_generator",
    "streaming_response",
    "errors",
    "async_streaming_cancellation",
)


@pytest.fixture(scope="module")
def pool(start_server_module: Any) -> Any:
    """pool(case) -> the module's ready server of that case."""
    servers = {case: start_server_module(DATA / case) for case in POOLED}

    def ready(case: str) -> Any:
        servers[case].wait_ready()
        return servers[case]

    return ready


def log_lines(server: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.log.splitlines() if line.startswith("{")]


def eventually(predicate: Any, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# --------------------------------------------------------------------------------------------------
# Truss's test data folders, served as they are


def test_basic_truss_is_served_at_its_model_name_and_at_root(pool: Any) -> None:
    server = pool("test_basic_truss")
    for path in ("/basic-truss", "/"):  # model_name: basic truss
        answer = post(server, path, {"x": [1, 2]})
        assert answer.status_code == 200
        assert answer.json() == {"x": [1, 2]}  # the `truss init` template returns its input
    described = httpx.get(server.url + "/basic-truss").json()
    assert described["secrets"] == ["bar", "foo"]  # names only
    # platform keys accepted, listed once
    assert server.log.count("not applied by modelserve: requirements, resources, system_packages") == 1


def test_truss_constructor_kwargs_and_bundled_packages(pool: Any) -> None:
    # test_truss: __init__(**kwargs) reads kwargs["data_dir"], ["config"], ["secrets"]; packages/ on sys.path
    server = pool("test_truss")
    assert post(server, "/x-4").json() == {"predictions": []}


def test_async_truss(pool: Any) -> None:
    server = pool("test_async_truss")
    assert post(server, "/test-async").json() == {"preprocess_value": "value", "postprocess_value": "value"}


@pytest.mark.slow
def test_concurrency_truss_runs_two_predicts_at_once(pool: Any) -> None:
    # runtime.predict_concurrency: 2; each predict sleeps 2 s: while three requests are out, the server's gauges
    # show two predicts running and the third waiting. (Timing it, "two answer within 3 s, the third cannot",
    # left the first two a second of margin and the third 0.8 s on a busy machine.)
    server = pool("test_concurrency_truss")
    assert httpx.get(server.url + "/model").json()["max_concurrency"] == 2
    results: dict[int, Any] = {}

    def call(index: int) -> None:
        results[index] = post(server, "/model", {"n": index}, timeout=60)

    threads = [threading.Thread(target=call, args=(index,)) for index in range(3)]
    for thread in threads:
        thread.start()
    running, waiting = 'modelserve_requests_in_flight{api="model"} 2.0', 'modelserve_requests_waiting{api="model"} 1.0'
    seen = eventually(lambda: {running, waiting} <= set(httpx.get(server.url + "/metrics").text.splitlines()), 30)
    for thread in threads:
        thread.join()
    assert seen, "never two predicts running and one waiting"
    assert [(results[index].status_code, results[index].json()) for index in range(3)] == [
        (200, {"n": index}) for index in range(3)
    ]


@pytest.mark.slow
def test_streaming_truss_streams_a_sync_generator(pool: Any) -> None:
    server = pool("test_streaming_truss")
    with httpx.stream("POST", server.url + "/test-streaming", json={}, timeout=10) as answer:
        assert answer.headers["transfer-encoding"] == "chunked"
        assert answer.read() == b"01234"


def test_async_generator_truss_streams_chunk_by_chunk(pool: Any) -> None:
    # test_async_streaming: chunked, and the chunks "0".."4"
    server = pool("test_streaming_async_generator_truss")
    with httpx.stream("POST", server.url + "/test-streaming-async-generator", json={}, timeout=10) as answer:
        assert answer.headers["transfer-encoding"] == "chunked"
        assert [chunk.decode() for chunk in answer.iter_bytes(1)] == ["0", "1", "2", "3", "4"]


def test_async_generator_truss_collects_the_stream_for_accept_json(pool: Any) -> None:
    # test_async_streaming, second half: Accept: application/json gets one JSON document of the chunks
    server = pool("test_streaming_async_generator_truss")
    answer = post(server, "/test-streaming-async-generator", headers={"accept": "application/json"})
    assert "transfer-encoding" not in answer.headers
    assert answer.json() == "01234"


def test_truss_with_error_logs_the_traceback_through_its_packages(pool: Any) -> None:
    # test_truss_with_error_stacktrace: predict calls packages/helpers_1.py, which raises in helpers_2.py
    server = pool("test_truss_with_error")
    answer = post(server, "/test", headers={"x-request-id": "err-1"})
    assert answer.status_code == 500
    assert answer.json()["request_id"] == "err-1"
    assert "Crashed" not in answer.text  # the traceback goes to the log, not to the client
    log = server.log
    for line in (
        "Traceback (most recent call last):",
        "return helpers_1.foo(123)",
        'packages/helpers_1.py", line 5, in foo',
        'packages/helpers_2.py", line 2, in bar',
        "Exception: Crashed in `bar`.",
    ):
        assert line in log


def test_streaming_truss_with_error_is_cut_then_serves_again(pool: Any) -> None:
    # test_streaming_with_error_and_stacktrace. Truss ends the broken stream cleanly after "012";
    # modelserve aborts it (a truncated chunked body), so that a client never takes it for a whole answer.
    server = pool("test_streaming_truss_with_error")
    received = b""
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", server.url + "/test-streaming-with-error", json={"throw_error": True}) as answer:
            for chunk in answer.iter_bytes(1):
                received += chunk
    assert received == b"012"
    assert "Exception: Crashed in `bar`." in server.log
    answer = post(server, "/test-streaming-with-error", {"throw_error": False})
    assert answer.content == b"01234"


def test_pydantic_v2_truss_returns_its_json_string_as_a_json_string(pool: Any) -> None:
    # test_requirements_pydantic: predict returns model_dump_json(indent=4), a str
    server = pool("test_pyantic_v2")
    answer = post(server, "/test-requirements-file")
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == '{\n    "foo": "bla",\n    "bar": 123\n}'


def test_annotated_types_truss_parses_and_encodes_pydantic_models(pool: Any) -> None:
    # predict(self, model_input: ModelInput) -> ModelOutput
    server = pool("annotated_types_truss")
    assert post(server, "/test-annotated-types", {"prompt": "hello"}).json() == {"generated_text": "hello"}
    refused = post(server, "/test-annotated-types", {"text": "hello"})
    assert refused.status_code == 400
    assert [(issue["loc"], issue["type"]) for issue in refused.json()["detail"]] == [(["prompt"], "missing")]


def test_python_version_truss_returns_a_json_string(pool: Any) -> None:
    # test_predict_python_versions: response.json() is "3.11"; python_version itself is Truss's build setting
    server = pool("python_version")
    answer = post(server, "/model")
    assert answer.json() == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert "not applied by modelserve: python_version" in server.log


def test_build_commands_are_listed_not_run(pool: Any) -> None:
    # test_build_commands_truss: Truss's image build runs the sed of build_commands, so its answer is
    # "TEST_SECOND_VALUE"; modelserve runs no build: the packages/ file as shipped, and a log line says so.
    server = pool("test_build_commands_truss")
    answer = post(server, "/test-build-commands")
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == "TEST_FIRST_VALUE"
    assert "not applied by modelserve: resources, system_packages, build_commands" in server.log


def test_load_failure_stops_the_server(start_server: Any) -> None:
    # test_model_load_failure_truss: the server is down after load() raised
    server = start_server(DATA / "model_load_failure_test")
    assert server.wait_exit(30) == 3
    assert "Model.load() raised Exception" in server.log
    assert "Raising exception in model load" in server.log  # load()'s print


def test_docker_server_truss_is_refused_with_the_reason(start_server: Any) -> None:
    server = start_server(DATA / "test_env_vars")
    assert server.wait_exit(30) == 2
    assert "docker_server" in server.log and "runs its own server image" in server.log


def test_bundled_package(pool: Any) -> None:
    # conftest's custom_model_truss_dir_with_bundled_packages
    server = pool("bundled_package")
    assert post(server, "/model", [1]).json() == {"predictions": [1]}


def test_external_package_dirs(pool: Any) -> None:
    # conftest's custom_model_with_external_package: imports from two folders outside the truss
    server = pool("external_package/truss")
    assert post(server, "/model", [5, 6, 7]).json() == [1, 1, 1]


def test_environment_variables_are_set_before_import(pool: Any, start_server: Any) -> None:
    # test_control_truss_patching.py::test_patch_env_var: environment_variables {foo: bar} -> "bar"
    assert post(pool("env_vars"), "/model", [1]).json() == "bar"
    # a variable already set in the server's environment wins over config.yaml
    assert post(served(start_server, "env_vars", env={"foo": "deployed"}), "/model", [1]).json() == "deployed"


def test_data_dir_config_and_packages_of_a_truss_example(pool: Any) -> None:
    # truss-examples jsonformatter: reads data_dir / "schema.json" and config["model_metadata"]["llm_model"]
    # (its requirements are stand-ins under its packages/, see tests/data/truss/SOURCES.md)
    server = pool("jsonformatter")
    answer = post(server, "/jsonformatter", {"prompt": "Generate a car"}).json()
    standin = answer.pop("_standin")
    llm = "databricks/dolly-v2-3b"
    assert standin == {"prompt": "Generate a car", "model": llm, "tokenizer": llm}
    assert set(answer) == {"car", "owner"}
    assert set(answer["car"]["features"]) == {"audio", "safety", "performance"}


# --------------------------------------------------------------------------------------------------
# Models of Truss's own tests (test_model_inference.py), written as its `_temp_truss` writes them


def test_user_logging_from_load_appears(start_server: Any) -> None:
    # test_model_load_logs: logging.info("User Load Message") in load()
    server = served(start_server, "load_logs", "--log-format", "json")
    line = next(line for line in log_lines(server) if line["message"] == "User Load Message")
    assert (line["levelname"], line["logger"]) == ("INFO", "root")


@pytest.mark.slow
def test_user_logging_in_predict_carries_the_request_id(start_server: Any) -> None:
    # test_async_non_streaming_with_cancellation's model, when the client waits: logging.info in predict
    server = served(start_server, "async_non_streaming_cancellation", "--log-format", "json")
    answer = post(server, "/model", headers={"x-request-id": "truss-log-1"})
    assert answer.json() == "Done"
    lines = {line["message"]: line for line in log_lines(server) if line.get("logger") == "root"}
    for message in ("Start sleep", "done sleep, check request.", "Not cancelled."):
        assert (lines[message]["request_id"], lines[message]["api"]) == ("truss-log-1", "model")


def test_secrets_from_the_secrets_folder(start_server: Any, tmp_path: Path) -> None:
    # test_secrets_truss: the secret mounted as /secrets/secret is returned
    server = served(start_server, "secrets", "--secrets-dir", str(DATA / "secrets" / "secrets"))
    assert post(server, "/secrets-truss").json() == "secret_value"
    assert "secret_value" not in httpx.get(server.url + "/secrets-truss").text
    assert "secret_value" not in server.log


def test_secrets_from_the_environment(start_server: Any, tmp_path: Path) -> None:
    server = served(start_server, "secrets", "--secrets-dir", str(tmp_path), env={"secret": "from-env"})
    assert post(server, "/secrets-truss").json() == "from-env"


def test_secret_declared_but_not_set_is_a_500_that_says_how(start_server: Any, tmp_path: Path) -> None:
    # test_secrets_truss, "the secret is not mounted"
    server = served(start_server, "secrets", "--secrets-dir", str(tmp_path))
    answer = post(server, "/secrets-truss")
    assert answer.status_code == 500
    assert "secret 'secret' is declared but not set; set the environment variable secret" in server.log


def test_secret_not_declared_is_a_500_that_says_how(start_server: Any) -> None:
    # test_secrets_truss, "the secret is not specified in the config", though it is mounted
    server = served(start_server, "secrets_undeclared", "--secrets-dir", str(DATA / "secrets" / "secrets"))
    answer = post(server, "/secrets-truss")
    assert answer.status_code == 500
    assert "secret 'secret' is not declared; add it under 'secrets:'" in server.log
    assert "secret_value" not in server.log and "secret_value" not in answer.text


def test_environment_is_none(pool: Any) -> None:
    # test_init_environment_parameter, "a truss deployment with no associated environment"
    server = pool("init_environment")
    assert "Executing model.load with environment: None" in server.log
    answer = post(server, "/init-no-environment-truss")
    assert answer.status_code == 200 and answer.json() is None


@pytest.mark.slow
def test_postprocess(pool: Any) -> None:
    server = pool("postprocess")
    assert post(server, "/model").json() == ["0 modified", "1 modified"]


@pytest.mark.slow
def test_sync_generator_postprocess_streams(pool: Any) -> None:
    # test_streaming_postprocess: predict returns ["0", "1"], postprocess yields each one modified
    server = pool("streaming_postprocess")
    with httpx.stream("POST", server.url + "/model", json={}, timeout=10) as answer:
        assert answer.status_code == 200
        assert answer.read() == b"0 modified1 modified"


def test_async_generator_postprocess_streams(pool: Any) -> None:
    # test_postprocess_async_generator_streaming
    server = pool("postprocess_async_generator")
    with httpx.stream("POST", server.url + "/model", json={"nums": ["1", "2"]}) as answer:
        assert answer.headers["transfer-encoding"] == "chunked"
        assert [chunk.decode() for chunk in answer.iter_bytes(1)] == ["1", "2"]


def test_async_generator_preprocess_feeds_predict(pool: Any) -> None:
    # test_preprocess_async_generator
    server = pool("preprocess_async_generator")
    assert post(server, "/model", {"nums": ["1", "2"]}).json() == ["1", "2"]


def test_a_starlette_response_is_sent_as_is(pool: Any) -> None:
    # test_truss_with_streaming_response
    server = pool("streaming_response")
    answer = post(server, "/model")
    assert answer.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert answer.text.strip().split("\n") == ["data: 0", "", "data: 1", "", "data: 2"]


def test_errors_are_500_and_logged(pool: Any) -> None:
    # test_truss_with_errors
    server = pool("errors")
    answer = post(server, "/model")
    assert answer.status_code == 500 and "error" in answer.json()
    assert "ValueError: error" in server.log


@pytest.mark.slow
def test_async_streaming_cancellation_runs_the_users_own_branch(pool: Any) -> None:
    # test_async_streaming_with_cancellation (seed 002): the model polls request.is_disconnected() itself
    server = pool("async_streaming_cancellation")
    with pytest.raises(httpx.ReadTimeout):
        with httpx.Client(timeout=httpx.Timeout(1.0, connect=1.0, read=1.0)) as client:
            client.post(server.url + "/model", json={}, timeout=1.0).raise_for_status()
    # The published model looks at t = 1 s, when the client's 1 s timeout fires: on a busy machine the
    # disconnect may be seen at that first look. Either way the user's own branch must run.
    assert eventually(lambda: "Cancelled (during gen)." in server.log or "Cancelled (before gen)." in server.log)


@pytest.mark.slow
def test_async_non_streaming_cancellation_runs_the_users_own_branch(start_server: Any) -> None:
    # test_async_non_streaming_with_cancellation
    server = served(start_server, "async_non_streaming_cancellation")
    with pytest.raises(httpx.ReadTimeout):
        with httpx.Client(timeout=httpx.Timeout(1.0, connect=1.0, read=1.0)) as client:
            client.post(server.url + "/model", json={}, timeout=1.0).raise_for_status()
    assert eventually(lambda: "Cancelled (before gen)." in server.log, timeout=3)


def test_modelserve_yaml_beside_config_yaml_wins_and_may_point_at_it(start_server: Any, tmp_path: Path) -> None:
    root = shutil.copytree(DATA / "test_truss", tmp_path / "truss")
    (root / "modelserve.yaml").write_text("apis:\n  - name: scorer\n    truss: config.yaml\n    max_concurrency: 3\n")
    server = served(start_server, root)
    assert post(server, "/scorer").json() == {"predictions": []}  # the same constructor arguments
    assert httpx.post(server.url + "/x-4", json={}).status_code == 404
    assert httpx.get(server.url + "/scorer").json()["max_concurrency"] == 3


# --------------------------------------------------------------------------------------------------
# The config.yaml mapping, without a server


def test_truss_folder_mapping() -> None:
    project = load_project_config(DATA / "test_concurrency_truss")
    (api,) = project.apis
    assert (api.name, api.max_concurrency, api.data_dir, api.truss) == ("model", 2, "data", "config.yaml")
    assert api.handler is not None and (api.handler.path, api.handler.class_name) == ("model/model.py", "Model")
    assert api.env == {"OTEL_TRACING_NDJSON_FILE": "/tmp/otel_traces.ndjson"}
    project = load_project_config(DATA / "test_truss")
    (api,) = project.apis
    assert api.python_path == ["packages"]
    assert api.handler is not None and api.handler.config["model_metadata"] == {}  # Truss's defaults filled in
    assert api.handler.config["resources"]["memory"] == "2Gi"  # and the whole file


@pytest.mark.parametrize(
    ("model_name", "expected"),
    [
        ("basic truss", "basic-truss"),
        ("Test Streaming with Error", "test-streaming-with-error"),
        ("TRT Whisper - Dynamic Batching", "trt-whisper-dynamic-batching"),
        ("x-4", "x-4"),
        (None, "model"),
        ("healthz", "model"),
        ("!!!", "model"),
    ],
)
def test_api_name_from_model_name(model_name: Any, expected: str) -> None:
    assert api_name(model_name) == expected


def test_truss_config_keys(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "predictor.py").write_text("class Scorer:\n    def predict(self, x):\n        return x\n")
    (tmp_path / "config.yaml").write_text(
        # truss/tests/test_config.py::test_from_yaml_environment_variables's values, and the class keys
        "environment_variables: {foo: bar, bool: true, int: 0}\n"
        "model_module_dir: src\nmodel_class_filename: predictor.py\nmodel_class_name: Scorer\n"
        "secrets: {hf_access_token: null}\nresources: {cpu: '1'}\nlive_reload: true\n"
        "runtime: {predict_concurrency: 4, streaming_read_timeout: 60}\n"
    )
    settings = read_truss_config(tmp_path)
    assert settings.env == {"foo": "bar", "bool": "true", "int": "0"}
    assert (settings.handler_path, settings.class_name, settings.max_concurrency) == ("src/predictor.py", "Scorer", 4)
    assert settings.secrets == {"hf_access_token": None}
    assert settings.not_applied == ["resources", "live_reload", "runtime.streaming_read_timeout"]
    assert load_project_config(tmp_path).apis[0].handler is not None  # model_module_dir: src is recognised


def test_truss_key_takes_paths_relative_to_the_truss_config(tmp_path: Path) -> None:
    shutil.copytree(DATA / "test_truss", tmp_path / "vendor" / "x4")
    (tmp_path / "modelserve.yaml").write_text("apis:\n  - name: x4\n    truss: vendor/x4/config.yaml\n")
    (api,) = load_project_config(tmp_path).apis
    assert api.handler is not None and api.handler.path == "vendor/x4/model/model.py"
    assert (api.python_path, api.data_dir) == (["vendor/x4/packages"], "vendor/x4/data")
    assert api.on_disconnect == "cancel"  # modelserve.yaml's default, also with truss:


def test_truss_config_problems_are_reported_together(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "config.yaml").write_text("runtime: {predict_concurrency: 0}\nexternal_package_dirs: [../nowhere]\n")
    with pytest.raises(ConfigError) as caught:
        load_project_config(tmp_path)
    message = str(caught.value)
    assert "'model/model.py' was not found" in message
    assert "runtime.predict_concurrency': expected a positive integer, got 0" in message
    assert "folder '../nowhere' not found" in message


# --------------------------------------------------------------------------------------------------
# Constructor arguments


class NamedArguments:
    def __init__(self, data_dir: Path, config: dict[str, Any], secrets: Any, environment: Any) -> None:
        self.got = (data_dir, config, secrets, environment)


class AllArguments:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


class UnknownArgument:
    def __init__(self, config: Any, tokenizer: Any) -> None:
        pass


def test_constructor_gets_what_it_names_or_everything(tmp_path: Path) -> None:
    api = ApiConfig(name="m", handler=HandlerConfig(config={"k": 1}), secrets={"token": None}, data_dir="weights")
    available = truss_arguments(api, tmp_path, metrics_client=None)  # type: ignore[arg-type]
    assert set(available) == set(CONSTRUCTOR_ARGS)
    named = construct(NamedArguments, "m", available)
    assert named.got[0] == tmp_path.resolve() / "weights"
    assert named.got[1] == {"k": 1} and list(named.got[2]) == ["token"] and named.got[3] is None
    everything = construct(AllArguments, "m", available).kwargs
    assert set(everything) == set(CONSTRUCTOR_ARGS)
    assert everything["lazy_data_resolver"].block_until_download_complete() == ""
    assert truss_arguments(ApiConfig(name="m"), tmp_path, None)["data_dir"] == tmp_path.resolve() / "data"  # type: ignore[arg-type]


def test_unknown_constructor_argument_lists_what_can_be_asked_for() -> None:
    with pytest.raises(LoadError) as caught:
        check_constructor(UnknownArgument, "model.py:UnknownArgument", CONSTRUCTOR_ARGS)
    assert "requires ['tokenizer']" in str(caught.value)
    listed = "config, data_dir, secrets, environment, lazy_data_resolver, metrics_client, device (or **kwargs)"
    assert listed in str(caught.value)


def test_secrets_of_a_modelserve_yaml_api(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("class Model:\n    def predict(self, x):\n        return x\n")
    (tmp_path / "modelserve.yaml").write_text(
        "apis:\n  - name: a\n    handler: {path: model.py}\n    secrets: [token]\n    data_dir: weights\n"
    )
    (api,) = load_project_config(tmp_path).apis
    assert (api.secrets, api.data_dir) == ({"token": None}, "weights")
    assert isinstance(truss_arguments(api, tmp_path, None)["secrets"], Secrets)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Logging: user code at --log-level, libraries at their own level


def record(name: str, level: int, pathname: str) -> logging.LogRecord:
    return logging.LogRecord(name, level, pathname, 1, "line", (), None)


def test_library_level_filter(tmp_path: Path) -> None:
    add_user_code_dir(str(tmp_path))
    keep = LibraryLevelFilter().filter
    assert keep(record("root", logging.INFO, "/anywhere.py"))
    assert keep(record("modelserve_project.model", logging.DEBUG, str(tmp_path / "model.py")))
    assert keep(record("helpers", logging.INFO, str(tmp_path / "packages" / "helpers.py")))
    assert not keep(record("somelib", logging.INFO, "/usr/lib/python3/site-packages/somelib/x.py"))
    assert keep(record("somelib", logging.WARNING, "/usr/lib/python3/site-packages/somelib/x.py"))
    logging.getLogger("somelib.sub").setLevel(logging.INFO)  # the user asked for it
    try:
        assert keep(record("somelib.sub.deeper", logging.INFO, "/usr/lib/python3/site-packages/somelib/x.py"))
    finally:
        logging.getLogger("somelib.sub").setLevel(logging.NOTSET)
