"""Shared fixtures: project folders written by the tests, and real servers on free loopback ports."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parent.parent

# httpx makes an SSL context for every client, and every top-level call (httpx.get) makes a client: with a
# bundle of CAs named (SSL_CERT_FILE, else certifi's), OpenSSL parses all of it each time, about 40 ms of CPU,
# and the suite makes thousands (each poll of `wait_ready` one, beside a server that is loading). The system's
# folder of CAs, read only when a certificate is checked, serves the same: half the time of a module of server
# tests on a busy machine (tests/http/test_auth.py and tests/test_cli.py: 67 s, then 34 s). Servers and tools the
# tests start inherit it. No test reaches beyond loopback; TLS tests name their own CA.
if os.path.isdir("/etc/ssl/certs"):
    os.environ.pop("SSL_CERT_FILE", None)
    os.environ["SSL_CERT_DIR"] = "/etc/ssl/certs"


_handed_out: set[int] = set()
#: The ports handed out by every test run on this machine, a file each: CI runs scripts/test-floors (another
#: pytest, servers of its own) beside the suite, and a port one run had handed out but not yet bound could be
#: handed out by the other; then a server that lost the bind race had its readiness answered by the other's.
_CLAIMS = Path(tempfile.gettempdir()) / "modelserve-test-ports"
#: A claim older than this is left over by a run that was killed: taken over.
_STALE_CLAIM_S = 3600


def _claim(port: int) -> bool:
    """Whether `port` is now this run's: no other run on the machine has claimed it (`_CLAIMS`)."""
    _CLAIMS.mkdir(exist_ok=True)
    path = _CLAIMS / str(port)
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        try:
            if time.time() - path.stat().st_mtime < _STALE_CLAIM_S:
                return False
            path.unlink()  # a stale claim: whoever removes it first (and then creates it) takes the port
        except FileNotFoundError:
            pass
        return _claim(port)
    return True


@atexit.register
def _release_claims() -> None:
    for port in _handed_out:
        with contextlib.suppress(OSError):
            (_CLAIMS / str(port)).unlink()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that starts a real server process ``server`` (``bash scripts/test --quick`` skips them)."""
    for item in items:
        if {"start_server", "start_server_module"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)


def free_port() -> int:
    """A loopback port that is free now and that no test run on this machine has handed out before.

    The port is closed again before the server binds it, and a server importing TensorFlow binds seconds
    later: without the set (this run's) and the claims (every run's, `_claim`), a second server started
    meanwhile could be given the same port, and the one that loses the bind race would have its requests
    answered by the other.
    """
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out and _claim(port):
            _handed_out.add(port)
            return port


@contextlib.contextmanager
def redis_process(folder: Path, *options: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A redis-server of the test's own on a free loopback port (skips when none is installed): its process
    (to pause it, say) and its port."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (scripts/test installs it)")
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)]
        + list(options),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield process, port
    finally:
        process.send_signal(signal.SIGCONT)  # a paused one ends too
        process.terminate()
        process.wait(10)


@contextlib.contextmanager
def redis_server(folder: Path, *options: str) -> Iterator[int]:
    """A redis-server of the test's own on a free loopback port (skips when none is installed); its port."""
    with redis_process(folder, *options) as (_, port):
        yield port


def read_http_answer(sock: socket.socket) -> bytes:
    """One HTTP/1.1 answer from a raw socket: its head and its Content-Length of body (the server must not close
    the connection before it is whole)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head = data.split(b"\r\n\r\n", 1)[0]
    length = next(int(line[15:]) for line in head.lower().split(b"\r\n") if line.startswith(b"content-length:"))
    while len(data) < len(head) + 4 + length:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    return data


@contextlib.contextmanager
def serve_in_thread(config: Any, ready: bool = False) -> Iterator[Any]:
    """A real uvicorn server on `config` (a ``uvicorn.Config``), run in a thread of the test's process; with
    `ready`, once its ``/readyz`` answers 200 (its APIs load after it has started: on a busy machine a request
    sent at once gets the 503 of an API still loading)."""
    import uvicorn

    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        deadline = time.monotonic() + 60
        while ready and httpx.get(f"http://{config.host}:{config.port}/readyz").status_code != 200:
            assert thread.is_alive() and time.monotonic() < deadline, "the server's APIs never loaded"
            time.sleep(0.02)
        yield server
    finally:
        server.should_exit = True
        thread.join(30)


class Failures(logging.Handler):
    """The log lines at ERROR or with a traceback of a server run in the test's process (add it to the root
    logger while the server runs): a refusal of bad input logs neither."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.lines.append(self.format(record))


