"""TLS from the command line (``--ssl-certfile``, ``--ssl-keyfile``, ``--ssl-keyfile-password-env``): a
certificate made here, signed by a CA made here, answered to ``curl --cacert``, with one worker and two."""

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


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate for 127.0.0.1 and localhost, its key encrypted with PASSWORD)."""
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
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(PASSWORD.encode()),
        )
    )
    return ca_path, cert_path, key_path


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["curl", "--silent", "--show-error", "--max-time", "5", *args], capture_output=True, text=True
    )


def wait_https(server: Any, ca: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited with {server.process.returncode}:\n{server.log}")
        if curl("--cacert", str(ca), "-o", "/dev/null", "-w", "%{http_code}", server.url + "/readyz").stdout == "200":
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
    wait_https(server, ca)
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


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--ssl-keyfile", "key.pem"], {}, "need --ssl-certfile"),
        (["--ssl-certfile", "missing.pem"], {}, "cannot load the TLS certificate"),
        (["--ssl-certfile", "{cert}", "--ssl-keyfile", "{key}"], {}, "cannot load the TLS certificate"),
        (
            ["--ssl-certfile", "{cert}", "--ssl-keyfile", "{key}", "--ssl-keyfile-password-env", "NO_SUCH_VARIABLE"],
            {},
            "NO_SUCH_VARIABLE is not set",
        ),
    ],
)
def test_tls_mistakes_exit_2_with_a_message(
    tmp_path: Path, start_server: Any, args: list[str], env: dict[str, str], message: str
) -> None:
    _, certificate, key = make_certificates(tmp_path)
    root = write_project(tmp_path / "project", {"model.py": MODEL})
    server = start_server(root, *[arg.format(cert=certificate, key=key) for arg in args], env=env)
    assert server.wait_exit() == 2
    assert message in server.log
