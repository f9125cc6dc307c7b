"""What docs/compatibility.md says of Truss folders and Cortex projects, held to real servers where no other test
checked exactly that claim: the paths Truss's own clients call, a ``model_name`` that is one of the server's
routes, bodies with no Content-Type on Truss's paths, a result that cannot be encoded on them, and the Cortex
keys that used to be dropped without a word.

Truss's published test model (tests/data/truss/test_basic_truss, see SOURCES.md there) is served unchanged; the
other projects are written here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelserve.compat.truss import api_name
from modelserve.config import RESERVED_NAMES
from tests.conftest import write_project

DATA = Path(__file__).resolve().parents[1] / "data" / "truss"

#: A Truss whose model_name is the path of the server's own documentation page.
NAMED_DOCS = {
    "config.yaml": """
        model_name: docs
        environment_variables:
          DOCS_CLAIMS_FLAG: true
          DOCS_CLAIMS_NUMBER: 3
    """,
    "model/model.py": """
        import os


        class Model:
            def __init__(self, data_dir, **kwargs):
                self._data_dir = data_dir

            def predict(self, inputs):
                if inputs == "unencodable":
                    return {"raw": b"bytes are not JSON"}
                return {
                    "data_dir": [type(self._data_dir).__name__, self._data_dir.name, self._data_dir.exists()],
                    "env": [os.environ["DOCS_CLAIMS_FLAG"], os.environ["DOCS_CLAIMS_NUMBER"]],
                }

            def completions(self, inputs):
                return {"raw": b"bytes are not JSON"}
    """,
}


#: A Truss API beside another realtime API (modelserve.yaml): the routes of a lone API are not its.
TRUSS_BESIDE_ANOTHER = {
    "config.yaml": """
        model_name: first
    """,
    "model/model.py": """
        class Model:
            def predict(self, inputs):
                return "first"
    """,
    "modelserve.yaml": """
        apis:
          - name: first
            truss: config.yaml
          - name: second
            handler: {path: model/model.py, class: Model}
    """,
}

#: Cortex 0.35 keys that no version of Cortex had (a misspelt threads_per_process would leave one thread), and
#: an AsyncAPI with server_side_batching, which Cortex gave RealtimeAPIs only.
CORTEX = {
    "cortex.yaml": """
        - name: echo
          kind: RealtimeAPI
          handler:
            type: python
            path: handler.py
            threads_per_proccess: 4
        - name: jobs
          kind: AsyncAPI
          handler:
            type: python
            path: job.py
            server_side_batching:
              max_batch_size: 4
              batch_interval: 0.1s
    """,
    "handler.py": """
        class Handler:
            def handle_post(self, payload):
                return {"type": type(payload).__name__, "payload": payload if isinstance(payload, str) else None}
    """,
    "job.py": """
        class Handler:
            def handle_async(self, payload):
                return payload
    """,
}


@pytest.fixture(scope="module")
def servers(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("projects")
    started = {
        "basic": start_server_module(DATA / "test_basic_truss"),
        "docs": start_server_module(write_project(root / "named-docs", NAMED_DOCS)),
        "cortex": start_server_module(write_project(root / "cortex", CORTEX)),
        "two": start_server_module(write_project(root / "two", TRUSS_BESIDE_ANOTHER)),
    }
    for server in started.values():
        server.wait_ready()
    yield started


# --------------------------------------------------------------------------------------------------
# Truss: routes


def test_truss_s_clients_path_under_model_reaches_a_truss_named_otherwise(servers: dict[str, Any]) -> None:
    """Truss's server ignores the model segment, and its clients send ``model`` whatever the model_name
    (truss ``truss_handle.py``: ``predict_url = f"{base_url}/v1/models/model:predict"``; ``test_model_inference.py``
    polls ``/v1/models/model`` for readiness). test_basic_truss is named "basic truss"."""
    url = servers["basic"].url
    body = {"x": [1, 2]}
    own = httpx.post(url + "/v1/models/basic-truss:predict", json=body)
    assert (own.status_code, own.json()) == (200, body)
    for path in ("/v1/models/model:predict", "/v1/models/model:predict_binary"):
        answer = httpx.post(url + path, json=body)
        assert (answer.status_code, answer.json()) == (200, body), path
    ready = httpx.get(url + "/v1/models/model")
    assert (ready.status_code, ready.json()) == (200, {})
    assert httpx.head(url + "/v1/models/model").status_code == 200
    assert httpx.get(url + "/v1/models/model:predict").status_code == 405  # a GET runs no user code
    # the page: Truss's other model paths are not served
    for path in ("/v1/models/basic-truss/loaded", "/v1/models/basic-truss/schema"):
        assert httpx.get(url + path).status_code == 404, path


def test_a_truss_api_beside_another_realtime_api_has_only_its_own_paths(servers: dict[str, Any]) -> None:
    """The page: SageMaker's routes and the paths under ``model`` are a Truss API's when it is the project's only
    realtime API (which of two would they reach?)."""
    url = servers["two"].url
    assert httpx.post(url + "/v1/models/first:predict", json={}).json() == "first"
    assert httpx.get(url + "/v1/models/first").status_code == 200
    for method, path in (("POST", "/v1/models/model:predict"), ("GET", "/ping"), ("POST", "/invocations")):
        answer = httpx.request(method, url + path, json={})
        assert 400 <= answer.status_code < 500 and answer.json()["request_id"], (method, path)


def test_the_alias_leaves_the_openapi_document_valid(servers: dict[str, Any]) -> None:
    from openapi_spec_validator import validate

    document = httpx.get(servers["basic"].url + "/openapi.json").json()
    validate(document)  # operation ids stay unique: the alias is not listed a second time
    assert "/v1/models/basic-truss:predict" in document["paths"]


@pytest.mark.parametrize("name", sorted(RESERVED_NAMES))
def test_a_model_name_that_is_a_server_route_is_served_as_model(name: str) -> None:
    assert api_name(name) == "model"


def test_a_truss_named_docs_is_served_as_model_beside_the_docs_page(servers: dict[str, Any]) -> None:
    """It was a crash at start (two routes for /docs)."""
    url = servers["docs"].url
    answer = httpx.post(url + "/model", json={})
    assert answer.status_code == 200, answer.text
    page = httpx.get(url + "/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")


# --------------------------------------------------------------------------------------------------
# Truss: bodies and answers


def test_truss_s_paths_read_a_body_with_no_content_type_as_json(servers: dict[str, Any]) -> None:
    """Truss parses every body as JSON; ``requests.post(url, data=json.dumps(...))`` sends no Content-Type, and
    ``curl -d`` a form's."""
    url = servers["basic"].url
    for path in ("/v1/models/basic-truss:predict", "/v1/models/model:predict", "/invocations"):
        answer = httpx.post(url + path, content=b'{"x": 1}')
        assert (answer.status_code, answer.json()) == (200, {"x": 1}), path
    # modelserve's own route keeps its rule: no Content-Type is bytes (test_basic_truss echoes them)
    native = httpx.post(url + "/basic-truss", content=b'{"x": 1}')
    assert (native.headers["content-type"], native.content) == ("application/octet-stream", b'{"x": 1}')
    # a form's type, what curl -d sends, is JSON there too, as Truss parses it; modelserve's own route keeps
    # the form's bytes
    form_type = {"content-type": "application/x-www-form-urlencoded"}
    form = httpx.post(url + "/v1/models/model:predict", content=b'{"x": 1}', headers=form_type)
    assert (form.status_code, form.json()) == (200, {"x": 1})
    native = httpx.post(url + "/basic-truss", content=b"a=1", headers=form_type)
    assert (native.headers["content-type"], native.content) == ("application/octet-stream", b"a=1")
    # any other type is still decoded by it: text/plain is a str
    text = httpx.post(url + "/v1/models/model:predict", content=b"a=1", headers={"content-type": "text/plain"})
    assert (text.status_code, text.json()) == (200, "a=1")


