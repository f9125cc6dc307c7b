"""`max_queue_wait`'s default (`auto`) through a real server: a request that waited longer than the calls of
a full line take is refused when its turn comes, but only while newcomers are being refused and someone waits
behind it; `false` turns it off, and a fixed number of seconds refuses whatever the line."""

from __future__ import annotations

import asyncio
import re
import time
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
        import os
        import time


        class Sync:
            def predict(self, inputs):
                while "gate" in inputs and not os.path.exists(inputs["gate"]):  # held until the test makes it
                    time.sleep(0.005)
                time.sleep(inputs["sleep"])
                return {"name": inputs["name"]}


        class Async:
            async def predict(self, inputs):
                while "gate" in inputs and not os.path.exists(inputs["gate"]):
                    await asyncio.sleep(0.005)
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


async def until(client: httpx.AsyncClient, url: str, api: str, running: int, waiting: int) -> None:
    """Wait until the server's gauges show `running` calls running and `waiting` requests waiting for the API."""
    wanted = f'modelserve_requests_in_flight{{api="{api}"}} {float(running)}\n'
    wanted_too = f'modelserve_requests_waiting{{api="{api}"}} {float(waiting)}\n'
    deadline = time.monotonic() + 30  # bounds a failing test; a passing one waits for the server alone
    while not {wanted, wanted_too} <= set((await client.get(f"{url}/metrics")).text.splitlines(keepends=True)):
        assert time.monotonic() < deadline, f"never {running} running and {waiting} waiting"
        await asyncio.sleep(0.01)


async def line(url: str, api: str, folder: Path, limit: int) -> dict[str, httpx.Response]:
    """A runs until the test lets it go, while B and C wait (filling a line of 2), and E comes: refused when the
    line is full, else it waits too. Once everyone has waited over half a second, A ends and B runs, held until
    D (sent when A is answered) waits behind C: B's call is then measured (its 0.1 s sleep, plus the hand-over),
    and when it ends, C's turn comes, after a wait far longer than the two calls of a full line.

    Each step waits for the server's gauges to show the one before, so that no margin depends on how soon a
    busy machine delivers a request. `limit`: the API's max_queue_length."""
    gate_a, gate_b = folder / "a", folder / "b"
    async with httpx.AsyncClient(timeout=30) as client:

        async def post(name: str, sleep: float, gate: Path | None = None) -> httpx.Response:
            body = {"name": name, "sleep": sleep} | ({"gate": str(gate)} if gate else {})
            return await client.post(f"{url}/{api}", json=body)

        a = asyncio.ensure_future(post("A", 0, gate_a))
        await until(client, url, api, running=1, waiting=0)
        b = asyncio.ensure_future(post("B", 0.1, gate_b))
        await until(client, url, api, running=1, waiting=1)
        c = asyncio.ensure_future(post("C", 0.05))
        await until(client, url, api, running=1, waiting=2)
        e = asyncio.ensure_future(post("E", 0.01))
        if limit == 2:
            await asyncio.wait([e])  # refused at once, after C began to wait
        else:
            await until(client, url, api, running=1, waiting=3)
        await asyncio.sleep(0.5)
        gate_a.touch()
        answers = {"A": await a}
        d = asyncio.ensure_future(post("D", 0.05))
        if api != "sync-fixed":  # there B, C and E are refused as A ends: D runs at once
            await until(client, url, api, running=1, waiting=limit)
        gate_b.touch()
        answers["B"], answers["C"], answers["D"], answers["E"] = await b, await c, await d, await e
        return answers


@pytest.mark.parametrize("api", ["sync-auto", "async-auto"])
def test_by_default_a_request_that_waited_longer_than_the_full_line_takes_is_refused(
    server: Any, api: str, tmp_path: Path
) -> None:
    answers = asyncio.run(line(server.url, api, tmp_path, limit=2))
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert statuses == {"A": 200, "B": 200, "C": 503, "D": 200, "E": 503}, {k: v.text for k, v in answers.items()}
    assert "too many requests waiting" in answers["E"].json()["error"]
    refused = answers["C"]
    assert "Retry-After" in refused.headers
    message = refused.json()["error"]
    # The measured call: B's, held until D waits, then its 100 ms sleep; C waited the half second before A
    # ended, and B's call on top of it: longer than the two calls of the full line.
    measured = re.search(
        r"waited ([\d.]+) s, longer than the calls of this API's full line take \(2 x ([\d.]+) ms", message
    )
    assert measured is not None, message
    waited, call = float(measured.group(1)), float(measured.group(2)) / 1000
    assert 0.099 <= call < 0.5 and waited > 0.5 + call and waited > 2 * call, message


def test_no_request_is_refused_for_waiting_when_turned_off(server: Any, tmp_path: Path) -> None:
    answers = asyncio.run(line(server.url, "sync-off", tmp_path, limit=2))
    statuses = {name: answer.status_code for name, answer in answers.items()}
    assert statuses == {"A": 200, "B": 200, "C": 200, "D": 200, "E": 503}
    assert answers["C"].json() == {"name": "C"}


def test_no_request_is_refused_for_waiting_while_no_newcomer_is_refused(server: Any, tmp_path: Path) -> None:
    answers = asyncio.run(line(server.url, "sync-roomy", tmp_path, limit=3))  # E waits too
    assert {name: answer.status_code for name, answer in answers.items()} == dict.fromkeys("ABCDE", 200)


def test_a_fixed_max_queue_wait_refuses_whatever_the_line(server: Any, tmp_path: Path) -> None:
    # A line of 3 that is never full. B, C and E have waited over half a second when A ends, past the 0.3 s
    # (the gauges, not a timeline, say when each waits: with A sleeping 0.6 s, E waited only 50 ms past the
    # bound, and a request that reached a busy server late was served).
    answers = asyncio.run(line(server.url, "sync-fixed", tmp_path, limit=3))
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
