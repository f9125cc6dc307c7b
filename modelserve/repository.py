"""The model repository of a server: the versions of its versioned APIs, and loading and unloading APIs while
it serves.

A model API whose path is a folder of numbered versions (`modelserve.versions`) is served as one `Api` per
version its policy selects, each built from the API's configuration with the model path of its version
(`version_configs`): its own backend, line and limits, the same name and metrics. ``server.apis[name]`` is
the version that unversioned calls reach, the highest ready one (`Versions.current`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from modelserve.api import Api
from modelserve.config import ApiConfig
from modelserve.errors import LoadError
from modelserve.versions import model_in, version_folders


def version_configs(config: ApiConfig, root: Path) -> dict[int, ApiConfig]:
    """Each served version of a versioned model API as a configuration of its own, by version number; empty
    for any other API. The folders are listed again now (the project may have gained one)."""
    model = config.model
    if model is None or model.version_policy is None:
        return {}
    folders = version_folders(root / model.path)
    configs = {}
    for number in model.version_policy.select(list(folders)):
        found = model_in(folders[number])
        if found is None:
            raise LoadError(
                f"api '{config.name}': {model.path}/{number} holds no model (a model.onnx, one .onnx file or a "
                "SavedModel)"
            )
        path = Path(model.path, str(number)) if found == folders[number] else Path(model.path, str(number), found.name)
        configs[number] = replace(config, model=replace(model, path=str(path)))
    return configs


class Versions:
    """The served versions of one API, by number."""

    def __init__(self, name: str, apis: dict[int, Api]) -> None:
        self.name = name
        self.apis = apis

    def current_number(self) -> int:
        """The highest ready version, or the highest one while none is ready (it answers 503 meanwhile)."""
        ready = [number for number, api in self.apis.items() if api.ready]
        return max(ready or self.apis)

    def current(self) -> Api:
        return self.apis[self.current_number()]

    def numbers(self) -> list[str]:
        return [str(number) for number in sorted(self.apis)]
