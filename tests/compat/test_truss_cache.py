"""Truss's model_cache and external_data: filled by `python -m modelserve.compat.truss_cache` from a stand-in
Hugging Face hub on loopback (HF_ENDPOINT), and a load error naming that command when they are missing.

truss-examples' `model_cache` (tests/data/truss/model_cache, byte for byte) caches two Hugging Face
repositories into volumes and reads ``/app/model_cache/stable-diffusion-xl-base/vae_1_0/...`` in load().
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO
from tests.stand_ins import TORCH, write

pytestmark = pytest.mark.slow

DATA = Path(__file__).parents[1] / "data" / "truss"
COMMAND = [sys.executable, "-m", "modelserve.compat.truss_cache"]

#: The stand-in hub's repositories: {repo_id: {path: content}}, at any revision.
REPOS = {
    "madebyollin/sdxl-vae-fp16-fix": {
        "config.json": b'{"_class_name": "AutoencoderKL"}',
        "diffusion_pytorch_model.safetensors": b"vae weights",
        "diffusion_pytorch_model.bin": b"not wanted",
    },
    "stabilityai/stable-diffusion-xl-base-1.0": {
        "model_index.json": b"{}",
        "vae_1_0/diffusion_pytorch_model.fp16.safetensors": b"sixteen bit vae" * 100,
        "vae_1_0/diffusion_pytorch_model.safetensors": b"not wanted",
        "sd_xl_base_1.0.safetensors": b"base",
        "unet/diffusion_pytorch_model.bin": b"not wanted",
    },
}


def sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


class Hub(BaseHTTPRequestHandler):
    """Enough of the Hugging Face Hub's HTTP API for snapshot_download: a repository's revision, its tree,
    and its files (``/<repo>/resolve/<revision>/<path>``). Every request is noted in `seen`."""

    seen: list[str] = []

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _repo(self, rest: str) -> tuple[str, str] | None:
        for repo in REPOS:
            if rest.startswith(repo + "/"):
                return repo, rest[len(repo) + 1 :]
        return None

    def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool = False) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET(head=True)

    def do_GET(self, head: bool = False) -> None:
        path = self.path.split("?", 1)[0]
        self.seen.append(f"{self.command} {self.path}")
        if path.startswith("/api/models/"):
            found = self._repo(path[len("/api/models/") :])
            if found is not None:
                repo, rest = found
                kind, _, revision = rest.partition("/")
                revision = revision.split("/", 1)[0]
                commit = revision if len(revision) == 40 else sha1(revision.encode())
                files = REPOS[repo]
                if kind == "revision":
                    info = {"id": repo, "sha": commit, "siblings": [{"rfilename": name} for name in files]}
                    return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
                if kind == "tree":
                    tree = [
                        {"type": "file", "oid": sha1(data), "size": len(data), "path": name}
                        for name, data in files.items()
                    ]
                    return self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"})
        else:
            found = self._repo(path.lstrip("/"))
            if found is not None and found[1].startswith("resolve/"):
                repo, rest = found
                revision, _, name = rest[len("resolve/") :].partition("/")
                data = REPOS[repo].get(name)
                if data is not None:
                    commit = revision if len(revision) == 40 else sha1(revision.encode())
                    headers = {"X-Repo-Commit": commit, "ETag": f'"{sha1(data)}"'}
                    return self._send(200, data, headers, head)
        self._send(
            404, b'{"error": "not found"}', {"Content-Type": "application/json", "X-Error-Code": "EntryNotFound"}
        )


@pytest.fixture
def hub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Hub.seen = []
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def truss(tmp_path: Path) -> Path:
    root = tmp_path / "model_cache"
    shutil.copytree(DATA / "model_cache", root)
    write(root / "packages", TORCH)
    return root


def fill(root: Path, hub: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HF_ENDPOINT": hub,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
    }
    env.pop("HF_TOKEN", None)
    return subprocess.run(
        [*COMMAND, str(root), *args], capture_output=True, text=True, env=env, cwd=str(REPO), timeout=120
    )


def test_the_command_fills_each_volume_as_truss_build_does(tmp_path: Path, hub: str) -> None:
    """snapshot_download of each repository at its revision, with its allow_patterns, into
    <cache dir>/<volume_folder>; then it says which links Baseten's paths need."""
    pytest.importorskip("huggingface_hub")
    root = truss(tmp_path)
    cache = tmp_path / "cache"
    result = fill(root, hub, tmp_path, "--cache-dir", str(cache))
    assert result.returncode == 0, result.stderr
    files = {str(path.relative_to(cache)) for path in cache.rglob("*") if path.is_file() and ".cache" not in path.parts}
    assert files == {
        "sdxl-vae-fp16/config.json",
        "sdxl-vae-fp16/diffusion_pytorch_model.safetensors",
        "stable-diffusion-xl-base/model_index.json",
        "stable-diffusion-xl-base/vae_1_0/diffusion_pytorch_model.fp16.safetensors",
        "stable-diffusion-xl-base/sd_xl_base_1.0.safetensors",
    }
    fp16 = cache / "stable-diffusion-xl-base/vae_1_0/diffusion_pytorch_model.fp16.safetensors"
    assert (
        fp16.read_bytes() == REPOS["stabilityai/stable-diffusion-xl-base-1.0"][str(fp16.relative_to(fp16.parents[1]))]
    )
    revisions = ("207b116dae70ace3637169f1ddd2434b91b3a8cd", "462165984030d82259a11f4367a4eed129e94a7b")
    downloads = [line for line in Hub.seen if "/resolve/" in line]
    assert downloads and all(any(revision in line for revision in revisions) for line in downloads)
    assert f"ln -sfn {cache.resolve() / 'sdxl-vae-fp16'} /app/model_cache/sdxl-vae-fp16" in result.stderr


