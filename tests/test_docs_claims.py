"""What docs/cli.md and docs/configuration.md promise about bad values, where no other test held them to it:
every bad option or key is refused before anything is served (exit 2, a line naming it, no traceback)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelserve.cli import main
from modelserve.config import load_project_config
from modelserve.errors import ConfigError
from tests.conftest import REPO, free_port, write_project

MODEL = """
class Model:
    def predict(self, inputs):
        return inputs
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A realtime-only project: no async API, so nothing but the command line itself can refuse --jobs-store."""
    return write_project(tmp_path_factory.mktemp("docs-claims") / "project", {"model.py": MODEL})


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        # Bound as it is, an empty host means every interface.
        ("--host", "", "a host name or address"),
        ("--host", "  ", "a host name or address"),
        # Ignored until an async API is added, then refused: refused at once instead.
        ("--jobs-store", "bogus", "sqlite, memory or a redis:// URL"),
        ("--jobs-store", "", "sqlite, memory or a redis:// URL"),
        ("--jobs-store", "sqlite://jobs.db", "sqlite, memory or a redis:// URL"),
        ("--jobs-store", "http://cache:6379", "sqlite, memory or a redis:// URL"),
    ],
)
def test_a_bad_option_value_exits_2_naming_the_option(
    project: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, expected: str
) -> None:
    assert main([str(project), option, value, "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert f"modelserve: error: argument {option}: expected {expected}" in err
    assert f"got {value!r}" in err


@pytest.mark.parametrize("value", ["sqlite", "memory", "redis://localhost:6379/0", "rediss://cache:6380", "unix:///r"])
def test_the_documented_jobs_stores_are_accepted(value: str) -> None:
    from modelserve.cli import build_parser

    assert build_parser().parse_args(["project", "--jobs-store", value]).jobs_store == value


@pytest.mark.parametrize("value", ["127.0.0.1", "0.0.0.0", "::1", "localhost"])
def test_the_documented_hosts_are_accepted(value: str) -> None:
    from modelserve.cli import build_parser

    assert build_parser().parse_args(["project", "--host", value]).host == value


def test_a_path_option_expands_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cli.md: PROJECT_DIR, --secrets-dir, --ssl-certfile and --ssl-keyfile expand ``~``."""
    from modelserve.cli import build_parser

    monkeypatch.setenv("HOME", str(tmp_path))
    args = build_parser().parse_args(
        ["~/project", "--secrets-dir", "~/secrets", "--ssl-certfile", "~/cert.pem", "--ssl-keyfile", "~/key.pem"]
    )
    assert (args.project_dir, args.secrets_dir, args.ssl_certfile, args.ssl_keyfile) == tuple(
        str(tmp_path / name) for name in ("project", "secrets", "cert.pem", "key.pem")
    )


def test_a_bad_jobs_store_is_refused_by_the_command_without_serving(project: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "modelserve", str(project), "--jobs-store", "bogus", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(REPO),
    )
    assert result.returncode == 2, result.stderr
    assert "argument --jobs-store: expected" in result.stderr
    assert "Traceback" not in result.stderr


def test_grpc_port_equal_to_port_exits_2(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Both bound the same port (gRPC binds while uvicorn's socket is not yet listening): gRPC took every
    connection and HTTP was served nowhere, silently."""
    assert main([str(project), "--port", "18888", "--grpc-port", "18888"]) == 2
    assert "modelserve: error: --grpc-port and --port are both 18888" in capsys.readouterr().err


def test_a_grpc_port_in_use_exits_4_before_any_model_loads(tmp_path: Path) -> None:
    """docs/cli.md's exit code 4: "the address cannot be listened on (a port in use...), before any model
    loads"; the gRPC port was found taken only once the app started: exit 3, after the loading began."""
    root = write_project(tmp_path, {"model.py": MODEL})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        grpc_port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "modelserve", str(root), "--port", str(free_port()), "--grpc-port", str(grpc_port)],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=str(REPO),
        )
    assert result.returncode == 4, result.stderr
    assert f"modelserve: error: cannot listen on 127.0.0.1:{grpc_port} (--grpc-port):" in result.stderr
    assert "is loading" not in result.stderr and "Traceback" not in result.stderr


