"""Backends: what answers an API's requests once loaded.

One module per kind: `model_class` (a Model class), `model_file` (an ONNX file or a TensorFlow SavedModel with
optional hooks) and `handler_class` (an async Handler); Truss's Model class and Cortex's handler classes and
predictor modules are served from `modelserve.compat`. `make_backend` builds the one that the registry
(`modelserve.config.BACKENDS`) names for an API's kind (`ApiConfig.backend`); the rest of the server only sees
the `Backend` interface. A backend imports and runs user code: it never imports a protocol or HTTP module, and
returns values, never responses (a result with its own media type is a `modelserve.codecs.Answer`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelserve.config import BACKENDS
from modelserve.errors import LoadError, ServiceUnavailable
from modelserve.pipeline import Pipeline, Stage

if TYPE_CHECKING:
    from modelserve.api_metrics import ApiMetrics
    from modelserve.config import ApiConfig
    from modelserve.metrics import MetricsClient


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

    def let_go(self, *names: str) -> None:
        """After `close`: drop the user's instance and every attribute in `names` that calls it or holds what it
        made (a pipeline's stages are its bound methods). The API, its routes and their caches may keep the
        backend after a repository unload; a closed backend must not keep the model with it. Its ``pipeline``
        becomes `closed_pipeline`, which a call that reaches it anyway is refused by (503)."""
        attributes = vars(self)
        for name in ("instance", *names):
            if name in attributes:
                attributes[name] = None
        if "pipeline" in attributes:
            self.pipeline = closed_pipeline(getattr(self, "label", self.kind))


def closed_pipeline(label: str) -> Pipeline:
    """The pipeline of a closed backend: every call is refused as unloaded (503)."""

    async def refuse(value: Any, request: Any) -> Any:
        raise ServiceUnavailable(f"{label} is unloaded", retry_after=30)

    return Pipeline([Stage("closed", refuse, True)], needs_inputs=False)


def make_backend(
    api: ApiConfig,
    root: Path | None,
    metrics_client: MetricsClient,
    api_metrics: ApiMetrics,
) -> Backend:
    """Build (import and validate, not yet load) the backend that `BACKENDS` names for an API's kind."""
    return backend_class(api.backend)(api, root, metrics_client, api_metrics)


def backend_class(kind: str) -> Callable[[ApiConfig, Path | None, MetricsClient, ApiMetrics], Backend]:
    """The `Backend` class of a kind of `BACKENDS` (its module imported now)."""
    try:
        target = BACKENDS[kind]
    except KeyError:
        raise LoadError(f"unknown backend {kind!r} (known backends: {', '.join(sorted(BACKENDS))})") from None
    module, _, name = target.partition(":")
    cls: Callable[[ApiConfig, Path | None, MetricsClient, ApiMetrics], Backend]
    cls = getattr(importlib.import_module(module), name)
    return cls


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
