"""The private APIs of other libraries that stay for speed, and the public paths taken when they are missing.

- onnxruntime: `OnnxModel` calls the compiled session (``InferenceSession._sess.run``) directly on the CPU
  provider; without it, ``InferenceSession.run``.
- prometheus-client: `_Histogram` counts in plain lists and adds them to the child's ``_buckets``/``_sum``;
  without them, every observation goes to the public ``observe``.
- uvicorn: `LimitedHttpToolsProtocol` (and `LingeringH11Protocol`) read attributes and override callbacks of
  uvicorn's protocols (`modelserve.http._uvicorn` checks them at start); without one, the server is served by
  uvicorn's own protocol, with one warning naming what is lost, and still answers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime
import pytest
from prometheus_client import CollectorRegistry, Histogram
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

import modelserve
from modelserve.api_metrics import _Histogram
from modelserve.http._protocol import LimitedHttpToolsProtocol, TransportConfig, transport_protocol
from modelserve.http._uvicorn import HTTPTOOLS_METHODS, missing
from modelserve.runtimes.onnx import OnnxModel
from tests.conftest import free_port, serve_in_thread
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


# --------------------------------------------------------------------------------------------------
# uvicorn's protocols


@pytest.fixture
def fresh_check() -> Iterator[None]:
    """`transport_protocol()` checks uvicorn again in this test, and again after it (once its patches are undone)."""
    transport_protocol.cache_clear()
    yield
    transport_protocol.cache_clear()


def without(protocol: type[Any], name: str) -> type[Any]:
    """`protocol` as a uvicorn whose protocol no longer has `name` (an attribute or a method) would be."""

    class Without(protocol):  # type: ignore[misc, valid-type]
        def __getattribute__(self, attribute: str) -> Any:
            if attribute == name:
                raise AttributeError(attribute)
            return super().__getattribute__(attribute)

    if name in vars(protocol) or any(name in vars(base) for base in protocol.__mro__):
        setattr(Without, name, None)  # a method: gone from the class too
    return Without


def test_uvicorn_has_what_modelserves_protocols_rely_on(fresh_check: None) -> None:
    assert missing(HttpToolsProtocol) == []
    assert missing(H11Protocol) == []
    assert transport_protocol() is LimitedHttpToolsProtocol


@pytest.mark.parametrize("name", [*HTTPTOOLS_METHODS, "url", "flow", "loop", "transport"])
def test_each_attribute_of_httptools_relied_on_is_checked(name: str) -> None:
    found = missing(without(HttpToolsProtocol, name))
    assert len(found) == 1 and name in found[0], found


@pytest.mark.parametrize("name", ["scope", "cycle", "app"])
def test_a_missing_request_attribute_is_found(name: str) -> None:
    assert missing(without(HttpToolsProtocol, name))


@pytest.mark.parametrize("name", ["conn", "cycle", "flow", "_unset_keepalive_if_required"])
def test_each_attribute_of_h11_relied_on_is_checked(name: str) -> None:
    assert missing(without(H11Protocol, name))


def headers_kept_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """uvicorn as a later version might be: the request's headers kept under another name (``headers`` is
    gone), everything else as it was, so that uvicorn's own protocol serves as before."""
    begin = HttpToolsProtocol.on_message_begin

    def on_message_begin(self: Any) -> None:
        begin(self)
        self.request_headers = vars(self).pop("headers")

    def on_header(self: Any, name: bytes, value: bytes) -> None:
        self.request_headers.append((name.lower(), value))

    monkeypatch.setattr(HttpToolsProtocol, "on_message_begin", on_message_begin)
    monkeypatch.setattr(HttpToolsProtocol, "on_header", on_header)


class Echo:
    def predict(self, inputs: Any) -> Any:
        return inputs


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_without_an_attribute_uvicorns_protocol_serves_after_one_warning(
    monkeypatch: pytest.MonkeyPatch, fresh_check: None
) -> None:
    headers_kept_elsewhere(monkeypatch)
    protocol_logger = logging.getLogger("modelserve.http._protocol")
    handler = Records()
    protocol_logger.addHandler(handler)  # whatever an earlier test's logging setup did to its parents
    try:
        port = free_port()
        app = modelserve.create_app(handler=Echo, name="echo")
        config = TransportConfig(app, host="127.0.0.1", port=port, log_level="warning")
        TransportConfig(app, host="127.0.0.1", port=free_port())  # a second server of the process: no warning
    finally:
        protocol_logger.removeHandler(handler)
    warnings = handler.records
    assert len(warnings) == 1, warnings
    message = warnings[0].getMessage()
    assert "headers" in message and "serving with uvicorn's HttpToolsProtocol" in message
    for lost in ("header size limit", "deadlines", "refusal pause", "lingering close", "two Host headers"):
        assert lost in message, message
    assert config.http is HttpToolsProtocol
    with serve_in_thread(config, ready=True) as server:
        assert server.config.http_protocol_class is HttpToolsProtocol
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            for body in ({"a": 1}, {"b": [1, 2]}):  # twice on one keep-alive connection
                answer = client.post("/echo", json=body)
                assert answer.status_code == 200 and answer.json() == body, answer.text
