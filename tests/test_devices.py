"""Device placement (issue 19): the assignment, the slots of worker processes, what onnxruntime, TensorFlow and
user code are given. No GPU is needed: the runtimes' calls are spied on."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

import modelserve
from modelserve import devices
from modelserve.config import load_project_config
from modelserve.devices import CPU, Device, assign
from modelserve.errors import ConfigError
from tests.conftest import write_project
from tests.models import iris_onnx


@pytest.mark.parametrize(
    ("wanted", "gpus", "expected"),
    [
        ("auto", 0, ["cpu", "cpu", "cpu"]),  # no GPU: auto is the CPU
        ("auto", 1, ["cuda:0", "cuda:0", "cuda:0"]),
        ("auto", 2, ["cuda:0", "cuda:1", "cuda:0"]),
        (None, 2, ["cuda:0", "cuda:1", "cuda:0"]),
        ([3, 5], 0, ["cuda:3", "cuda:5", "cuda:3"]),  # given ids are used as they are
        ([1], 8, ["cuda:1", "cuda:1", "cuda:1"]),
    ],
)
def test_worker_i_gets_devices_i_mod_n(wanted: Any, gpus: int, expected: list[str]) -> None:
    assert [assign(wanted, slot=slot, gpus=gpus).name for slot in range(3)] == expected


@pytest.mark.parametrize(
    ("visible", "count"), [("0,1", 2), ("3", 1), ("", 0), ("-1", 0), ("0,-1,2", 1), ("GPU-8f2c,GPU-11ab", 2)]
)
def test_visible_gpus_follow_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch, visible: str, count: int) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert devices.visible_gpus() == count


def test_each_process_takes_the_lowest_free_slot_and_a_dead_one_frees_it(tmp_path: Path) -> None:
    first, first_file = devices._take_slot(tmp_path)
    second, second_file = devices._take_slot(tmp_path)  # flock: another open file is another owner
    assert (first, second) == (0, 1)
    first_file.close()  # its process ended
    third, third_file = devices._take_slot(tmp_path)
    assert third == 0
    assert (tmp_path / "slot-0.lock").read_text() == f"{os.getpid()}\n"
    second_file.close()
    third_file.close()


def test_a_worker_counts_as_loaded_while_it_lives_and_once_its_process_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(devices.SLOTS_ENV, str(tmp_path))
    monkeypatch.setenv(devices.WORKERS_ENV, "3")
    _, first = devices._take_slot(tmp_path)
    _, second = devices._take_slot(tmp_path)  # the third worker has not started
    assert devices.workers_loaded() == (0, 3)
    (tmp_path / "loaded-0").write_text(str(os.getpid()))
    (tmp_path / "loaded-1").write_text("999999")  # said by the process that held slot 1 before
    assert devices.workers_loaded() == (1, 3)
    first.close()  # the worker of slot 0 died: its note stays, its lock does not
    assert devices.workers_loaded() == (0, 3)
    second.close()


def write_yaml(tmp_path: Path, text: str) -> Path:
    iris_onnx(tmp_path / "iris.onnx")
    model = "class Model:\n    def predict(self, x):\n        return x\n"
    return write_project(tmp_path, {"model.py": model, "modelserve.yaml": text})


@pytest.mark.parametrize(("value", "expected"), [("auto", "auto"), ("[0, 1]", [0, 1]), ("2", [2]), (None, "auto")])
def test_devices_key(tmp_path: Path, value: str | None, expected: Any) -> None:
    line = f"\n    devices: {value}" if value is not None else ""
    write_yaml(tmp_path, f"apis:\n  - name: m\n    handler: {{path: model.py}}{line}\n")
    assert load_project_config(tmp_path).apis[0].devices == expected


@pytest.mark.parametrize("value", ["gpu", "[-1]", "[]", "true", "[0, x]"])
def test_a_bad_devices_key_is_a_config_error(tmp_path: Path, value: str) -> None:
    write_yaml(tmp_path, f"apis:\n  - name: m\n    handler: {{path: model.py}}\n    devices: {value}\n")
    with pytest.raises(ConfigError, match="key 'devices': expected 'auto' or a list of GPU ids"):
        load_project_config(tmp_path)


def test_providers_take_options(tmp_path: Path) -> None:
    write_yaml(
        tmp_path,
        """
        apis:
          - name: m
            model:
              path: iris.onnx
              providers:
                - CUDAExecutionProvider: {gpu_mem_limit: 1073741824, cudnn_conv_algo_search: HEURISTIC}
                - TensorrtExecutionProvider: {trt_fp16_enable: true, device_id: 0}
                - CPUExecutionProvider
        """.replace("\n        ", "\n"),
    )
    assert load_project_config(tmp_path).apis[0].model.providers == [  # type: ignore[union-attr]
        {"CUDAExecutionProvider": {"gpu_mem_limit": 1073741824, "cudnn_conv_algo_search": "HEURISTIC"}},
        {"TensorrtExecutionProvider": {"trt_fp16_enable": True, "device_id": 0}},
        "CPUExecutionProvider",
    ]


@pytest.mark.parametrize("value", ["[{CUDAExecutionProvider: 3}]", "[{a: {}, b: {}}]", "[1]", "[]"])
def test_bad_providers_are_a_config_error(tmp_path: Path, value: str) -> None:
    write_yaml(tmp_path, f"apis:\n  - name: m\n    model: {{path: iris.onnx, providers: {value}}}\n")
    with pytest.raises(ConfigError, match="key 'providers': expected a list of execution provider names"):
        load_project_config(tmp_path)


def test_gpu_memory_limit_is_for_tensorflow_models(tmp_path: Path) -> None:
    write_yaml(tmp_path, "apis:\n  - name: m\n    model: {path: iris.onnx, gpu_memory_limit_mb: 512}\n")
    with pytest.raises(ConfigError, match="key 'gpu_memory_limit_mb' applies to tensorflow models"):
        load_project_config(tmp_path)


# --------------------------------------------------------------------------------------------------
# onnxruntime: the providers as (name, options) pairs, the device filled in


def test_gpu_providers_get_the_device_unless_their_options_name_one() -> None:
    from modelserve.runtimes.onnx import provider_entries

    wanted = [
        {"CUDAExecutionProvider": {"gpu_mem_limit": 1024}},
        {"TensorrtExecutionProvider": {"device_id": 0}},
        "CPUExecutionProvider",
    ]
    assert provider_entries(wanted, Device(1)) == [
        ("CUDAExecutionProvider", {"gpu_mem_limit": 1024, "device_id": 1}),
        ("TensorrtExecutionProvider", {"device_id": 0}),
        ("CPUExecutionProvider", {}),
    ]
    assert provider_entries(["CUDAExecutionProvider"], CPU) == [("CUDAExecutionProvider", {})]


class SessionSpy:
    """Stands in for onnxruntime.InferenceSession: records what it was given, runs a real CPU session."""

    calls: list[dict[str, Any]] = []
    real: Any = None  # the real InferenceSession

    def __new__(cls, path: str, options: Any = None, providers: Any = None, **kwargs: Any) -> Any:
        cls.calls.append({"providers": providers, "intra_op_threads": options.intra_op_num_threads})
        return cls.real(path, options, providers=["CPUExecutionProvider"])


@pytest.fixture
def session_spy(monkeypatch: pytest.MonkeyPatch) -> type[SessionSpy]:
    import onnxruntime

    SessionSpy.calls = []
    SessionSpy.real = onnxruntime.InferenceSession
    monkeypatch.setattr(onnxruntime, "InferenceSession", SessionSpy)
    available = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: available)
    return SessionSpy


def test_the_session_gets_the_workers_gpu_as_device_id(tmp_path: Path, session_spy: type[SessionSpy]) -> None:
    write_yaml(
        tmp_path,
        """
        apis:
          - name: iris
            devices: [2, 3]
            model:
              path: iris.onnx
              providers: [{CUDAExecutionProvider: {arena_extend_strategy: kSameAsRequested}}, CPUExecutionProvider]
        """.replace("\n        ", "\n"),
    )
    app = modelserve.create_app(tmp_path)
    with TestClient(app) as client:
        client.portal.call(app.server.wait_loaded)
        info = client.get("/iris").json()
        assert client.post("/iris", json=[[5.1, 3.5, 1.4, 0.2]]).status_code == 200
    assert session_spy.calls[-1]["providers"] == [
        ("CUDAExecutionProvider", {"arena_extend_strategy": "kSameAsRequested", "device_id": 2}),
        ("CPUExecutionProvider", {}),
    ]
    assert (info["device"], info["worker"]) == ("cuda:2", 0)


def test_intra_op_threads_default_to_all_cores_but_one(tmp_path: Path, session_spy: type[SessionSpy]) -> None:
    from modelserve.config import ModelFileConfig
    from modelserve.runtimes import onnx

    iris_onnx(tmp_path / "iris.onnx")
    onnx.load(tmp_path / "iris.onnx", ModelFileConfig(path="iris.onnx"))
    onnx.load(tmp_path / "iris.onnx", ModelFileConfig(path="iris.onnx", intra_op_threads=3))
    assert [call["intra_op_threads"] for call in session_spy.calls] == [max(1, (os.cpu_count() or 1) - 1), 3]


# --------------------------------------------------------------------------------------------------
# TensorFlow: the process sees only its GPU, whose memory grows (or is capped), before any op


class TFSpy:
    def __init__(self, gpus: list[str]) -> None:
        self.gpus = gpus
        self.calls: list[tuple[Any, ...]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch, tf: Any) -> None:
        monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: list(self.gpus))
        monkeypatch.setattr(tf.config, "set_visible_devices", lambda d, kind=None: self.calls.append(("visible", d)))
        monkeypatch.setattr(
            tf.config.experimental, "set_memory_growth", lambda d, on: self.calls.append(("growth", d, on))
        )
        monkeypatch.setattr(
            tf.config,
            "set_logical_device_configuration",
            lambda d, configs: self.calls.append(("limit", d, configs[0].memory_limit)),
        )


@pytest.mark.parametrize(
    ("gpus", "device", "limit", "expected"),
    [
        (["gpu0", "gpu1"], Device(1), None, [("visible", ["gpu1"]), ("growth", "gpu1", True)]),
        (["gpu0", "gpu1"], Device(0), 512, [("visible", ["gpu0"]), ("limit", "gpu0", 512)]),
        (["gpu0"], None, None, [("visible", ["gpu0"]), ("growth", "gpu0", True)]),
        ([], Device(0), None, []),  # no GPU: nothing to configure
    ],
)
def test_tensorflow_sees_only_its_gpu_with_memory_growth(
    monkeypatch: pytest.MonkeyPatch, gpus: list[str], device: Device | None, limit: int | None, expected: list[Any]
) -> None:
    tf = pytest.importorskip("tensorflow")
    from modelserve.config import ModelFileConfig
    from modelserve.runtimes.tensorflow import configure_gpus

    spy = TFSpy(gpus)
    spy.install(monkeypatch, tf)
    configure_gpus(device, ModelFileConfig(path="m", format="tensorflow", gpu_memory_limit_mb=limit))
    assert spy.calls == expected


# --------------------------------------------------------------------------------------------------
# Model classes: modelserve.device() and the constructor's `device`

SEEN = """
import threading

