"""Typed validation is bounded (modelserve/schema.py): a large invalid body answers a small 400 that names its
first errors and counts them, and the server answers /healthz while such a body is being validated."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import httpx
import orjson
import pydantic
import pytest
import uvicorn

from modelserve import create_app
from modelserve.schema import MAX_ERRORS
from tests.conftest import free_port, write_project

MODEL = """
class Model:
    def predict(self, values: list[float]) -> int:
        return len(values)


class Strict:
    async def predict(self, point: dict[str, float]) -> float:
        return sum(point.values())
"""


@pytest.fixture(scope="module")
def server(start_server_module: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    config = (
        "apis:\n  - {name: sum, handler: {path: model.py}}\n"
        "  - {name: point, handler: {path: model.py, class: Strict}}\n"
    )
    root = write_project(tmp_path_factory.mktemp("bounds"), {"model.py": MODEL, "modelserve.yaml": config})
    served = start_server_module(root)
    served.wait_ready()
    return served


def test_a_million_invalid_items_answer_a_small_400_naming_the_first_and_counting(server: Any) -> None:
    body = orjson.dumps(["x"] * 1_000_000)
    answer = httpx.post(server.url + "/sum", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert answer.status_code == 400
    assert len(answer.content) < 16 * 1024
    error = answer.json()
    assert [issue["loc"] for issue in error["detail"]] == [[index] for index in range(MAX_ERRORS)]
    assert error["error_count"] >= 10_000  # counted in pieces up to COUNT_MAX, said as "at least"
    assert "0: " in error["error"] and f"at least {error['error_count']:,}" in error["error"]


def test_a_few_invalid_items_are_counted_exactly(server: Any) -> None:
    values: list[Any] = [1.5] * 5000 + ["x"] * 30
    answer = httpx.post(server.url + "/sum", json=values, timeout=60)
    assert answer.status_code == 400
    error = answer.json()
    assert error["error_count"] == 30 and len(error["detail"]) == MAX_ERRORS
    assert error["detail"][0]["loc"] == [5000]
    assert "and 10 more" in error["error"]


@pytest.mark.parametrize("value", [True, False, "1.5"])
def test_booleans_and_strings_are_not_numbers(server: Any, value: Any) -> None:
    refused = httpx.post(server.url + "/sum", json=[1.0, value]), httpx.post(server.url + "/point", json={"y": value})
    assert [answer.status_code for answer in refused] == [400, 400]
    assert [answer.json()["detail"][0]["loc"] for answer in refused] == [[1], ["y"]]
    assert httpx.post(server.url + "/sum", json=[1, 2.5]).json() == 2
    assert httpx.post(server.url + "/point", json={"x": 1, "y": 2.5}).json() == 3.5


# ---------------------------------------------------------------------------------------------------------------
# /healthz during validation: a probe made from inside the validation of a large body.

probes: list[int] = []
probe_url = ""


def probe(value: Any) -> Any:
    """On its first call, asks the server for /healthz and waits for the answer: it comes only if the event
    loop is free while this body is validated."""
    if not probes:
        probes.append(httpx.get(probe_url + "/healthz", timeout=30).status_code)
    return value


Probed = list[Annotated[float, pydantic.BeforeValidator(probe)]]


class SyncProbed:
    def predict(self, values: Probed) -> int:
        return len(values)


class AsyncProbed:
    async def predict(self, values: Probed) -> int:
        return len(values)


@pytest.mark.parametrize("handler", [SyncProbed, AsyncProbed])
def test_healthz_is_answered_while_a_large_body_is_validated(handler: type) -> None:
    global probe_url
    probes.clear()
    port = free_port()
    probe_url = f"http://127.0.0.1:{port}"

    async def run() -> httpx.Response:
        app = create_app(handler=handler, name="probed")
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        serving = asyncio.ensure_future(server.serve())
        try:
            while not server.started:
                await asyncio.sleep(0.01)
            await app.server.wait_loaded()
            body = orjson.dumps(["x"] * 50_000)
            async with httpx.AsyncClient(timeout=60) as client:
                headers = {"content-type": "application/json"}
                return await client.post(probe_url + "/probed", content=body, headers=headers)
        finally:
            server.should_exit = True
            await serving

    answer = asyncio.run(run())
    assert probes == [200]  # answered from inside the validation, before the 400 below
    assert answer.status_code == 400 and answer.json()["error_count"] >= 10_000
