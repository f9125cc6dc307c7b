"""A served process leaves what loading made out of the garbage collector's walks (`gc.freeze` after load)
and collects its youngest generation less often (`YOUNG_THRESHOLD`), unless the project set its own
thresholds; an app made in a process of the user's own (the library, tests) leaves the collector as it is."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import httpx
from starlette.testclient import TestClient

import modelserve
from modelserve.server import YOUNG_THRESHOLD
from tests.conftest import write_project

MODEL = """
import gc


class Model:
    def load(self):
        self.loaded = {"made": ["at load"]}

    def predict(self, inputs):
        tracked = gc.get_objects()
        return {
            "frozen": gc.get_freeze_count(),
            "loaded_walked": any(item is self.loaded for item in tracked),
            "thresholds": gc.get_threshold(),
        }
"""

OWN_THRESHOLDS = """
import gc


class Model:
    def load(self):
        gc.set_threshold(1234, 5, 6)

    def predict(self, inputs):
        return {"thresholds": gc.get_threshold()}
"""


class Probe:
    def predict(self, inputs: Any) -> Any:
        return {"frozen": gc.get_freeze_count()}


def test_the_cli_freezes_what_loading_made(tmp_path: Path, start_server: Any) -> None:
    server = start_server(write_project(tmp_path / "project", {"model.py": MODEL}))
    server.wait_ready()
    answer = httpx.post(server.url + "/model", json={}).json()
    assert answer["frozen"] > 1000  # modules, classes, the user's loaded objects
    assert answer["loaded_walked"] is False  # frozen: no longer among the objects a collection walks
    assert answer["thresholds"] == [YOUNG_THRESHOLD, *gc.get_threshold()[1:]]


def test_the_cli_keeps_thresholds_the_project_set_while_loading(tmp_path: Path, start_server: Any) -> None:
    server = start_server(write_project(tmp_path / "project", {"model.py": OWN_THRESHOLDS}))
    server.wait_ready()
    assert httpx.post(server.url + "/model", json={}).json() == {"thresholds": [1234, 5, 6]}


def test_an_app_in_the_users_own_process_freezes_nothing() -> None:
    before, thresholds = gc.get_freeze_count(), gc.get_threshold()
    app = modelserve.create_app(handler=Probe, name="probe")
    with TestClient(app) as client:
        client.portal.call(app.server.wait_loaded)
        assert client.post("/probe", json={}).json() == {"frozen": before}
    assert gc.get_threshold() == thresholds
