"""TLS from the command line (``--ssl-certfile``, ``--ssl-keyfile``, ``--ssl-keyfile-password-env``): a
certificate made here, signed by a CA made here, answered to ``curl --cacert``, with one worker and two; paths
relative to the folder of the command; the messages of a mistake; the warning about a key others may read."""

from __future__ import annotations

import datetime
import ipaddress
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import write_project
from tests.test_cli_options import ServerIn

pytestmark = pytest.mark.slow

x509 = pytest.importorskip("cryptography.x509", reason='the TLS tests make certificates with "cryptography"')
if shutil.which("curl") is None:
    pytest.skip("curl is not installed", allow_module_level=True)

from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402

PASSWORD = "tls-key-password"

MODEL = """
import os


class Model:
    def predict(self, inputs):
        return {"inputs": inputs, "url": os.environ["MODELSERVE_URL"], "pid": os.getpid()}
"""


def make_certificates(folder: Path, password: str | None = PASSWORD) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate for 127.0.0.1 and localhost, its key encrypted with `password`, in a
    file only its owner may read)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "modelserve test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = folder / "ca.pem", folder / "server.pem", folder / "server-key.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    encryption = (
        serialization.NoEncryption() if password is None else serialization.BestAvailableEncryption(password.encode())
    )
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    key_path.chmod(0o600)
    return ca_path, cert_path, key_path


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "--silent", "--show-error", "--max-time", "5", *args], capture_output=True, text=True
    )


