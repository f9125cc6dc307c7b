from __future__ import annotations

from pathlib import Path

import httpx

from tests.conftest import write_project


def test_cli_serves_a_model_folder(tmp_path: Path, start_server) -> None:
    project = write_project(
        tmp_path / "p",
        {
            "model.py": """
                class Model:
                    def predict(self, inputs):
                        return {"got": inputs}
            """
        },
    )
    server = start_server(project)
    server.wait_ready()
    answer = httpx.post(server.url + "/", json={"x": 1})
    assert answer.status_code == 200
    assert answer.json() == {"got": {"x": 1}}
    assert server.stop() == 0