#: The number keys of an API (docs/configuration.md) and a YAML line of each, ``{}`` where the value goes.
NUMBER_KEYS = {
    "timeout": "timeout: {}",
    "max_queue_wait": "max_queue_wait: {}",
    "websocket_idle_timeout": "websocket_idle_timeout: {}",
    "max_wait_ms": "batching: {{max_batch_size: 4, max_wait_ms: {}}}",
}


@pytest.mark.parametrize("key", list(NUMBER_KEYS))
@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", "1" + "0" * 400])
def test_a_number_key_refuses_nan_infinity_and_overflow(tmp_path: Path, key: str, value: str) -> None:
    """A NaN timeout never fired and an infinite max_wait_ms held a lone request forever; a 400-digit integer
    was a traceback (float() overflows)."""
    line = NUMBER_KEYS[key].format(value)
    write_project(
        tmp_path,
        {"model.py": MODEL, "modelserve.yaml": f"apis:\n- {{name: a, handler: {{path: model.py}}, {line.strip()}}}\n"},
    )
    with pytest.raises(ConfigError, match=f"api 'a'.*key '{key}': expected"):
        load_project_config(tmp_path)


@pytest.mark.parametrize(("text", "seconds"), [("1.0e+300", 1e300), ("1.0e+3", 1000.0), ("1e3", None), ("1.0e3", None)])
def test_scientific_notation_needs_a_dot_and_a_signed_exponent(
    tmp_path: Path, text: str, seconds: float | None
) -> None:
    """What docs/configuration.md says of YAML 1.1: ``1e3`` is a string, refused as one (never taken as 1000)."""
    yaml = f"apis:\n- {{name: a, handler: {{path: model.py}}, timeout: {text}}}\n"
    write_project(tmp_path, {"model.py": MODEL, "modelserve.yaml": yaml})
    if seconds is None:
        with pytest.raises(ConfigError, match=f"key 'timeout': expected a number > 0, got '{text}' \\(str\\)"):
            load_project_config(tmp_path)
    else:
        assert load_project_config(tmp_path).apis[0].timeout == seconds


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("_x", "expected a URL segment that starts with a letter or a digit, got '_x' (str)"),
        ("a" * 65, "expected a URL segment of at most 64 characters, got 'aaaa"),
        ("a b", "expected a URL segment (letters, digits, '-', '_', '.'), got 'a b' (str)"),
        ("''", "expected a URL segment (letters, digits, '-', '_', '.'), got '' (str)"),
    ],
)
def test_an_api_name_says_which_rule_it_breaks(tmp_path: Path, name: str, expected: str) -> None:
    """docs/configuration.md's `name` row: a letter or digit first, at most 64 characters (both were refused as
    if a character were wrong)."""
    write_project(
        tmp_path, {"model.py": MODEL, "modelserve.yaml": f"apis:\n- {{name: {name}, handler: {{path: model.py}}}}\n"}
    )
    with pytest.raises(ConfigError) as refused:
        load_project_config(tmp_path)
    assert f"api #1: key 'name': {expected}" in str(refused.value)


def test_a_64_character_name_is_served_by_name(tmp_path: Path) -> None:
    name = "a" * 63 + "9"
    write_project(
        tmp_path, {"model.py": MODEL, "modelserve.yaml": f"apis:\n- {{name: {name}, handler: {{path: model.py}}}}\n"}
    )
    assert load_project_config(tmp_path).apis[0].name == name


@pytest.mark.parametrize(
    ("yaml", "expected"),
    [
        (
            "allowed_hosts: [example.com, 'http://x']",
            "top level: key 'allowed_hosts': expected a host name without scheme or port (the port is not checked),"
            " got 'http://x'\n",
        ),
        (
            "allowed_hosts: ['a*.example.com']",
            "top level: key 'allowed_hosts': expected a host name; wildcards must be like '*.example.com',"
            " got 'a*.example.com'\n",
        ),
        (
            "cors: {allow_origins: ['https://ok.example', 'app.example']}",
            "cors: key 'allow_origins': expected an origin like 'https://app.example.com' (scheme, host, port;"
            " no path), got 'app.example'\n",
        ),
    ],
)
def test_a_bad_item_of_a_list_is_named_once(tmp_path: Path, yaml: str, expected: str) -> None:
    """The item that is wrong, then (it said ``got 'http://x', got ['example.com', 'http://x'] (list)``) not
    the whole list again."""
    text = f"{yaml}\napis:\n- {{name: a, handler: {{path: model.py}}}}\n"
    write_project(tmp_path, {"model.py": MODEL, "modelserve.yaml": text})
    with pytest.raises(ConfigError) as refused:
        load_project_config(tmp_path)
    assert expected in str(refused.value) + "\n"