def wait_https(server: Any, ca: Path, timeout: float = 60, workers: int = 1) -> None:
    """Wait until the server answers /readyz over HTTPS and each of its `workers` has loaded the API (the
    kernel hands a connection to any worker, so one ready answer does not say the others are)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log}")
        ready = curl("--cacert", str(ca), "-o", "/dev/null", "-w", "%{http_code}", server.url + "/readyz").stdout
        if ready == "200" and server.log.count("is ready (loaded in") >= workers:
            return
        time.sleep(0.1)
    raise TimeoutError(f"no HTTPS answer within {timeout} s:\n{server.log}")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_tls_server_answers_curl_with_the_ca(tmp_path: Path, start_server: Any, workers: int) -> None:
    ca, certificate, key = make_certificates(tmp_path)
    root = write_project(tmp_path / "project", {"model.py": MODEL})
    server = start_server(
        root,
        "--workers",
        str(workers),
        "--ssl-certfile",
        str(certificate),
        "--ssl-keyfile",
        str(key),
        "--ssl-keyfile-password-env",
        "TEST_TLS_PASSWORD",
        env={"TEST_TLS_PASSWORD": PASSWORD},
    )
    server.url = server.url.replace("http://", "https://")
    wait_https(server, ca, workers=workers)
    pids = set()
    for _ in range(20 if workers > 1 else 1):
        answer = curl(
            "--cacert", str(ca), "-H", "content-type: application/json", "-d", '{"a": 1}', server.url + "/model"
        )
        assert answer.returncode == 0, answer.stderr
        body = json.loads(answer.stdout)
        assert body["inputs"] == {"a": 1}
        assert body["url"] == f"https://127.0.0.1:{server.port}"
        pids.add(body["pid"])
    # Without the CA the certificate is not trusted; plain HTTP is not answered.
    assert curl(server.url + "/healthz").returncode != 0
    assert (
        curl("-o", "/dev/null", "-w", "%{http_code}", server.url.replace("https", "http") + "/healthz").stdout != "200"
    )
    assert PASSWORD not in server.log


ENCRYPTED_HINT = "is encrypted; give its password with --ssl-keyfile-password-env"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--ssl-keyfile", "key.pem"], {}, "need --ssl-certfile"),
        (["--ssl-certfile", "missing.pem"], {}, "--ssl-certfile: {tmp}/missing.pem does not exist"),
        (["--ssl-certfile", "{cert}", "--ssl-keyfile", "missing.pem"], {}, "--ssl-keyfile: {tmp}/missing.pem does not"),
        (["--ssl-certfile", "{tmp}"], {}, "--ssl-certfile: {tmp} is not a file"),
        (["--ssl-certfile", "{cert}", "--ssl-keyfile", "{key}"], {}, "--ssl-keyfile: the private key in {key} is"),
        (
            ["--ssl-certfile", "{cert}", "--ssl-keyfile", "{key}", "--ssl-keyfile-password-env", "NO_SUCH_VARIABLE"],
            {},
            "NO_SUCH_VARIABLE is not set",
        ),
    ],
)
def test_tls_mistakes_exit_2_with_a_message(tmp_path: Path, args: list[str], env: dict[str, str], message: str) -> None:
    _, certificate, key = make_certificates(tmp_path)
    write_project(tmp_path / "project", {"model.py": MODEL})
    names = {"cert": certificate, "key": key, "tmp": tmp_path}
    server: Any = ServerIn(tmp_path, "project", *[arg.format(**names) for arg in args], env=env, log_dir=tmp_path)
    assert server.wait_exit() == 2
    server.stop()
    assert server.log.startswith("modelserve: error: ") and message.format(**names) in server.log
    assert "Traceback" not in server.log
    # The password hint only where it applies: the one case of an encrypted key given without its password.
    assert (ENCRYPTED_HINT in server.log) == (args == ["--ssl-certfile", "{cert}", "--ssl-keyfile", "{key}"])


def test_a_key_that_does_not_match_the_certificate_gets_no_password_hint(tmp_path: Path) -> None:
    _, certificate, _ = make_certificates(tmp_path)
    (tmp_path / "other").mkdir()
    _, _, other_key = make_certificates(tmp_path / "other", password=None)
    write_project(tmp_path / "project", {"model.py": MODEL})
    server: Any = ServerIn(
        tmp_path, "project", "--ssl-certfile", "server.pem", "--ssl-keyfile", "other/server-key.pem", log_dir=tmp_path
    )
    assert server.wait_exit() == 2
    server.stop()
    assert f"modelserve: error: cannot load the TLS certificate {certificate} and its key" in server.log
    assert ENCRYPTED_HINT not in server.log and "Traceback" not in server.log


@pytest.mark.parametrize("password", [PASSWORD, None])
def test_relative_tls_paths_are_read_from_the_folder_of_the_command(tmp_path: Path, password: str | None) -> None:
    """The README's command: ``python -m modelserve PROJECT --ssl-certfile cert.pem --ssl-keyfile key.pem``, run
    in the folder of the files; uvicorn reads them after the project folder became the working directory."""
    ca, _, _ = make_certificates(tmp_path, password)
    write_project(tmp_path / "project", {"model.py": MODEL})
    args = ["project", "--ssl-certfile", "server.pem", "--ssl-keyfile", "server-key.pem"]
    if password is not None:
        args += ["--ssl-keyfile-password-env", "TEST_TLS_PASSWORD"]
    server: Any = ServerIn(tmp_path, *args, env={"TEST_TLS_PASSWORD": PASSWORD}, log_dir=tmp_path)
    server.url = server.url.replace("http://", "https://")
    try:
        wait_https(server, ca)
        answer = curl("--cacert", str(ca), "-H", "content-type: application/json", "-d", "[1]", server.url + "/model")
        assert answer.returncode == 0, answer.stderr
        assert json.loads(answer.stdout)["inputs"] == [1]
    finally:
        assert server.stop() == 0, server.log
    assert "is open to users other than its owner" not in server.log  # 0600: no warning


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620])
def test_a_private_key_others_may_read_gets_a_warning_naming_the_fix(tmp_path: Path, mode: int) -> None:
    ca, certificate, key = make_certificates(tmp_path, password=None)
    key.chmod(mode)
    write_project(tmp_path / "project", {"model.py": MODEL})
    server: Any = ServerIn(
        tmp_path, "project", "--ssl-certfile", "server.pem", "--ssl-keyfile", "server-key.pem", log_dir=tmp_path
    )
    server.url = server.url.replace("http://", "https://")
    try:
        wait_https(server, ca)
    finally:
        assert server.stop() == 0, server.log
    warning = f"the TLS private key {key} is open to users other than its owner (mode {mode:04o})"
    assert warning in server.log
    assert f"restrict it with: chmod 600 {key}" in server.log


def test_a_certificate_file_holding_its_key_is_the_key_checked(tmp_path: Path) -> None:
    ca, certificate, key = make_certificates(tmp_path, password=None)
    combined = tmp_path / "combined.pem"
    combined.write_bytes(certificate.read_bytes() + key.read_bytes())
    combined.chmod(0o644)
    write_project(tmp_path / "project", {"model.py": MODEL})
    server: Any = ServerIn(tmp_path, "project", "--ssl-certfile", "combined.pem", log_dir=tmp_path)
    server.url = server.url.replace("http://", "https://")
    try:
        wait_https(server, ca)
    finally:
        assert server.stop() == 0, server.log
    assert f"the TLS private key {combined} is open to users other than its owner (mode 0644)" in server.log