def test_a_missing_model_cache_is_a_load_error_naming_the_command(tmp_path: Path, start_server: Any) -> None:
    if Path("/app/model_cache").exists():
        pytest.skip("this machine has an /app/model_cache")
    root = truss(tmp_path)
    server = start_server(root)
    code = server.wait_exit(60)
    assert code != 0
    assert "FileNotFoundError" in server.log
    assert f"python -m modelserve.compat.truss_cache {root}" in server.log, server.log
    assert 'pip install "modelserve[truss-cache]"' in server.log


@pytest.mark.skipif(
    os.geteuid() != 0 or Path("/app").exists(), reason="links /app/model_cache: needs root and no /app yet"
)
def test_linked_the_published_truss_reads_its_cache_unchanged(tmp_path: Path, hub: str, start_server: Any) -> None:
    pytest.importorskip("huggingface_hub")
    root = truss(tmp_path)
    cache = tmp_path / "cache"
    try:
        result = fill(root, hub, tmp_path, "--cache-dir", str(cache), "--link")
        assert result.returncode == 0, result.stderr
        server = start_server(root)
        server.wait_ready()
        answer = httpx.post(f"{server.url}/", json={"x": 1})
        assert answer.status_code == 200, server.log
        size = len(
            REPOS["stabilityai/stable-diffusion-xl-base-1.0"]["vae_1_0/diffusion_pytorch_model.fp16.safetensors"]
        )
        assert answer.json() == {"input": {"x": 1}, "tensor_size": size}
    finally:
        shutil.rmtree("/app", ignore_errors=True)  # it did not exist before (see skipif): only our links


def test_external_data_is_downloaded_into_the_data_folder(tmp_path: Path, hub: str) -> None:
    root = tmp_path / "t"
    (root / "model").mkdir(parents=True)
    (root / "model" / "model.py").write_text("class Model:\n    def predict(self, x):\n        return x\n")
    url = f"{hub}/stabilityai/stable-diffusion-xl-base-1.0/resolve/main/model_index.json"
    (root / "config.yaml").write_text(f"external_data:\n  - url: {url}\n    local_data_path: weights/index.json\n")
    result = fill(root, hub, tmp_path)
    assert result.returncode == 0, result.stderr
    assert (root / "data" / "weights" / "index.json").read_bytes() == b"{}"
    assert f"ln -sfn {(root / 'data').resolve()} /app/data" in result.stderr
    (root / "config.yaml").write_text("external_data:\n  - url: http://127.0.0.1:9/x\n    local_data_path: ../../x\n")
    refused = fill(root, hub, tmp_path)
    assert refused.returncode == 1 and "leaves the data folder" in refused.stderr


def test_without_huggingface_hub_the_command_says_how_to_install_it(tmp_path: Path) -> None:
    root = truss(tmp_path)
    script = (
        "import sys; sys.modules['huggingface_hub'] = None\n"
        "from modelserve.compat.truss_cache import main\n"
        f"sys.exit(main([{str(root)!r}, '--cache-dir', {str(tmp_path / 'cache')!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=str(REPO))
    assert result.returncode == 1
    assert 'pip install "modelserve[truss-cache]"' in result.stderr
    assert 'pip install -e ".[truss-cache]"' in result.stderr
