"""A V2 binary answer read by a real browser from another origin: headless Chromium loads a page whose script
asks for a binary output, reads ``Inference-Header-Content-Length`` and ``X-Request-ID`` (exposed by default)
and splits the answer into its JSON header and its tensor. Uses tests/http/test_browser.py's page server and loader
(skipped with it when no Chromium is installed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from tests.conftest import write_project
from tests.http.test_browser import load, serve_pages

pytestmark = pytest.mark.slow

MODEL = """
class Model:
    def predict(self, inputs):
        return inputs["x"] * 2
"""

PAGE = """<!doctype html>
<html><body><pre id="result">pending</pre><script>
const show = (text) => { document.getElementById("result").textContent = text; };
const body = {inputs: [{name: "x", datatype: "FP32", shape: [3], data: [1, 2, 3]}],
              parameters: {binary_data_output: true}};
fetch(new URLSearchParams(location.search).get("api"),
      {method: "POST", headers: {"content-type": "application/json"}, body: JSON.stringify(body)})
  .then(async (answer) => {
    const length = Number(answer.headers.get("inference-header-content-length"));
    const id = answer.headers.get("x-request-id");
    const bytes = await answer.arrayBuffer();
    const header = JSON.parse(new TextDecoder().decode(bytes.slice(0, length)));
    const values = Array.from(new Float32Array(bytes.slice(length)));
    show(`READ ${answer.status} id=${id ? id.length : "none"} ${header.outputs[0].name} ${values.join(",")}`);
  })
  .catch((error) => show("BLOCKED " + error));
</script></body></html>
"""


def test_a_page_splits_a_binary_v2_answer_with_the_exposed_headers(tmp_path: Path, start_server: Any) -> None:
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "index.html").write_text(PAGE)
    pages, thread = serve_pages(tmp_path / "pages")
    try:
        origin = f"http://127.0.0.1:{pages.server_address[1]}"
        server = start_server(write_project(tmp_path / "project", {"model.py": MODEL}), "--cors-origin", origin)
        server.wait_ready()
        query = urlencode({"api": f"{server.url}/v2/models/model/infer"})
        result = load(f"{origin}/index.html?{query}", tmp_path)
    finally:
        pages.shutdown()
        pages.server_close()
        thread.join()
    assert result == "READ 200 id=32 output 2,4,6"
