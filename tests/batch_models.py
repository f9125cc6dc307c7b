"""ONNX models for the batching tests: row-wise models with a dynamic first dimension and a tunable run time.

A batch only forms while the model is busy, so these models take a fixed time per call (a loop over a
small matrix that does not depend on the rows), whatever the number of rows: several requests then really
share a call, and a test can prove it.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.models import save_model, tanh_loop_body

TABLE = np.arange(10, dtype=np.float32) * 10


def _busy_zero(source: str, trips: int, width: int = 128) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Nodes computing `busy_zero`, a float scalar 0 that takes `trips` rounds of a matrix product.

    Its loop starts from a value derived from `source` so that onnxruntime cannot fold it into a constant.
    """
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
    body = tanh_loop_body("busy_W", width)
    nodes = [
        helper.make_node("Cast", [source], ["busy_src"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["busy_src"], ["busy_sum"], keepdims=0),
        helper.make_node("Mul", ["busy_sum", "busy_zero_f"], ["busy_s0"]),
        helper.make_node("Add", ["busy_ones", "busy_s0"], ["busy_init"]),
        helper.make_node("Loop", ["busy_trips", "", "busy_init"], ["busy_state"], body=body),
        helper.make_node("ReduceSum", ["busy_state"], ["busy_total"], keepdims=0),
        helper.make_node("Mul", ["busy_total", "busy_zero_f"], ["busy_zero"]),
    ]
    weights = [
        numpy_helper.from_array(np.array(trips, dtype=np.int64), "busy_trips"),
        numpy_helper.from_array(w, "busy_W"),
        numpy_helper.from_array(np.ones((1, width), dtype=np.float32), "busy_ones"),
        numpy_helper.from_array(np.array(0.0, dtype=np.float32), "busy_zero_f"),
    ]
    return nodes, weights


def _doubler(path: Path, trips: int) -> Path:
    nodes, weights = _busy_zero("x", trips)
    graph = helper.make_graph(
        [
            *nodes,
            helper.make_node("Mul", ["x", "two"], ["x2"]),
            helper.make_node("Add", ["x2", "busy_zero"], ["y"]),
        ],
        "doubler",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "n"])],
        [*weights, numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")],
    )
    return save_model(graph, path)


def _lookup(path: Path, trips: int) -> Path:
    nodes, weights = _busy_zero("idx", trips)
    graph = helper.make_graph(
        [
            *nodes,
            helper.make_node("Gather", ["table", "idx"], ["found"], axis=0),
            helper.make_node("Add", ["found", "busy_zero"], ["value"]),
        ],
        "lookup",
        [helper.make_tensor_value_info("idx", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("value", TensorProto.FLOAT, ["batch"])],
        [*weights, numpy_helper.from_array(TABLE, "table")],
    )
    return save_model(graph, path)


def _calibrated(build, path: Path, seconds: float, feeds: dict[str, np.ndarray]) -> Path:  # type: ignore[no-untyped-def]
    """Build with a loop count that makes one call take about `seconds` (one intra-op thread) here."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    trips = 100
    for _ in range(3):
        build(path, trips)
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        session.run(None, feeds)
        started = time.perf_counter()
        session.run(None, feeds)
        took = time.perf_counter() - started
        if 0.7 * seconds <= took <= 1.5 * seconds:
            return path
        trips = max(1, int(trips * seconds / max(took, 1e-6)))
    return build(path, trips)  # type: ignore[no-any-return]


def doubler_onnx(path: Path, seconds: float = 0.04) -> Path:
    """x float32 [batch, n] -> y = 2 * x; every call takes about `seconds`, whatever the rows."""
    return _calibrated(_doubler, path, seconds, {"x": np.zeros((1, 3), dtype=np.float32)})


def lookup_onnx(path: Path, seconds: float = 0.04) -> Path:
    """idx int64 [batch] -> value = TABLE[idx] (an index out of 0..9 makes the call fail); about `seconds`."""
    return _calibrated(_lookup, path, seconds, {"idx": np.zeros((1,), dtype=np.int64)})
