"""Containment: the job store's files are the owner's alone, and its credentials never show (real servers)."""

from __future__ import annotations

import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelserve.jobs.redis import _redacted
from tests.conftest import redis_server, write_project

PASSWORD = "s3cret-pw-0451"

HANDLER = """
class Handler:
    def handle_async(self, payload):
        return {"echo": payload}
"""


def project(root: Path, jobs: str) -> Path:
    config = f"jobs: {jobs}\napis:\n  - name: jobs\n    kind: async\n    handler: {{path: handler.py}}\n"
    return write_project(root, {"handler.py": HANDLER, "modelserve.yaml": config})


def test_the_sqlite_store_is_created_for_its_owner_only(tmp_path: Path, start_server: Any) -> None:
    root = project(tmp_path, "{store: sqlite}")
    server = start_server(root)
    server.wait_ready()
    job = httpx.post(server.url + "/jobs", json={"a": 1}).json()["id"]
    database = root / ".modelserve" / "jobs.db"
    assert stat.S_IMODE(database.stat().st_mode) == 0o600
    assert stat.S_IMODE(database.parent.stat().st_mode) == 0o700
    for extra in (database.with_name("jobs.db-wal"), database.with_name("jobs.db-shm")):
        if extra.exists():
            assert stat.S_IMODE(extra.stat().st_mode) & 0o077 == 0, extra
    described = httpx.get(server.url + "/jobs").json()
    assert described["jobs_store"] == "sqlite store .modelserve/jobs.db"  # not where the project lives
    assert str(tmp_path) not in httpx.get(server.url + "/jobs").text
    assert httpx.get(f"{server.url}/jobs/{job}").status_code == 200


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Iterator[int]:
    with redis_server(tmp_path, "--requirepass", PASSWORD) as port:
        yield port


def test_a_redis_password_in_the_url_never_shows(tmp_path: Path, start_server: Any, redis_with_password: int) -> None:
    url = f"redis://127.0.0.1:{redis_with_password}/0?password={PASSWORD}"
    root = project(tmp_path / "p", f"{{store: '{url}', prefix: {tmp_path.name}}}")
    server = start_server(root, "--log-level", "debug")
    server.wait_ready()
    job = httpx.post(server.url + "/jobs", json={"a": 1}).json()["id"]
    deadline = time.monotonic() + 10
    while httpx.get(f"{server.url}/jobs/{job}").json()["status"] != "completed":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    described = httpx.get(server.url + "/jobs").text
    assert "password=***" in described
    assert PASSWORD not in described
    server.stop()
    assert PASSWORD not in server.log


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:pw@host:6379/0", "redis://***@host:6379/0"),
        ("rediss://:pw@host/1?ssl_cert_reqs=none", "rediss://***@host/1?ssl_cert_reqs=none"),
        ("redis://host/0?password=pw&db=2", "redis://host/0?password=***&db=2"),
        ("unix:///run/redis.sock?Token=abc", "unix:///run/redis.sock?Token=***"),
    ],
)
def test_store_urls_are_shown_without_credentials(url: str, shown: str) -> None:
    assert _redacted(url) == shown
