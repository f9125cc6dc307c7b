"""Backends: what answers an API's requests once loaded.

One module per kind: `model_class` (a Truss-style Model class), `model_file` (an ONNX file or a TensorFlow
SavedModel with optional hooks), `handler_class` (a Cortex-style async Handler) and `cortex_handler` (Cortex's
handler classes and predictor modules, from cortex.yaml projects). `make_backend` picks
one from an API's configuration; the rest of the server only sees the `Backend` interface.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelserve.errors import LoadError
from modelserve.pipeline import Pipeline

if TYPE_CHECKING:
    from modelserve.config import ApiConfig
    from modelserve.metrics import ApiMetrics, MetricsClient


class Backend:
    """The interface every backend offers.

    ``__init__`` imports and validates user code (errors are `LoadError`s, found before serving starts);
    `load` constructs and loads it (may take long; the API answers 503 meanwhile).
    """

    #: Shown in ``GET /<api>``.
    kind = "backend"
    pipeline: Pipeline

    async def load(self) -> None:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {}

    @property
    def streams(self) -> bool:
        return False

    async def close(self) -> None:
        return None


def make_backend(
    api: ApiConfig,
    root: Path | None,
    metrics_client: MetricsClient,
    api_metrics: ApiMetrics,
) -> Backend:
    """Pick and build (import and validate, not yet load) the backend an API's configuration names."""
    if api.cortex is None and api.model is not None and api.handler is not None and api.handler.class_name:
        # A model with a handler class: a Cortex TensorFlow/ONNX handler whose client serves that model.
        from dataclasses import replace

        from modelserve.config import CortexConfig

        api = replace(api, model=None, cortex=CortexConfig(type=api.model.format, models={"": api.model}))
    if api.cortex is not None:
        from modelserve.backends.cortex_handler import CortexHandlerBackend

        return CortexHandlerBackend(api, root, metrics_client, api_metrics)
    if api.model is not None:
        from modelserve.backends.model_file import ModelFileBackend

        return ModelFileBackend(api, root, metrics_client, api_metrics)
    if api.kind == "async":
        from modelserve.backends.handler_class import HandlerClassBackend

        return HandlerClassBackend(api, root, metrics_client, api_metrics)
    from modelserve.backends.model_class import ModelClassBackend

    return ModelClassBackend(api, root, metrics_client, api_metrics)


def resolve_class(api: ApiConfig, root: Path | None, default_class: str) -> tuple[type, str]:
    """The user's class of an API, imported from its file (or given directly), and a label for messages."""
    from modelserve.project import find_class, import_file

    handler = api.handler
    if handler is None:
        raise LoadError(f"api '{api.name}': no handler configured")
    if handler.obj is not None:
        cls = handler.obj
        return cls, getattr(cls, "__qualname__", repr(cls))
    assert handler.path is not None and root is not None
    class_name = handler.class_name or default_class
    module = import_file(root, handler.path)
    return find_class(module, class_name, handler.path), f"{handler.path}:{class_name}"
