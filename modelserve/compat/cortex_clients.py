"""The clients a Cortex handler class is constructed with: its models, loaded once at start.

``tensorflow_client`` / ``onnx_client`` (`ModelClient`) run one of the API's models with the input rules of a
model API; ``python_client`` / ``model_client`` (`PythonClient`) hand out what the class's own
``load_model(model_path)`` returned for each model. `modelserve.compat.cortex_backend` builds them.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelserve import runtimes
from modelserve.errors import BadRequest, LoadError
from modelserve.project import describe_error
from modelserve.runtimes._model import LoadedModel
from modelserve.runtimes._tensors import InputConverter

if TYPE_CHECKING:
    from modelserve.config import ModelFileConfig


def load_model(root: Path, config: ModelFileConfig, api_name: str) -> tuple[LoadedModel, InputConverter]:
    adapter = runtimes.adapter(config.format)
    try:
        model: LoadedModel = adapter.load(root / config.path, config)
        converter = InputConverter(model.inputs)
    except LoadError as exc:
        raise LoadError(f"api '{api_name}': {exc}") from exc
    except TypeError as exc:
        raise LoadError(f"api '{api_name}': {config.path}: {exc}") from None
    return model, converter


class ModelClient:
    """Cortex's ``tensorflow_client`` / ``onnx_client``: ``predict(model_input, model_name=None,
    model_version="latest")`` on one of the API's models.

    ``model_input`` is converted with the rules of a model API (a value of lower rank is reshaped to the input's
    shape, unknown dimensions as 1); what does not fit is a 400. The result is Cortex's: for ONNX the list of
    output arrays, for TensorFlow a dict from output name to a flat list of values.
    """

    def __init__(self, models: dict[str, tuple[LoadedModel, InputConverter]]) -> None:
        self._models = models

    def predict(self, model_input: Any, model_name: str | None = None, model_version: str = "latest") -> Any:
        model, converter = self._pick(model_name)
        prediction = model.run(converter(model_input))
        return model.for_hook(prediction)

    def _pick(self, model_name: str | None) -> tuple[LoadedModel, InputConverter]:
        if "" in self._models:
            return self._models[""]
        if model_name is None:
            raise BadRequest(f"model_name was not specified; choose one of {sorted(self._models)}")
        try:
            return self._models[model_name]
        except KeyError:
            raise BadRequest(f"model {model_name!r} not found; the models are {sorted(self._models)}") from None

    def get_model(self, model_name: str | None = None, model_version: str = "latest") -> Any:
        """The runtime's own model object (an onnxruntime session, a loaded SavedModel)."""
        model, _ = self._pick(model_name)
        return getattr(model, "session", None) or getattr(model, "loaded", None)

    def close(self) -> None:
        for model, _ in self._models.values():
            model.close()


class PythonClient:
    """Cortex's ``python_client`` / ``model_client``: ``get_model(model_name=None, model_version="latest")``
    returns what the handler's ``load_model(model_path)`` returned for that model, loaded once at start."""

    def __init__(self, paths: dict[str, str]) -> None:
        self._paths = paths
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    def load_all(self, load_model: Any, label: str) -> None:
        for name, path in self._paths.items():
            try:
                self._loaded[name] = load_model(_version_folder(path))
            except Exception as exc:
                raise LoadError(f"{label}: load_model({path!r}) raised {describe_error(exc)}") from exc

    def get_model(self, model_name: str | None = None, model_version: str = "latest") -> Any:
        if "" in self._loaded:
            return self._loaded[""]
        if model_name is None:
            raise BadRequest(f"model_name was not specified; choose one of {sorted(self._loaded)}")
        with self._lock:
            try:
                return self._loaded[model_name]
            except KeyError:
                raise BadRequest(f"model {model_name!r} not found; the models are {sorted(self._loaded)}") from None


def _version_folder(path: str) -> str:
    """Cortex gave load_model the folder of the model's highest version (``model/1/``) when there were
    numbered versions, else the model's folder."""
    folder = Path(path)
    if folder.is_dir():
        versions = [child for child in folder.iterdir() if child.is_dir() and child.name.isdigit()]
        if versions:
            return str(max(versions, key=lambda child: int(child.name)))
    return path