def test_a_result_that_is_not_json_is_the_same_user_code_500_on_every_truss_path(servers: dict[str, Any]) -> None:
    """The realtime route answers a dict holding bytes as a failure of the user's code; Truss's paths answered a
    generic internal error and logged it as one of the server's."""
    server = servers["docs"]
    own = httpx.post(server.url + "/model", json="unencodable")
    assert own.status_code == 500
    for path, body in (("/v1/models/model:predict", "unencodable"), ("/v1/completions", {"prompt": "x"})):
        answer = httpx.post(server.url + path, json=body)
        assert answer.status_code == 500, path
        assert answer.json() == {"error": own.json()["error"], "request_id": answer.headers["x-request-id"]}, path
        logged = [line for line in server.log.splitlines() if answer.headers["x-request-id"] in line]
        assert not any("internal error" in line for line in logged), logged


def test_data_dir_is_a_path_not_created_and_environment_variables_are_text(servers: dict[str, Any]) -> None:
    answer = httpx.post(servers["docs"].url + "/model", json={}).json()
    assert answer == {"data_dir": ["PosixPath", "data", False], "env": ["true", "3"]}


# --------------------------------------------------------------------------------------------------
# Cortex


def test_unknown_handler_keys_and_an_async_api_s_batching_are_listed_as_not_applied(servers: dict[str, Any]) -> None:
    (line,) = [line for line in servers["cortex"].log.splitlines() if "accepted but not applied here" in line]
    assert "api 'echo', handler: unknown keys threads_per_proccess (ignored)" in line
    assert "api 'jobs', handler: server_side_batching (an AsyncAPI)" in line
    assert httpx.get(servers["cortex"].url + "/echo").json()["max_concurrency"] == 1


@pytest.mark.parametrize(
    ("content", "content_type", "expected"),
    [
        (b"a=1&b=2", "application/x-www-form-urlencoded", {"type": "bytes", "payload": None}),
        (b"--x\r\n\r\n--x--\r\n", "multipart/form-data; boundary=x", {"type": "bytes", "payload": None}),
        (b"hello", "text/plain", {"type": "str", "payload": "hello"}),
    ],
)
def test_cortex_payloads_follow_the_content_type(
    servers: dict[str, Any], content: bytes, content_type: str, expected: dict[str, Any]
) -> None:
    """The page: form bodies are passed as their bytes (Cortex gave FormData), text/plain as a str."""
    answer = httpx.post(servers["cortex"].url + "/echo", content=content, headers={"content-type": content_type})
    assert (answer.status_code, answer.json()) == (200, expected)
