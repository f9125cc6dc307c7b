"""`max_queue_wait`'s default (`auto`) through a real server: a request that waited longer than the calls of
a full line take is refused when its turn comes, but only while newcomers are being refused and someone waits
behind it; `false` turns it off, and a fixed number of seconds refuses whatever the line."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import write_project

PROJECT = {
    "modelserve.yaml": """
        apis:
          - {name: sync-auto, handler: {path: model.py, class: Sync}, max_queue_length: 2}
          - {name: async-auto, handler: {path: model.py, class: Async}, max_queue_length: 2}
          - {name: sync-off, handler: {path: model.py, class: Sync}, max_queue_length: 2, max_queue_wait: false}
          - {name: sync-roomy, handler: {path: model.py, class: Sync}, max_queue_length: 3}
          - {name: sync-fixed, handler: {path: model.py, class: Sync}, max_queue_length: 3, max_queue_wait: 0.3}
    """,
    "model.py": """
        import asyncio
        import time


        class Sync:
            def predict(self, inputs):
                time.sleep(inputs["sleep"])
                return {"name": inputs["name"]}


        class Async:
            async def predict(self, inputs):
                await asyncio.sleep(inputs["sleep"])
                return {"name": inputs["name"]}
    """,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> Any:
    root = write_project(tmp_path_factory.mktemp("queue-wait"), PROJECT)
    started = start_server_module(root)
    started.wait_ready()
    return started


async def line(url: str, first: float = 0.6) -> dict[str, httpx.Response]:
    """A (`first`, 0.6 s) runs while B (0.1 s) and C wait, filling a line of 2, and E comes (refused when the
    line is full); D is sent when A is answered, so it waits behind C. When B ends, a call takes 0.1 s: the calls
    of a full line take 0.2 s, and C has waited 0.5 s."""
    async with httpx.AsyncClient(timeout=10) as client:

        async def post(name: str, sleep: float) -> httpx.Response:
            return await client.post(url, json={"name": name, "sleep": sleep})

        a = asyncio.ensure_future(post("A", first))
        await asyncio.sleep(0.15)
        b = asyncio.ensure_future(post("B", 0.1))
        await asyncio.sleep(0.05)
        c = asyncio.ensure_future(post("C", 0.05))
        await asyncio.sleep(0.05)
        e = asyncio.ensure_future(post("E", 0.01))
        answers = {"A": await a}
        answers["D"] = await post("D", 0.05)
        answers["B"], answers["C"], answers["E"] = await b, await c, await e
        return answers


@pytest.mark.parametrize("api", ["sync-auto", "async-auto"])
def test_by_default_a_request_that_waited_longer_than_the_full_line_takes_is_refused(server: Any, api: str) -> None:
    answers = asyncio.run(line(f"{server.url}/{api}"))
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert statuses == {"A": 200, "B": 200, "C": 503, "D": 200, "E": 503}, {k: v.text for k, v in answers.items()}
    assert "too many requests waiting" in answers["E"].json()["error"]
    refused = answers["C"]
    assert "Retry-After" in refused.headers
    message = refused.json()["error"]
    # The measured call: B's 100 ms sleep, plus the hand-over (a few ms on a busy machine).
    measured = re.search(r"longer than the calls of this API's full line take \(2 x ([\d.]+) ms", message)
    assert measured is not None and 99 <= float(measured.group(1)) < 130, message


def test_no_request_is_refused_for_waiting_when_turned_off(server: Any) -> None:
    answers = asyncio.run(line(f"{server.url}/sync-off"))
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert statuses == {"A": 200, "B": 200, "C": 200, "D": 200, "E": 503}
    assert answers["C"].json() == {"name": "C"}


def test_no_request_is_refused_for_waiting_while_no_newcomer_is_refused(server: Any) -> None:
    answers = asyncio.run(line(f"{server.url}/sync-roomy"))  # a line of 3: E waits too
    assert {name: answer.status_code for name, answer in answers.items()} == dict.fromkeys("ABCDE", 200)


def test_a_fixed_max_queue_wait_refuses_whatever_the_line(server: Any) -> None:
    # A line of 3 that is never full. A runs 1.5 s, so B, C and E wait over a second each, far past the 0.3 s
    # (with 0.6 s, E waited 0.35 s, and a request that reached a busy server 50 ms late was served).
    answers = asyncio.run(line(f"{server.url}/sync-fixed", first=1.5))
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert statuses == {"A": 200, "B": 503, "C": 503, "D": 200, "E": 503}
    assert "max_queue_wait of 0.3 s" in answers["C"].json()["error"]


def test_config_takes_auto_a_number_or_false(tmp_path: Path) -> None:
    from modelserve.config import parse_project
    from modelserve.errors import ConfigError

    (tmp_path / "m.py").write_text("class Model:\n    def predict(self, inputs):\n        return inputs\n")

    def wait(value: Any) -> Any:
        api = {"name": "a", "handler": {"path": "m.py"}, "max_queue_wait": value}
        return parse_project({"apis": [api]}, tmp_path).apis[0].max_queue_wait

    assert wait(None) == "auto" and wait("auto") == "auto" and wait(0.5) == 0.5 and wait(False) is None
    for bad in ("soon", 0, True):
        with pytest.raises(ConfigError, match="max_queue_wait.*'auto', a number of seconds > 0, or false"):
            wait(bad)
