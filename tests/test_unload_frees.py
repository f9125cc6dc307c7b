"""A repository unload frees the model it unloads (`modelserve.repository`, model control explicit).

docs/v2.md: the unload answers 200 once the model is freed. Each project here holds a model whose ``load()``
(a Truss or modelserve Model class) or constructor (a Cortex handler class) allocates `SIZE` bytes and adds
itself to `LIVE`. A real uvicorn server in this process serves it; after an unload over HTTP or gRPC, the
process's resident memory drops by most of those bytes (no collection run: the references go when the backend
closes) and no instance is left alive. The routes still answer the unloaded API's 503, and a later load serves
again. Before the fix the closed backend kept the instance (and the V2 route's cached backend kept the backend).
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import write_project
from tests.test_repository_races import PATIENCE, post, serving

#: What each model holds: 200 MB of float64 ones (every page written, so resident).
SIZE = 200 * 1024 * 1024
#: The instances of the projects' models alive now.
LIVE: weakref.WeakSet[Any] = weakref.WeakSet()

_HOLDER = """
import numpy as np

from tests.test_unload_frees import LIVE, SIZE


class Holder:
    def __init__(self, **kwargs):
        self.array = None

    def load(self):
        self.array = np.ones(SIZE // 8)
        LIVE.add(self)

    def predict(self, inputs):
        return {"held": int(self.array.nbytes)}
"""

PROJECTS = {
    "model class": {
        "modelserve.yaml": "apis:\n  - name: big\n    handler: {path: big.py, class: Holder}\n",
        "big.py": _HOLDER,
    },
    "batched model class": {
        "modelserve.yaml": (
            "apis:\n  - name: big\n    handler: {path: big.py, class: Batched}\n"
            "    batching: {max_batch_size: 4, max_wait_ms: 1}\n"
        ),
        "big.py": _HOLDER
        + """

class Batched(Holder):
    def predict(self, inputs):
        return [{"held": int(self.array.nbytes)} for _ in inputs]
""",
    },
    "truss": {
        "config.yaml": "model_name: big\n",
        "model/__init__.py": "",
        "model/model.py": _HOLDER + "\n\nclass Model(Holder):\n    pass\n",
    },
    "cortex": {
        "cortex.yaml": "- name: big\n  kind: RealtimeAPI\n  handler: {type: python, path: handler.py}\n",
        "handler.py": """
import numpy as np

from tests.test_unload_frees import LIVE, SIZE


class Handler:
    def __init__(self, config):
        self.array = np.ones(SIZE // 8)
        LIVE.add(self)

    def handle_post(self, payload):
        return {"held": int(self.array.nbytes)}
""",
    },
}


def resident() -> int:
    """This process's resident memory in bytes (the server runs in it), as /proc says."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def unload(url: str, address: str, over: str) -> None:
    if over == "http":
        answer = post(url, "/v2/repository/models/big/unload")
        assert answer.status_code == 200, answer.text
        return
    grpcclient = pytest.importorskip("tritonclient.grpc")
    client = grpcclient.InferenceServerClient(address)
    try:
        client.unload_model("big")
    finally:
        client.close()


CASES = [
    pytest.param("model class", "http", id="model-class-http"),
    pytest.param("model class", "grpc", id="model-class-grpc"),
    pytest.param("batched model class", "http", id="batched-http"),
    pytest.param("truss", "http", id="truss-http"),
    pytest.param("cortex", "http", id="cortex-http"),
]


@pytest.mark.parametrize(("kind", "over"), CASES)
def test_an_unload_frees_the_model_and_a_load_serves_it_again(tmp_path: Path, kind: str, over: str) -> None:
    if over == "grpc":
        pytest.importorskip("tritonclient.grpc")
    gc.collect()
    root = write_project(tmp_path / "project", PROJECTS[kind])
    with serving(root, grpc=over == "grpc") as (url, address, app):
        assert len(LIVE) == 1
        # Every route that keeps a backend has seen this one: the V2 route (and gRPC's) caches it on a call.
        infer = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
        assert httpx.post(f"{url}/v2/models/big/infer", json=infer, timeout=PATIENCE).status_code == 200
        native = httpx.post(f"{url}/big", json={"x": 1}, timeout=PATIENCE)
        assert native.status_code == 200 and native.json() == {"held": SIZE}, native.text
        loaded = resident()
        closed = weakref.ref(app.server.apis["big"].backend)

        unload(url, address, over)
        freed = loaded - resident()  # before any collection: what the unload itself let go
        assert freed >= SIZE // 2, f"the unload freed {freed:,} bytes of the {SIZE:,} the model holds"
        gc.collect()
        assert len(LIVE) == 0, "an instance of the unloaded model is still alive"

        refused = httpx.post(f"{url}/big", json={"x": 1}, timeout=PATIENCE)
        assert refused.status_code == 503 and refused.json()["error"].startswith("api 'big' is unloaded;")
        refused = httpx.post(f"{url}/v2/models/big/infer", json=infer, timeout=PATIENCE)
        assert refused.status_code == 503 and "is unloaded" in refused.json()["error"]

        assert post(url, "/v2/repository/models/big/load").status_code == 200
        assert len(LIVE) == 1
        gc.collect()
        assert closed() is None, "the closed backend is still kept (by a route's cache)"
        again = httpx.post(f"{url}/big", json={"x": 1}, timeout=PATIENCE)
        assert again.status_code == 200 and again.json() == {"held": SIZE}
        assert httpx.post(f"{url}/v2/models/big/infer", json=infer, timeout=PATIENCE).status_code == 200


# ------------------------------------------------------------------------------------------------
# a load or unload of a name of kilobytes: the 400 cuts it (`modelserve.errors.shorten`), as other messages do

#: A name no model has, of 5,000 characters (a path segment of an HTTP request or a gRPC string).
LONG = "m" * 5_000


QUICK = {
    "modelserve.yaml": "apis:\n  - name: quick\n    handler: {path: quick.py}\n",
    "quick.py": "class Model:\n    def predict(self, inputs):\n        return inputs\n",
}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with serving(write_project(tmp_path_factory.mktemp("small"), QUICK), grpc=True) as (url, address, _app):
        yield url, address


def assert_cut(message: str) -> None:
    assert LONG[:60] in message and LONG not in message, message[:200]
    assert len(message) < 400, f"a message of {len(message):,} characters"


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("load", {}),  # no model of that name
        ("unload", {}),
        ("load", {"parameters": {"file:1/model.onnx": "eA=="}}),  # a parameter refused
        ("load", {"parameters": {"config": 1}}),  # a config that is no string
        ("unload", {"parameters": {"config": "{}"}}),  # a config of an unload
        ("load", {"parameters": []}),  # parameters that are no object
    ],
)
def test_a_long_model_name_is_cut_in_the_repository_s_400(small: tuple[str, str], action: str, body: Any) -> None:
    url, _ = small
    answer = post(url, f"/v2/repository/models/{LONG}/{action}", body)
    assert answer.status_code == 400
    assert answer.json()["error"].startswith(f"failed to {action} 'mmm")
    assert_cut(answer.json()["error"])