def test_an_infinite_batching_wait_is_refused_by_the_command(tmp_path: Path) -> None:
    yaml = "apis:\n- name: a\n  handler: {path: model.py}\n  batching: {max_batch_size: 4, max_wait_ms: .inf}\n"
    root = write_project(tmp_path, {"model.py": MODEL, "modelserve.yaml": yaml})
    result = subprocess.run(
        [sys.executable, "-m", "modelserve", str(root), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(REPO),
    )
    assert result.returncode == 2, result.stderr
    assert "api 'a', batching: key 'max_wait_ms': expected a number >= 0, got inf (float)" in result.stderr
    assert "Traceback" not in result.stderr


LOGGING_MODEL = """
import logging

logger = logging.getLogger("userlib")


class Model:
    def predict(self, inputs):
        logger.debug("user-debug-line %s", inputs)
        return inputs
"""


@pytest.fixture(scope="module")
def receiver() -> Iterator[Any]:
    from tests.tracing.receiver import Receiver

    receiver = Receiver()
    yield receiver
    receiver.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, receiver: Any, start_server_module: Any) -> Any:
    """One server for the options that only a served request shows: ``--tracing`` (the flag alone, with no
    ``MODELSERVE_TRACING`` and no ``tracing:`` key) and ``--log-level debug`` reaching user code's loggers. The
    receiver comes first, so that it outlives the server (whose exporter would retry a closed one at the exit)."""
    from tests.tracing.receiver import env

    root = write_project(tmp_path_factory.mktemp("served") / "project", {"model.py": LOGGING_MODEL})
    environment = {key: value for key, value in env(receiver).items() if key != "MODELSERVE_TRACING"}
    server = start_server_module(root, "--tracing", "--log-level", "debug", env=environment)
    server.wait_ready()
    return server


def test_tracing_flag_sends_the_spans_to_the_collector(served: Any, receiver: Any) -> None:
    request_id = "docs-claims-traced"
    assert httpx.post(f"{served.url}/model", json=7, headers={"X-Request-ID": request_id}).json() == 7
    receiver.wait_for(lambda spans: [s for s in spans if s.kind == 2 and s.attributes.get("http.route") == "/model"])


def test_log_level_applies_to_the_root_logger_too(served: Any) -> None:
    assert httpx.post(f"{served.url}/model", json="logged-value").status_code == 200
    assert "user-debug-line logged-value" in served.log  # logged before the answer was sent


DOCS = REPO / "docs" / "configuration.md"


def fenced_blocks(text: str) -> list[str]:
    return re.findall(r"^```\w*\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_the_example_of_the_configuration_page_is_valid_as_its_comments_say(tmp_path: Path) -> None:
    example = fenced_blocks(DOCS.read_text(encoding="utf-8"))[0]
    write_project(tmp_path, {"model.py": MODEL, "modelserve.yaml": example})
    api = load_project_config(tmp_path).apis[0]
    assert (api.name, api.kind, api.handler and api.handler.class_name) == ("iris", "realtime", "Model")
    assert api.handler is not None and api.handler.config == {"labels": ["setosa", "versicolor", "virginica"]}
    assert (api.max_concurrency, api.max_queue_length, api.timeout, api.max_body_size) == (1, 100, 60, 10 * 1024**2)


def test_the_validation_sample_is_what_the_command_prints(tmp_path: Path) -> None:
    text = DOCS.read_text(encoding="utf-8")
    sample = fenced_blocks(text[text.index("## Validation") :])[0]
    yaml = """
        apis:
          - name: iris
            handler: {path: modle.py}
            max_concurrency: two
          - name: echo
            handler: {path: model.py}
            timout: 5
    """
    root = write_project(tmp_path / "iris", {"model.py": MODEL, "modelserve.yaml": yaml})
    result = subprocess.run(
        [sys.executable, "-m", "modelserve", str(root)], capture_output=True, text=True, timeout=60, cwd=str(REPO)
    )
    assert result.returncode == 2
    printed = result.stderr.splitlines()
    expected = sample.replace("/srv/iris", str(root)).splitlines()
    assert len(printed) == len(expected), result.stderr
    for got, line in zip(printed, expected, strict=True):
        assert got.startswith(line.removesuffix(", ...)")), (got, line)
