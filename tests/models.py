"""Tiny models for the tests, built on the spot: ONNX with the `onnx` helper API, SavedModels with tf.Module.

TensorFlow is imported only inside the SavedModel builders (it takes seconds).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: The iris model's weights: probabilities = softmax(x @ W + B); label = argmax.
#: A Model class that echoes its inputs and appends a line to calls.log each time predict runs (tests that
#: show a request was refused, or a safe method ran nothing, read the log).
LOGGED_ECHO = """
class Model:
    def predict(self, inputs):
        with open("calls.log", "a") as log:
            log.write("predict\\n")
        return inputs
"""

IRIS_W = np.array(
    [[0.4, 0.1, -0.5], [0.9, -0.2, -0.7], [-1.2, 0.3, 0.9], [-1.1, -0.2, 1.3]],
    dtype=np.float32,
)
IRIS_B = np.array([0.2, 0.9, -1.1], dtype=np.float32)
IRIS_LABELS = ["setosa", "versicolor", "virginica"]


def save_model(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def iris_onnx(path: Path) -> Path:
    """input float32 [batch, 4] -> probabilities float32 [batch, 3], label int64 [batch]."""
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["input", "W"], ["logits0"]),
            helper.make_node("Add", ["logits0", "B"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["probabilities"], axis=-1),
            helper.make_node("ArgMax", ["logits"], ["label"], axis=-1, keepdims=0),
        ],
        "iris",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
        ],
        [numpy_helper.from_array(IRIS_W, "W"), numpy_helper.from_array(IRIS_B, "B")],
    )
    return save_model(graph, path)


def iris_expected(rows: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    logits = np.asarray(rows, dtype=np.float32) @ IRIS_W + IRIS_B
    exp = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return exp / exp.sum(axis=-1, keepdims=True), logits.argmax(axis=-1)


def two_inputs_onnx(path: Path) -> Path:
    """a float32 [n, 2] and b int32 [n, 2] -> sum float32 [n, 2] (a + b), flag bool [] (an input, echoed)."""
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["b"], ["b_float"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["a", "b_float"], ["sum"]),
            helper.make_node("Identity", ["flag"], ["flag_out"]),
        ],
        "two_inputs",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, 2]),
            helper.make_tensor_value_info("b", TensorProto.INT32, [None, 2]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("sum", TensorProto.FLOAT, [None, 2]),
            helper.make_tensor_value_info("flag_out", TensorProto.BOOL, []),
        ],
    )
    return save_model(graph, path)


def shared_batch_onnx(path: Path) -> Path:
    """a float32 [batch, 2] and b float32 [batch, 2] (one named dimension) -> sum float32 [batch, 2]."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["sum"])],
        "shared_batch",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 2]),
        ],
        [helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["batch", 2])],
    )
    return save_model(graph, path)


def fixed_shape_onnx(path: Path) -> Path:
    """x float32 [2, 3] (fixed) -> y = x * 2."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["y"])],
        "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")],
    )
    return save_model(graph, path)


def mlp_onnx(path: Path, width: int = 256, layers: int = 3, classes: int = 10, seed: int = 0) -> Path:
    """x float32 [batch, width] -> layers x (MatMul + Relu) -> MatMul -> logits float32 [batch, classes]."""
    rng = np.random.default_rng(seed)
    nodes, weights = [], []
    current = "x"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        weights.append(numpy_helper.from_array(w, f"W{i}"))
        nodes.append(helper.make_node("MatMul", [current, f"W{i}"], [f"h{i}"]))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"]))
        current = f"r{i}"
    w_out = (rng.standard_normal((width, classes)) / np.sqrt(width)).astype(np.float32)
    weights.append(numpy_helper.from_array(w_out, "W_out"))
    nodes.append(helper.make_node("MatMul", [current, "W_out"], ["logits"]))
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", classes])],
        weights,
    )
    return save_model(graph, path)


def tanh_loop_body(weight: str, width: int) -> onnx.GraphProto:
    """The body of a Loop that runs y = tanh(y @ `weight`) once per trip, on a [1, width] state."""
    return helper.make_graph(
        [
            helper.make_node("MatMul", ["y_in", weight], ["m"]),
            helper.make_node("Tanh", ["m"], ["y_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("y_in", TensorProto.FLOAT, [1, width]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("y_out", TensorProto.FLOAT, [1, width]),
        ],
    )


def _loop_onnx(path: Path, trips: int, width: int = 128) -> Path:
    """x float32 [1, width] -> y: `trips` rounds of y = tanh(y @ W)."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    body = tanh_loop_body("W", width)
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "x"], ["y"], body=body)],
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])],
        [
            numpy_helper.from_array(np.array(trips, dtype=np.int64), "trips"),
            numpy_helper.from_array(w, "W"),
        ],
    )
    return save_model(graph, path)


def slow_onnx(path: Path, seconds: float = 0.2) -> Path:
    """A model whose every call takes about `seconds` (with one intra-op thread), calibrated on this machine."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    trips = 200
    for _ in range(3):
        _loop_onnx(path, trips)
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        x = np.zeros((1, 128), dtype=np.float32)
        session.run(None, {"x": x})
        started = time.perf_counter()
        session.run(None, {"x": x})
        took = time.perf_counter() - started
        if 0.8 * seconds <= took <= 1.5 * seconds:
            break
        trips = max(1, int(trips * seconds / max(took, 1e-6)))
    return _loop_onnx(path, trips)


# ------------------------------------------------------------------------------------------------
# TensorFlow SavedModels


def iris_saved_model(path: Path) -> Path:
    """signature serving_default: x float32 [None, 4] -> probabilities float32 [None, 3], label int64 [None]."""
    import tensorflow as tf

    class Iris(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(IRIS_W)
            self.b = tf.Variable(IRIS_B)

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="x")])
        def serve(self, x):  # type: ignore[no-untyped-def]
            logits = tf.matmul(x, self.w) + self.b
            return {"probabilities": tf.nn.softmax(logits), "label": tf.argmax(logits, axis=-1)}

    module = Iris()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return path


def two_inputs_saved_model(path: Path) -> Path:
    """signatures serving_default and `scaled`: a float32 [None, 2], b int32 [None, 2] -> sum float32 [None, 2]."""
    import tensorflow as tf

    class Two(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 2], tf.float32, name="a"),
                tf.TensorSpec([None, 2], tf.int32, name="b"),
            ]
        )
        def add(self, a, b):  # type: ignore[no-untyped-def]
            return {"sum": a + tf.cast(b, tf.float32)}

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 2], tf.float32, name="a"),
                tf.TensorSpec([None, 2], tf.int32, name="b"),
            ]
        )
        def scaled(self, a, b):  # type: ignore[no-untyped-def]
            return {"sum": 10 * (a + tf.cast(b, tf.float32))}

    module = Two()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.add, "scaled": module.scaled})
    return path
