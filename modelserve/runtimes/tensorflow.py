"""The TensorFlow adapter: one signature of a SavedModel directory.

Importing this module imports TensorFlow (seconds); it is imported only for projects that serve a
SavedModel. Hooks receive, as ``signature``, the map from signature key to the SavedModel's
``SignatureDef`` protos (read from ``saved_model.pb``); ``prediction`` is a dict from output name to the
output's values as a flat list, as Cortex gave it (Cortex parsed TensorFlow Serving's response into
``{name: [values]}``: ``prediction["class_ids"][0]`` is a number, ``prediction["sample"]`` a list of tokens).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from modelserve.errors import LoadError
from modelserve.runtimes._model import LoadedModel
from modelserve.runtimes._tensors import Dim, TensorSpec

if TYPE_CHECKING:
    from modelserve.config import ModelFileConfig
    from modelserve.devices import Device

logger = logging.getLogger("modelserve")

DEFAULT_SIGNATURE_KEY = "serving_default"


def _spec(name: str, spec: Any) -> TensorSpec:
    try:
        dims: list[Any] | None = spec.shape.as_list()
    except ValueError:  # unknown rank
        dims = None
    shape: tuple[Dim, ...] | None = None if dims is None else tuple(dims)
    return TensorSpec(name, np.dtype(spec.dtype.as_numpy_dtype), shape, spec.dtype.name)


def signature_defs(path: Path) -> dict[str, Any]:
    """The SignatureDef protos of the SavedModel's serving graph, by signature key."""
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((path / "saved_model.pb").read_bytes())
    for graph in saved.meta_graphs:
        if "serve" in graph.meta_info_def.tags or len(saved.meta_graphs) == 1:
            return {key: value for key, value in graph.signature_def.items() if not key.startswith("__")}
    return {}


#: The model whose thread counts TensorFlow took, once one has set them (the first model loaded in the process).
_threads_from: str | None = None
_threads_lock = threading.Lock()


def set_threads(config: ModelFileConfig) -> None:
    """Thread counts must be set before TensorFlow's runtime starts, once per process: the first model loaded sets
    them (the default, `default_intra_op_threads`, when its API sets none), and a later one whose API asks for
    other counts is told, with a warning, that they are ignored.

    The APIs of a project load at once, each in a worker thread: without the lock, a second model could set its
    counts before the first one's load started the runtime, silently, and which one won depended on the race."""
    global _threads_from
    intra, inter = config.intra_op_threads, config.inter_op_threads
    with _threads_lock:
        first = _threads_from
        if first is None:
            _threads_from = config.path
            try:
                tf.config.threading.set_intra_op_parallelism_threads(
                    intra if intra is not None else default_intra_op_threads()
                )
                if inter is not None:
                    tf.config.threading.set_inter_op_parallelism_threads(inter)
                return
            except RuntimeError:  # the runtime was started before any model loaded (the project's own code)
                first = "code that started TensorFlow's runtime before any model loaded"
    ignored = (intra is not None and intra != tf.config.threading.get_intra_op_parallelism_threads()) or (
        inter is not None and inter != tf.config.threading.get_inter_op_parallelism_threads()
    )
    if ignored:
        logger.warning(
            "tensorflow: intra_op_threads/inter_op_threads of %s are ignored: TensorFlow takes them once per "
            "process, and they were set for %s",
            config.path,
            first,
        )


def default_intra_op_threads() -> int:
    """The intra-op threads when the API sets none: every core but one, left to the event loop (see the ONNX
    adapter's default and docs/runtimes.md)."""
    return max(1, (os.cpu_count() or 1) - 1)


def configure_gpus(device: Device | None, config: ModelFileConfig) -> None:
    """Before TensorFlow's runtime starts: the process sees only the API's GPU, and takes its memory as it
    grows (TensorFlow's own default maps all of every GPU's memory at once, so that two workers cannot share
    one), or at most ``gpu_memory_limit_mb``. Nothing to do without a GPU."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    chosen = gpus[device.gpu % len(gpus)] if device is not None and device.gpu is not None else gpus[0]
    try:
        tf.config.set_visible_devices([chosen], "GPU")
        if config.gpu_memory_limit_mb is not None:
            tf.config.set_logical_device_configuration(
                chosen, [tf.config.LogicalDeviceConfiguration(memory_limit=config.gpu_memory_limit_mb)]
            )
        else:
            tf.config.experimental.set_memory_growth(chosen, True)
    except RuntimeError:
        logger.warning(
            "tensorflow: the GPU placement of %s (device %s, memory growth or limit) is ignored: TensorFlow's "
            "runtime was already started in this process",
            config.path,
            device,
        )


def _to_text(array: np.ndarray) -> Any:
    """String outputs come as bytes; JSON needs text."""
    if array.dtype.kind == "O":
        return [_to_text(item) if isinstance(item, np.ndarray) else _decode(item) for item in array]
    return array


def _decode(item: Any) -> Any:
    return item.decode("utf-8", "replace") if isinstance(item, bytes) else item


def flat_values(prediction: dict[str, np.ndarray]) -> dict[str, list[Any]]:
    """Each output as a flat list of Python values, strings as text: Cortex's form of a prediction."""
    flat = {}
    for name, array in prediction.items():
        values = array.ravel().tolist()
        flat[name] = [_decode(item) for item in values] if array.dtype.kind in "OS" else values
    return flat


class TensorFlowModel(LoadedModel):
    format = "tensorflow"

    def __init__(self, loaded: Any, function: Any, signatures: dict[str, Any], signature_key: str) -> None:
        self.loaded = loaded  # keeps the variables alive
        self.function = function
        self.signature_key = signature_key
        self.pre_signature = self.post_signature = signatures
        _, kwargs = function.structured_input_signature
        self.inputs = tuple(_spec(name, spec) for name, spec in sorted(kwargs.items()))
        outputs = function.structured_outputs
        self.outputs = tuple(_spec(name, spec) for name, spec in sorted(outputs.items()))

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {name: tensor.numpy() for name, tensor in self.function(**feeds).items()}

    def for_hook(self, prediction: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        return flat_values(prediction)

    def as_response(self, prediction: dict[str, np.ndarray]) -> dict[str, Any]:
        return {name: _to_text(array) for name, array in prediction.items()}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "signature_key": self.signature_key}


def load(path: Path, config: ModelFileConfig, device: Device | None = None) -> TensorFlowModel:
    """Load a SavedModel directory (on `device`) and pick its `signature_key` signature."""
    if not (path / "saved_model.pb").is_file():
        raise LoadError(f"{config.path}: not a SavedModel directory (no saved_model.pb in it)")
    set_threads(config)
    configure_gpus(device, config)
    try:
        loaded = tf.saved_model.load(str(path))
    except Exception as exc:
        raise LoadError(f"{config.path}: TensorFlow cannot load it: {exc}") from exc
    functions = getattr(loaded, "signatures", {})
    if config.signature_key == DEFAULT_SIGNATURE_KEY and config.signature_key not in functions:
        # Without a signature_key, Cortex served the only signature, else "predict" (an Estimator's export).
        if len(functions) == 1:
            config.signature_key = next(iter(functions))
        elif "predict" in functions:
            config.signature_key = "predict"
    if config.signature_key not in functions:
        known = ", ".join(sorted(functions)) or "none"
        raise LoadError(f"{config.path}: no signature {config.signature_key!r} (signatures: {known})")
    return TensorFlowModel(loaded, functions[config.signature_key], signature_defs(path), config.signature_key)
