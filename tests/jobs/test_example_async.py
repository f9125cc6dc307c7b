"""examples/async-sentiment: served as its README says, the answers are the README's.

The example is copied to a temporary folder (its SQLite store lives in the copy's `.modelserve/`), with a
shorter simulated model delay so that the test runs in seconds.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import REPO, Server

EXAMPLE = REPO / "examples" / "async-sentiment"
README = (EXAMPLE / "README.md").read_text(encoding="utf-8")
DELAY = 0.5

# (X-Request-ID, content type, body, status, result) as shown in the README
CASES = [
    (
        "neg",
        "application/json",
        b'{"text": "Not good: slow, and the case arrived broken."}',
        {"label": "negative", "score": -4.0, "matched": ["not good", "slow", "broken"], "words": 8},
    ),
    (
        "review-42",
        "text/plain",
        b"Excellent. Best purchase this year.",
        {"label": "positive", "score": 5.0, "matched": ["excellent", "best"], "words": 5},
    ),
    (
        "r2",
        "application/json",
        b'{"text":"I enjoyed it, would recommend"}',
        {"label": "positive", "score": 3.0, "matched": ["enjoyed", "recommend"], "words": 5},
    ),
]


@pytest.fixture
def example(tmp_path: Path) -> Path:
    project = tmp_path / "async-sentiment"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns(".modelserve", "__pycache__"))
    config = project / "modelserve.yaml"
    text = config.read_text(encoding="utf-8")
    assert "delay: 2.0" in text
    config.write_text(text.replace("delay: 2.0", f"delay: {DELAY}"), encoding="utf-8")
    return project


@pytest.fixture
def server(example: Path, start_server: Any) -> Iterator[Server]:
    server = start_server(example)
    server.wait_ready()
    yield server


def wait_ended(client: httpx.Client, job_id: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        document: dict[str, Any] = client.get(f"/sentiment/{job_id}").json()
        if document["status"] in ("completed", "failed", "cancelled") or time.monotonic() > deadline:
            return document
        time.sleep(0.05)


def test_results_are_the_readmes(server: Server, example: Path) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for job_id, content_type, body, _ in CASES:
            answer = client.post(
                "/sentiment", content=body, headers={"X-Request-ID": job_id, "Content-Type": content_type}
            )
            assert answer.status_code == 200
            assert answer.json() == {"id": job_id}
        for job_id, _, _, result in CASES:
            document = wait_ended(client, job_id)
            assert document["status"] == "completed", document
            assert document["result"] == result
            assert document["timestamp"].endswith("Z")
            assert orjson.dumps(result).decode() in README
        assert (example / ".modelserve" / "jobs.db").is_file()


def test_generated_id_and_poll(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        job_id = client.post("/sentiment", json={"text": "The battery life is great and I love the screen."}).json()[
            "id"
        ]
        assert len(job_id) == 32
        assert client.get(f"/sentiment/{job_id}").json()["status"] in ("in_queue", "in_progress")
        document = wait_ended(client, job_id)
        assert document["status"] == "completed"
        assert document["result"]["label"] == "positive"


def test_errors_are_the_readmes(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        headers = {"X-Request-ID": "review-42", "Content-Type": "text/plain"}
        assert (
            client.post("/sentiment", content=b"Excellent. Best purchase this year.", headers=headers).status_code
            == 200
        )
        duplicate = client.post("/sentiment", content=b"again", headers=headers)
        assert duplicate.status_code == 409
        assert duplicate.json()["error"] in README
        assert wait_ended(client, "review-42")["status"] == "completed"
        late = client.delete("/sentiment/review-42")
        assert late.status_code == 409
        assert late.json()["error"] in README

        unknown = client.get("/sentiment/nope")
        assert unknown.status_code == 404
        assert unknown.json()["error"] in README

        malformed = client.post("/sentiment", content=b'{"text": ', headers={"Content-Type": "application/json"})
        assert malformed.status_code == 400
        assert malformed.json()["error"] in README

        rejected = client.post("/sentiment", json={"review": "good"}, headers={"X-Request-ID": "bad-1"})
        assert rejected.status_code == 200
        document = wait_ended(client, "bad-1")
        assert document["status"] == "failed"
        assert orjson.dumps(document["error"]).decode() in README


def test_cancel_queued_and_running(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        # max_concurrency is 2: c1 and c2 run, c3 waits
        for job_id in ("c1", "c2", "c3"):
            client.post("/sentiment", json={"text": "meh"}, headers={"X-Request-ID": job_id})
        for job_id in ("c3", "c1"):
            cancelled = client.delete(f"/sentiment/{job_id}")
            assert cancelled.status_code == 200
            assert cancelled.json()["status"] == "cancelled"
            again = client.delete(f"/sentiment/{job_id}")
            assert again.status_code == 200
            assert again.json() == cancelled.json()
        assert wait_ended(client, "c2")["status"] == "completed"
        time.sleep(DELAY * 2)  # c1's sync handler has returned by now: its result was dropped
        assert client.get("/sentiment/c1").json()["status"] == "cancelled"
        assert client.get("/sentiment/c3").json()["status"] == "cancelled"
