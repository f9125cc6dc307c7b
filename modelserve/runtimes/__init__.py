"""Model runtimes: one adapter module per model format, imported only when a project needs it.

``onnx`` (onnxruntime) and ``tensorflow`` (a SavedModel) are the formats. Each adapter module offers
``load(path, config) -> LoadedModel`` (see `modelserve.runtimes._model`); it imports its runtime package
at its top, so that importing ``modelserve.runtimes.onnx`` imports onnxruntime and nothing else: serving an
ONNX model never imports TensorFlow.

`check_installed` is cheap (it finds the package without importing it) and runs when the app is created;
`adapter` imports the adapter and its runtime, which for TensorFlow takes seconds, so backends call it
while loading::

    check_installed("onnx")                      # MissingExtraError with the pip command, or nothing
    model = adapter("onnx").load(path, config)   # a LoadedModel
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

from modelserve.errors import LoadError, MissingExtraError, install_hint


@dataclass(frozen=True)
class Runtime:
    """A model format: the adapter module that serves it, the package it needs and the extra that adds it."""

    module: str
    package: str
    extra: str


RUNTIMES: dict[str, Runtime] = {
    "onnx": Runtime("modelserve.runtimes.onnx", "onnxruntime", "onnx"),
    "tensorflow": Runtime("modelserve.runtimes.tensorflow", "tensorflow", "tensorflow"),
}


def runtime(fmt: str) -> Runtime:
    try:
        return RUNTIMES[fmt]
    except KeyError:
        known = ", ".join(sorted(RUNTIMES))
        raise LoadError(f"unknown model format {fmt!r} (known formats: {known})") from None


def check_installed(fmt: str) -> None:
    """Raise `MissingExtraError` when the package of a format is not installed (does not import it)."""
    info = runtime(fmt)
    try:
        found = importlib.util.find_spec(info.package) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise MissingExtraError(info.package, info.extra)


def adapter(fmt: str) -> ModuleType:
    """Import the adapter module of a format (and so its runtime package)."""
    info = runtime(fmt)
    try:
        return importlib.import_module(info.module)
    except ImportError as exc:
        if exc.name == info.package:
            raise MissingExtraError(info.package, info.extra) from exc
        raise LoadError(
            f"importing {info.package} failed ({type(exc).__name__}: {exc}); "
            f"reinstall it with: {install_hint(info.extra, reinstall=True)}"
        ) from exc