import modelserve


class Model:
    def __init__(self, device):
        self.seen = {"argument": device, "constructor": modelserve.device()}

    def load(self):
        self.seen["load"] = modelserve.device()

    def preprocess(self, inputs):
        self.seen["preprocess"] = modelserve.device()
        return inputs

    def predict(self, batch):
        self.seen["predict"] = modelserve.device()
        return [dict(self.seen) for _ in batch]
"""


def test_a_model_class_learns_its_device(tmp_path: Path) -> None:
    write_project(
        tmp_path,
        {
            "model.py": SEEN,
            "modelserve.yaml": """
                apis:
                  - name: seen
                    handler: {path: model.py}
                    devices: [3]
                    batching: {max_batch_size: 4}
            """,
        },
    )
    app = modelserve.create_app(tmp_path)
    with TestClient(app) as client:
        client.portal.call(app.server.wait_loaded)
        answer = client.post("/seen", json={}).json()
        info = client.get("/seen").json()
    assert answer == dict.fromkeys(["argument", "constructor", "load", "preprocess", "predict"], "cuda:3")
    assert (info["device"], info["worker"]) == ("cuda:3", 0)


WORKER = """
import os

import modelserve


class Model:
    def predict(self, inputs):
        return {"device": modelserve.device(), "pid": os.getpid()}
"""


def test_each_worker_of_workers_2_takes_its_own_slot_and_device(tmp_path: Path, start_server) -> None:
    project = write_project(
        tmp_path / "project",
        {
            "model.py": WORKER,
            "modelserve.yaml": """
                apis:
                  - name: where
                    handler: {path: model.py}
                    devices: [0, 1]
            """,
        },
    )
    server = start_server(project, "--workers", "2")
    server.wait_ready(consecutive=10)
    seen: dict[int, str] = {}
    answers: dict[str, int] = {}
    deadline = time.monotonic() + 60
    while (len(seen) < 2 or len(answers) < 2) and time.monotonic() < deadline:
        with httpx.Client() as client:  # a new connection each time: either worker may take it
            info = client.get(server.url + "/where").json()
            seen[info["worker"]] = info["device"]
        with httpx.Client() as client:
            answer = client.post(server.url + "/where", json={}).json()
            answers[answer["device"]] = answer["pid"]
    assert seen == {0: "cuda:0", 1: "cuda:1"}
    assert sorted(answers) == ["cuda:0", "cuda:1"]
    assert len(set(answers.values())) == 2
