"""The ONNX adapter: an onnxruntime `InferenceSession` over an ``.onnx`` file.

Importing this module imports onnxruntime (and never TensorFlow). Hooks receive, as ``signature``, the
session's input NodeArgs (``session.get_inputs()``) in pre_inference and its output NodeArgs in
post_inference; ``prediction`` is the list of output arrays in the model's output order.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime

from modelserve.errors import LoadError
from modelserve.runtimes._model import LoadedModel
from modelserve.runtimes._tensors import Dim, TensorSpec

if TYPE_CHECKING:
    from modelserve.config import ModelFileConfig
    from modelserve.devices import Device

logger = logging.getLogger("modelserve")

_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
    "tensor(string)": np.object_,
}


def _spec(arg: Any) -> TensorSpec:
    dtype = _DTYPES.get(arg.type)
    shape: tuple[Dim, ...] | None = None
    if arg.type.startswith("tensor(") and arg.shape is not None:
        shape = tuple(d if isinstance(d, (int, str)) else None for d in arg.shape)
    return TensorSpec(arg.name, None if dtype is None else np.dtype(dtype), shape, arg.type)


#: Execution providers that run on one GPU, picked by their ``device_id`` option.
GPU_PROVIDERS = frozenset(
    {"CUDAExecutionProvider", "TensorrtExecutionProvider", "ROCMExecutionProvider", "MIGraphXExecutionProvider"}
)


def default_intra_op_threads() -> int:
    """The intra-op threads of a session whose API sets none: every core but one, which is left to the event
    loop (measured in docs/runtimes.md: onnxruntime's own default, one thread per core, spins its threads on
    the loop's core, and a batched MLP on 2 cores gained less than half of what it gains with one thread)."""
    return max(1, (os.cpu_count() or 1) - 1)


def session_options(config: ModelFileConfig) -> onnxruntime.SessionOptions:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = (
        config.intra_op_threads if config.intra_op_threads is not None else default_intra_op_threads()
    )
    if config.inter_op_threads is not None:
        options.inter_op_num_threads = config.inter_op_threads
        if config.inter_op_threads > 1:
            # inter-op threads only run independent branches of the graph in parallel mode
            options.execution_mode = onnxruntime.ExecutionMode.ORT_PARALLEL
    return options


def provider_entries(wanted: list[Any], device: Device | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The configured providers as onnxruntime's ``(name, options)`` pairs; a GPU provider gets the API's device
    as its ``device_id`` unless its options name one."""
    entries = []
    for entry in wanted:
        name, options = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()))
        options = dict(options or {})
        if name in GPU_PROVIDERS and device is not None and device.gpu is not None:
            options.setdefault("device_id", device.gpu)
        entries.append((name, options))
    return entries


def choose_providers(wanted: list[Any], device: Device | None = None) -> list[tuple[str, dict[str, Any]]]:
    """The wanted execution providers that this onnxruntime build has, in the wanted order, as
    ``(name, options)`` pairs (see `provider_entries`)."""
    available = onnxruntime.get_available_providers()
    entries = provider_entries(wanted, device)
    chosen = [entry for entry in entries if entry[0] in available]
    skipped = [name for name, _ in entries if name not in available]
    if not chosen:
        raise LoadError(
            f"none of the execution providers {[name for name, _ in entries]} is available in this onnxruntime build "
            f"(available: {', '.join(available)})"
        )
    if skipped:
        logger.warning(
            "onnx: execution providers %s are not available here; using %s", skipped, [name for name, _ in chosen]
        )
    return chosen


class OnnxModel(LoadedModel):
    format = "onnx"

    def __init__(self, session: onnxruntime.InferenceSession) -> None:
        self.session = session
        self.pre_signature = session.get_inputs()
        self.post_signature = session.get_outputs()
        self.inputs = tuple(_spec(arg) for arg in self.pre_signature)
        self.outputs = tuple(_spec(arg) for arg in self.post_signature)
        self.output_names = tuple(arg.name for arg in self.post_signature)
        self._names = list(self.output_names)
        self._run = session.run
        # `InferenceSession.run` checks its feeds in Python (names present, OrtValue ownership, graph capture)
        # before calling the compiled session: microseconds, a tenth of a small model's run. Our feeds come from
        # `InputConverter`, which has already checked the names and made numpy arrays, so on the CPU provider
        # (no fallback between providers to handle) the compiled session is called directly.
        direct = getattr(getattr(session, "_sess", None), "run", None)
        if session.get_providers() == ["CPUExecutionProvider"] and callable(direct):
            self._run = direct

    def run(self, feeds: dict[str, np.ndarray]) -> list[Any]:
        outputs: list[Any] = self._run(self._names, feeds, None)
        return outputs

    def as_response(self, prediction: list[Any]) -> dict[str, Any]:
        return dict(zip(self.output_names, prediction, strict=True))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "providers": self.session.get_providers()}


def load(path: Path, config: ModelFileConfig, device: Device | None = None) -> OnnxModel:
    """Create the session of an .onnx file with the API's providers (on `device`) and thread counts."""
    if not path.is_file():
        raise LoadError(f"{config.path}: an ONNX model must be a file (found a folder)")
    providers = choose_providers(config.providers, device)
    try:
        session = onnxruntime.InferenceSession(str(path), session_options(config), providers=providers)
    except Exception as exc:  # onnxruntime raises its own exception types for invalid models
        raise LoadError(f"{config.path}: onnxruntime cannot load it: {exc}") from exc
    return OnnxModel(session)
