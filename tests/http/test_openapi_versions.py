"""The OpenAPI document of APIs with numbered versions: ``POST /<api>/versions/{version}`` (and its ``GET``) is
listed with its path parameter (modelserve/http/openapi.py's `_versioned`, for modelserve/http/versions.py's
routes), and what the document says is what the live server answers."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate

from tests.http.test_openapi import fetch, run_schemathesis
from tests.http.test_repository import versioned_project


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return versioned_project(tmp_path_factory.mktemp("openapi_versions"))


def test_the_versioned_route_is_listed_with_its_path_parameter(project: Path) -> None:
    whole, every = (answer.json() for answer in fetch(project, "/openapi.json", "/openapi/every.json"))
    validate(whole)
    validate(every)
    for name, served in (("every", ["1", "2", "3"]), ("latest", ["3"]), ("chosen", ["1", "3"])):
        item = whole["paths"][f"/{name}/versions/{{version}}"]
        assert set(item) == {"get", "post"}
        for operation in item.values():
            (parameter,) = operation["parameters"]
            assert (parameter["name"], parameter["in"], parameter["required"]) == ("version", "path", True)
            assert parameter["schema"]["examples"] == served
            assert "404" in operation["responses"] and "200" in operation["responses"]
        assert item["post"]["operationId"] == f"call_version_{name}"
        assert item["post"]["requestBody"] == whole["paths"][f"/{name}"]["post"]["requestBody"]
        assert f"/{name}" in whole["paths"]  # the unversioned route too, once
    assert set(every["paths"]) == {"/every", "/every/versions/{version}"}
    operation_ids = [op["operationId"] for item in whole["paths"].values() for op in item.values()]
    assert len(operation_ids) == len(set(operation_ids))


@pytest.mark.slow
def test_the_live_server_answers_as_documented(start_server: Any, project: Path, tmp_path: Path) -> None:
    server = start_server(project, "--no-access-log")
    server.wait_ready(timeout=90)
    document = httpx.get(f"{server.url}/openapi.json").json()
    examples = document["paths"]["/chosen/versions/{version}"]["post"]["parameters"][0]["schema"]["examples"]
    for version in examples:
        answer = httpx.post(f"{server.url}/chosen/versions/{version}", json={"x": [1.0]})
        assert answer.json() == {"y": [1.0 + int(version)]}
    assert httpx.post(f"{server.url}/chosen/versions/2", json={"x": [1.0]}).status_code == 404
    # The versioned routes only (the unversioned ones are the realtime route's, checked elsewhere), every check
    # but negative_data_rejection, as for the ONNX APIs of test_openapi.py: a model file's route takes an empty
    # batch (``[]``), which its body's schema (one row at least) does not list.
    done = run_schemathesis(
        tmp_path, server.url, "--include-path-regex", "/versions/", "--exclude-checks", "negative_data_rejection"
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert re.search(r"\d+ generated, \d+ passed\n", done.stdout), done.stdout[-3000:]