@pytest.mark.parametrize("action", ["load", "unload"])
def test_a_long_model_name_is_cut_over_grpc(small: tuple[str, str], action: str) -> None:
    grpcclient = pytest.importorskip("tritonclient.grpc")
    InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException
    client = grpcclient.InferenceServerClient(small[1])
    try:
        with pytest.raises(InferenceServerException) as error:
            getattr(client, f"{action}_model")(LONG)
    finally:
        client.close()
    assert error.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert_cut(error.value.message())


TRUSS_WEBSOCKET = {
    "config.yaml": "model_name: big\n",
    "model/__init__.py": "",
    "model/model.py": """
import numpy as np

from tests.test_unload_frees import LIVE, SIZE


class Model:
    def load(self):
        self.array = np.ones(SIZE // 8)
        LIVE.add(self)

    async def websocket(self, websocket):
        await websocket.send_text(f"{await websocket.receive_text()} {self.array.nbytes}")
""",
}


def test_an_unload_frees_a_truss_websocket_model(tmp_path: Path) -> None:
    """Truss's /v1/websocket reaches the model through its own entry (`TrussModelClassBackend.entries`): unloaded,
    the session is refused (503) and the model is freed; loaded again, it answers."""
    websockets = pytest.importorskip("websockets")
    invalid_status = pytest.importorskip("websockets.exceptions").InvalidStatus

    async def exchange(url: str) -> str:
        async with websockets.connect(url.replace("http://", "ws://") + "/v1/websocket") as websocket:
            await websocket.send("held")
            return str(await websocket.recv())

    gc.collect()
    with serving(write_project(tmp_path / "project", TRUSS_WEBSOCKET)) as (url, _, _app):
        assert asyncio.run(exchange(url)) == f"held {SIZE}"
        loaded = resident()
        assert post(url, "/v2/repository/models/big/unload").status_code == 200
        freed = loaded - resident()
        assert freed >= SIZE // 2, f"the unload freed {freed:,} bytes of the {SIZE:,} the model holds"
        gc.collect()
        assert len(LIVE) == 0
        with pytest.raises(invalid_status) as refused:
            asyncio.run(exchange(url))
        assert refused.value.response.status_code == 503
        assert post(url, "/v2/repository/models/big/load").status_code == 200
        assert asyncio.run(exchange(url)) == f"held {SIZE}"