def write_project(root: Path, files: dict[str, str]) -> Path:
    """Write a project folder: {relative path: text}; text is dedented."""
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return root


class Server:
    """A `python -m modelserve` process on a free loopback port; output goes to a log file."""

    def __init__(self, project: Path, *args: str, env: dict[str, str] | None = None, log_dir: Path) -> None:
        self._command = [sys.executable, "-m", "modelserve", str(project), *args]
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._log_dir = log_dir
        self._launch()

    def _launch(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self._log_dir / f"server-{self.port}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        stdout, stderr = self._streams()
        self.process = subprocess.Popen(
            [*self._command, "--port", str(self.port)], stdout=stdout, stderr=stderr, env=self._env, cwd=str(REPO)
        )

    def _streams(self) -> tuple[Any, Any]:
        """The process's stdout and stderr: both into the log file (a subclass may keep them apart)."""
        return self._log, subprocess.STDOUT

    def _lost_its_port(self) -> bool:
        """Whether the process exited because something else bound its port first. `free_port` knows the ports
        of this test run only: CI runs another test script beside the suite, whose servers and clients take
        loopback ports too, and one may take this one between `free_port` and the server's bind."""
        in_use = f"cannot listen on 127.0.0.1:{self.port}: Address already in use"
        return self.process.returncode == 4 and in_use in self.log

    @property
    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_listening(self, timeout: float = 30) -> None:
        """Wait until /healthz answers (the APIs may still be loading). A server whose port was taken before it
        could bind it is started again on another port (`url` and `port` change then), up to 3 times."""
        deadline = time.monotonic() + timeout
        relaunches = 3
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if relaunches and self._lost_its_port():
                    relaunches -= 1
                    self._log.close()
                    self._launch()
                    continue
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server did not listen within {timeout} s:\n{self.log}")

    def wait_ready(self, timeout: float = 60, consecutive: int = 1) -> None:
        """Wait until /readyz answers 200 (every API loaded) `consecutive` times in a row.

        With --workers N one worker may be ready while another still loads; each check is a new connection,
        which either worker may take, so 20 answers in a row leave a loading worker little chance to hide.
        """
        self.wait_listening(timeout)
        deadline = time.monotonic() + timeout
        ready = 0
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log}")
            try:
                ready = ready + 1 if httpx.get(self.url + "/readyz", timeout=2).status_code == 200 else 0
            except httpx.TransportError:
                ready = 0
            if ready >= consecutive:
                return
            if not ready:
                time.sleep(0.05)
        raise TimeoutError(f"server was not ready within {timeout} s:\n{self.log}")

    def wait_exit(self, timeout: float = 30) -> int:
        return self.process.wait(timeout)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode


def _server_starter(log_dir: Path) -> Iterator[object]:
    servers: list[Server] = []

    def start(project: Path, *args: str, env: dict[str, str] | None = None) -> Server:
        server = Server(project, *args, env=env, log_dir=log_dir)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[object]:
    """start_server(project_dir, *cli_args, env=None) -> Server; every server is stopped after the test."""
    yield from _server_starter(tmp_path)


@pytest.fixture(scope="module")
def start_server_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Like start_server, for a server shared by the tests of one module."""
    yield from _server_starter(tmp_path_factory.mktemp("servers"))
