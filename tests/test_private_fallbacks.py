"""The private APIs of other libraries that stay for speed, and the public paths taken when they are missing.

- onnxruntime: `OnnxModel` calls the compiled session (``InferenceSession._sess.run``) directly on the CPU
  provider; without it, ``InferenceSession.run``.
- prometheus-client: `_Histogram` counts in plain lists and adds them to the child's ``_buckets``/``_sum``;
  without them, every observation goes to the public ``observe``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
from prometheus_client import CollectorRegistry, Histogram

from modelserve.metrics import _Histogram
from modelserve.runtimes.onnx import OnnxModel
from tests.models import iris_expected, iris_onnx

ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]


class _PublicOnly:
    """An InferenceSession seen without its private attributes."""

    def __init__(self, session: onnxruntime.InferenceSession) -> None:
        self._session = session
        self.calls = 0

    def run(self, names: Any, feeds: Any, options: Any = None) -> Any:
        self.calls += 1
        return self._session.run(names, feeds, options)

    def __getattr__(self, name: str) -> Any:
        if name == "_sess":
            raise AttributeError(name)
        return getattr(self._session, name)


def test_onnx_calls_the_compiled_session_when_it_can(tmp_path: Path) -> None:
    session = onnxruntime.InferenceSession(str(iris_onnx(tmp_path / "iris.onnx")), providers=["CPUExecutionProvider"])
    model = OnnxModel(session)
    assert model._run is not session.run  # the direct call
    probabilities, _ = model.run({"input": np.asarray(ROWS, dtype=np.float32)})
    np.testing.assert_allclose(probabilities, iris_expected(ROWS)[0], rtol=1e-5)


def test_onnx_falls_back_to_the_public_run_without_the_private_session(tmp_path: Path) -> None:
    session = onnxruntime.InferenceSession(str(iris_onnx(tmp_path / "iris.onnx")), providers=["CPUExecutionProvider"])
    public = _PublicOnly(session)
    model = OnnxModel(public)  # type: ignore[arg-type]
    probabilities, labels = model.run({"input": np.asarray(ROWS, dtype=np.float32)})
    assert public.calls == 1
    expected_probabilities, expected_labels = iris_expected(ROWS)
    np.testing.assert_allclose(probabilities, expected_probabilities, rtol=1e-5)
    assert labels.tolist() == expected_labels.tolist()


def _sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float | None:
    return registry.get_sample_value(name, labels or {})


def test_histogram_counts_into_the_private_buckets_and_flushes_exactly() -> None:
    registry = CollectorRegistry()
    child = Histogram("t_seconds", "t", buckets=(0.1, 1.0), registry=registry)
    histogram = _Histogram(child)
    assert not histogram._direct
    for value in (0.05, 0.5, 0.5, 2.0):
        histogram.observe(value)
    assert _sample(registry, "t_seconds_count") == 0  # counted locally until the flush
    histogram.flush()
    assert _sample(registry, "t_seconds_count") == 4
    assert _sample(registry, "t_seconds_sum") == 3.05
    assert _sample(registry, "t_seconds_bucket", {"le": "0.1"}) == 1
    assert _sample(registry, "t_seconds_bucket", {"le": "1.0"}) == 3


def test_histogram_falls_back_to_the_public_observe_without_the_private_buckets() -> None:
    registry = CollectorRegistry()
    child = Histogram("u_seconds", "u", buckets=(0.1, 1.0), registry=registry)

    class PublicChild:
        _upper_bounds = child._upper_bounds

        def observe(self, value: float) -> None:
            child.observe(value)

    histogram = _Histogram(PublicChild())
    assert histogram._direct
    for value in (0.05, 0.5, 2.0):
        histogram.observe(value)
    assert _sample(registry, "u_seconds_count") == 3  # no flush needed
    assert _sample(registry, "u_seconds_bucket", {"le": "0.1"}) == 1
    histogram.flush()
    assert _sample(registry, "u_seconds_count") == 3
