"""The V2 routes through kserve's InferenceRESTClient (protocol v2), apart from the test suite.

kserve (0.21: kubernetes, grpcio-tools, pandas, pydantic...) is too heavy for the dev extra, and it pins
versions of packages the suite shares (orjson, protobuf), so it lives in a virtual environment of its own;
installing it into a fresh one took 55 s here:

    python -m venv /tmp/kserve && /tmp/kserve/bin/pip install kserve
    python scripts/kserve_v2.py /tmp/kserve/bin/python     # scripts/test runs it when KSERVE_PYTHON is set

This process starts ``python -m modelserve examples/iris-onnx`` on a free port, runs the same file with the
given Python as the client (``--client URL``), and exits with the client's status.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


async def client(url: str) -> None:
    """The checks, with kserve's client: health, readiness, JSON and binary inference, an error."""
    import httpx
    import numpy as np
    from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig

    rows = np.array([[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]], dtype=np.float32)
    async with InferenceRESTClient(RESTConfig(protocol="v2", retries=0)) as rest:
        assert await rest.is_server_live(url)
        assert await rest.is_server_ready(url)
        assert await rest.is_model_ready(url, "iris")
        answers = []
        for binary in (False, True):
            tensor = InferInput("input", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows, binary_data=binary)
            request = InferRequest("iris", [tensor], request_id=f"kserve-{binary}")
            response = await rest.infer(url, request, model_name="iris")
            assert response.id == f"kserve-{binary}", response.id
            outputs = {output.name: output.as_numpy() for output in response.outputs}
            answers.append(outputs)
            print(f"binary={binary}: label {outputs['label'].tolist()}")
        assert answers[0]["label"].tolist() == answers[1]["label"].tolist() == [0, 2]
        np.testing.assert_allclose(answers[0]["probabilities"], answers[1]["probabilities"])
        wrong = InferInput("input", [1, 3], "FP32")
        wrong.set_data_from_numpy(np.zeros((1, 3), np.float32), binary_data=False)
        try:
            await rest.infer(url, InferRequest("iris", [wrong]), model_name="iris")
        except httpx.HTTPStatusError as exc:
            assert exc.response.status_code == 400 and "input 'input'" in str(exc), exc
        else:
            raise AssertionError("a tensor of the wrong shape was accepted")
    print("kserve InferenceRESTClient: all checks passed")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--client":
        asyncio.run(client(sys.argv[2]))
        return 0
    client_python = sys.argv[1] if len(sys.argv) > 1 else sys.executable
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "modelserve", str(REPO / "examples" / "iris-onnx"), "--port", str(port)]
    server = subprocess.Popen([*command, "--no-access-log"], cwd=REPO)
    try:
        import httpx

        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/v2/health/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                print("the server did not get ready", file=sys.stderr)
                return 1
            time.sleep(0.1)
        started = time.monotonic()
        status = subprocess.call([client_python, __file__, "--client", url])
        print(f"({time.monotonic() - started:.1f} s with the client's imports)")
        return status
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    sys.exit(main())
