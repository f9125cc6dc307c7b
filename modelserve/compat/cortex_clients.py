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
    returns what the handler's ``load_model(model_path)`` returned for that model and version.

    A model folder of numbered versions (``linreg/1/``, ``linreg/2/``) is served as Cortex did: ``"latest"`` is
    the highest version, loaded at start; another version (``model_version="1"``) is loaded by ``load_model`` the
    first time it is asked for and kept. A version that is not there is a 400 naming those that are."""

    def __init__(self, paths: dict[str, str]) -> None:
        self._paths = paths
        self._loaded: dict[str, Any] = {}
        self._versions: dict[tuple[str, str], Any] = {}
        self._load_model: Any = None
        self._label = ""
        self._lock = threading.Lock()

    def load_all(self, load_model: Any, label: str) -> None:
        self._load_model, self._label = load_model, label
        for name, path in self._paths.items():
            self._loaded[name] = self._load(_version_folder(path), path)

    def _load(self, folder: str, path: str) -> Any:
        try:
            return self._load_model(folder)
        except Exception as exc:
            raise LoadError(f"{self._label}: load_model({path!r}) raised {describe_error(exc)}") from exc

    def get_model(self, model_name: str | None = None, model_version: str = "latest") -> Any:
        if "" in self._loaded:
            model_name = ""
        elif model_name is None:
            raise BadRequest(f"model_name was not specified; choose one of {sorted(self._loaded)}")
        with self._lock:
            try:
                latest = self._loaded[model_name]
            except KeyError:
                raise BadRequest(f"model {model_name!r} not found; the models are {sorted(self._loaded)}") from None
            if str(model_version) == "latest":
                return latest
            return self._version(model_name, str(model_version))

    def _version(self, model_name: str, version: str) -> Any:
        """A numbered version of a model, loaded once (called under the lock)."""
        key = (model_name, version)
        if key not in self._versions:
            versions = _versions(self._paths[model_name])
            if version not in versions:
                shown = f"{model_name!r}" if model_name else "the model"
                have = ", ".join(sorted(versions, key=int)) or "none (its folder has no numbered versions)"
                raise BadRequest(f"version {version!r} of {shown} not found; its versions are {have}")
            self._versions[key] = self._load(versions[version], self._paths[model_name])
        return self._versions[key]


def _versions(path: str) -> dict[str, str]:
    """The numbered version folders of a model folder, by version."""
    folder = Path(path)
    if not folder.is_dir():
        return {}
    return {str(int(child.name)): str(child) for child in folder.iterdir() if child.is_dir() and child.name.isdigit()}


def _version_folder(path: str) -> str:
    """Cortex gave load_model the folder of the model's highest version (``model/1/``) when there were
    numbered versions, else the model's folder."""
    versions = _versions(path)
    if versions:
        return versions[max(versions, key=int)]
    return path
