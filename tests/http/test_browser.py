"""CORS and API keys checked by a real browser: headless Chromium loads a page from another origin (a static
server on another loopback port) whose script ``fetch()``es an API of a real modelserve server.

Skipped, saying why, when no Chromium is installed (Debian: ``apt-get install chromium``; scripts/test
installs it where apt-get is available).
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.conftest import write_project

pytestmark = pytest.mark.slow

BROWSER = next(filter(None, map(shutil.which, ["chromium", "chromium-browser", "google-chrome"])), None)
if BROWSER is None:
    pytest.skip(
        "no headless Chromium to run the browser checks (apt-get install chromium; scripts/test installs it "
        "where apt-get is available)",
        allow_module_level=True,
    )

KEY = "browser-test-key-0123456789"

MODEL = """
class Model:
    def predict(self, inputs):
        with open("calls.log", "a") as log:
            log.write("predict\\n")
        return {"echo": inputs}
"""

# The page's script: one fetch as the query string says; the outcome goes into <pre id="result">.
PAGE = """<!doctype html>
<html><body><pre id="result">pending</pre><script>
const params = new URLSearchParams(location.search);
const headers = {"content-type": params.get("type")};
if (params.get("key")) headers["x-api-key"] = params.get("key");
const show = (text) => { document.getElementById("result").textContent = text; };
fetch(params.get("api"), {method: "POST", headers, body: JSON.stringify({hello: "browser"})})
  .then((answer) => answer.text().then((text) => show("READ " + answer.status + " " + text)))
  .catch((error) => show("BLOCKED " + error));
</script></body></html>
"""


def serve_pages(folder: Path) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """A static server of `folder` on a free loopback port: the other origin."""
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(allowed origin, other origin): two static servers of the same page."""
    folder = tmp_path_factory.mktemp("pages")
    (folder / "index.html").write_text(PAGE)
    servers = [serve_pages(folder) for _ in range(2)]
    yield tuple(f"http://127.0.0.1:{server.server_address[1]}" for server, _ in servers)  # type: ignore[misc]
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="module")
def api(pages: tuple[str, str], tmp_path_factory: pytest.TempPathFactory, start_server_module: Any) -> Any:
    root = tmp_path_factory.mktemp("browser") / "project"
    config = f"""
        apis: [{{name: echo, handler: {{path: model.py}}}}]
        auth: {{api_keys_env: BROWSER_TEST_KEYS}}
        cors: {{allow_origins: ["{pages[0]}"]}}
    """
    write_project(root, {"model.py": MODEL, "modelserve.yaml": config})
    server = start_server_module(root, env={"BROWSER_TEST_KEYS": KEY})
    server.wait_ready()
    server.root = root
    return server


def calls(root: Path) -> int:
    path = root / "calls.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


def load(page: str, tmp_path: Path) -> str:
    """Load `page` in headless Chromium; the text of its result once its fetch settled."""
    command = [
        str(BROWSER),
        "--headless",
        "--no-sandbox",  # tests may run as root
        "--disable-gpu",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=10000",
        "--dump-dom",
        page,
    ]
    dom = subprocess.run(command, capture_output=True, text=True, timeout=90).stdout
    start = dom.index('<pre id="result">') + len('<pre id="result">')
    return dom[start : dom.index("</pre>", start)]


def page_url(origin: str, api: Any, content_type: str, key: str | None) -> str:
    query = {"api": f"{api.url}/echo", "type": content_type, "key": key or ""}
    return f"{origin}/index.html?{urlencode(query)}"


def test_a_page_of_an_allowed_origin_reads_the_answer(pages: tuple[str, str], api: Any, tmp_path: Path) -> None:
    before = calls(api.root)
    result = load(page_url(pages[0], api, "application/json", KEY), tmp_path)
    assert result == 'READ 200 {"echo":{"hello":"browser"}}'
    assert calls(api.root) == before + 1


def test_a_page_of_an_allowed_origin_reads_a_401(pages: tuple[str, str], api: Any, tmp_path: Path) -> None:
    result = load(page_url(pages[0], api, "application/json", None), tmp_path)
    assert result.startswith('READ 401 {"error":"this route needs an API key')


def test_a_page_of_another_origin_is_blocked_before_predict_runs(
    pages: tuple[str, str], api: Any, tmp_path: Path
) -> None:
    before = calls(api.root)
    assert load(page_url(pages[1], api, "application/json", KEY), tmp_path).startswith("BLOCKED")
    # A "simple" request (text/plain, no preflight) reaches the server; the missing key stops it there.
    assert load(page_url(pages[1], api, "text/plain", None), tmp_path).startswith("BLOCKED")
    assert calls(api.root) == before
