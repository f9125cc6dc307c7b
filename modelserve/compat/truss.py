"""Truss folders, served as they are: ``config.yaml`` + ``model/model.py`` (+ ``data/``, ``packages/``).

`load_truss_project` turns a Truss folder into a one-API `ProjectConfig` (``detect`` and ``load``: the entry of
`modelserve.config.LAYOUTS`); `apply_truss` gives the same settings (`read_truss_config`) to an API of
modelserve.yaml that says ``truss: config.yaml``. What each key of config.yaml becomes:

* ``model_name``: the API's name, made a URL segment (``basic truss`` is served at ``/basic-truss``, and at
  ``/`` as every single-API project); none: ``model``;
* ``model_module_dir`` / ``model_class_filename`` / ``model_class_name``: the class served (default
  ``model/model.py``, ``Model``);
* ``runtime.predict_concurrency``: ``max_concurrency``;
* ``environment_variables``: set before the model is imported (variables already set, or in ``.env``, win);
* ``bundled_packages_dir`` (default ``packages``) and ``external_package_dirs``: put on ``sys.path``;
* ``data_dir`` (default ``data``) and ``secrets``: the constructor's ``data_dir`` and ``secrets``;
* the whole file (with Truss's defaults for the keys above) is the constructor's ``config``;
* a client's disconnect notifies running async code (``on_disconnect: notify``) rather than cancelling it.

Keys that only matter to Truss's build and platform (``resources``, ``requirements``, ``base_image``...) are
accepted and listed in one log line as not applied here.
"""

from __future__ import annotations

import copy
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from modelserve.config import (
    RESERVED_NAMES,
    ApiConfig,
    HandlerConfig,
    ProjectConfig,
    _Problems,
    _string,
    outside_project,
    yaml_error,
)
from modelserve.errors import ConfigError

logger = logging.getLogger("modelserve")

TRUSS_CONFIG = "config.yaml"
DEFAULT_API_NAME = "model"

#: Truss's defaults for the keys modelserve reads (truss/base/truss_config.py).
DEFAULTS: dict[str, Any] = {
    "model_name": None,
    "model_metadata": {},
    "model_module_dir": "model",
    "model_class_filename": "model.py",
    "model_class_name": "Model",
    "bundled_packages_dir": "packages",
    "external_package_dirs": [],
    "data_dir": "data",
    "environment_variables": {},
    "secrets": {},
    "runtime": {"predict_concurrency": 1},
}
#: Keys that describe the model and need nothing from the server.
_DESCRIPTIVE = {"description", "examples_filename", "input_type", "model_framework", "model_type", "spec_version"}
#: runtime.* keys that modelserve applies.
_RUNTIME_APPLIED = {"predict_concurrency"}
_NAME_CHARS = re.compile(r"[^a-z0-9_.]+")


@dataclass
class TrussSettings:
    """What a Truss config.yaml asks of modelserve."""

    path: Path
    #: The whole file, with Truss's defaults for the keys modelserve reads: the constructor's ``config``.
    config: dict[str, Any]
    name: str
    handler_path: str
    class_name: str
    max_concurrency: int
    data_dir: str
    secrets: dict[str, str | None]
    env: dict[str, str]
    python_path: list[str]
    #: Keys (``runtime.x`` for runtime's) accepted but not applied here.
    not_applied: list[str] = field(default_factory=list)


def api_name(model_name: Any) -> str:
    """A URL segment from Truss's ``model_name``: ``"Test Async"`` -> ``test-async``; none, or the name of one of
    the server's own routes (``docs``, ``v2``...: `RESERVED_NAMES`) -> ``model``."""
    if not isinstance(model_name, str):
        return DEFAULT_API_NAME
    name = _NAME_CHARS.sub("-", model_name.strip().lower()).strip("-_.")[:64].rstrip("-_.")
    if not name or name in RESERVED_NAMES:
        return DEFAULT_API_NAME
    return name


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def read_truss_config(root: Path, relative_path: str = TRUSS_CONFIG) -> TrussSettings:
    """Read and check a Truss config.yaml; every problem is reported in one `ConfigError`."""
    path = (root / relative_path).resolve()
    truss_dir = path.parent

    def in_project(relative: str) -> str:
        """A path of config.yaml (relative to its folder) as the project sees it (relative to the project)."""
        return os.path.relpath(truss_dir / relative, root).replace(os.sep, "/")

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the Truss config: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise yaml_error(path, exc) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a Truss config: expected a mapping, got {type(data).__name__}")
    problems: list[str] = []

    def string(key: str) -> str:
        value = data.get(key)
        if value is None:
            return str(DEFAULTS[key])
        if not isinstance(value, str) or not value:
            problems.append(f"key '{key}': expected a non-empty string, got {value!r}")
            return str(DEFAULTS[key])
        return value

    def mapping(key: str) -> dict[str, Any]:
        value = data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            problems.append(f"key '{key}': expected a mapping, got {value!r}")
            return {}
        return value

    module_dir = string("model_module_dir")
    filename = string("model_class_filename")
    class_name = string("model_class_name")
    handler_path = in_project(f"{module_dir.rstrip('/')}/{filename}")
    outside = outside_project(root, handler_path)
    if outside is not None:
        problems.append(
            f"the model class file {handler_path!r} leads to {str(outside)!r}, outside the project folder; "
            "user code must be in the project"
        )
    elif not (root / handler_path).is_file():
        if data.get("docker_server") is not None:
            problems.append(
                "key 'docker_server': this Truss runs its own server image, which modelserve cannot run; "
                "modelserve serves Truss folders with a Model class"
            )
        else:
            problems.append(f"the model class file {handler_path!r} was not found in {root}")

    runtime = mapping("runtime")
    concurrency = runtime.get("predict_concurrency", 1)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        problems.append(f"key 'runtime.predict_concurrency': expected a positive integer, got {concurrency!r}")
        concurrency = 1

    env = {str(key): _text(value) for key, value in mapping("environment_variables").items() if value is not None}
    secrets = {str(key): (None if value is None else str(value)) for key, value in mapping("secrets").items()}

    python_path = []
    packages = in_project(string("bundled_packages_dir"))
    if (root / packages).is_dir():
        python_path.append(packages)
    external = data.get("external_package_dirs") or []
    if not isinstance(external, list) or not all(isinstance(item, str) and item for item in external):
        problems.append(f"key 'external_package_dirs': expected a list of folders, got {external!r}")
        external = []
    for folder in external:
        if not (truss_dir / folder).is_dir():
            problems.append(f"key 'external_package_dirs': folder {folder!r} not found (relative to {truss_dir})")
        else:
            python_path.append(in_project(folder))
    data_dir = in_project(string("data_dir"))

    if problems:
        listing = "\n  - ".join(problems)
        raise ConfigError(f"{path} is not a Truss config modelserve can serve:\n  - {listing}")

    config = {**copy.deepcopy(DEFAULTS), **data}
    config["runtime"] = {**DEFAULTS["runtime"], **runtime}
    applied = set(DEFAULTS) | _DESCRIPTIVE
    not_applied = [key for key in data if key not in applied]
    not_applied += [f"runtime.{key}" for key in runtime if key not in _RUNTIME_APPLIED]
    return TrussSettings(
        path=path,
        config=config,
        name=api_name(data.get("model_name")),
        handler_path=handler_path,
        class_name=class_name,
        max_concurrency=concurrency,
        data_dir=data_dir,
        secrets=secrets,
        env=env,
        python_path=python_path,
        not_applied=not_applied,
    )


def log_not_applied(settings: TrussSettings) -> None:
    if settings.not_applied:
        logger.info(
            "%s: keys for Truss's build and platform, not applied by modelserve: %s",
            settings.path,
            ", ".join(settings.not_applied),
        )


def load_truss_project(root: Path) -> ProjectConfig:
    """The `ProjectConfig` of a Truss folder: one realtime API serving its Model class."""
    settings = read_truss_config(root)
    log_not_applied(settings)
    api = ApiConfig(
        name=settings.name,
        handler=HandlerConfig(path=settings.handler_path, class_name=settings.class_name, config=settings.config),
        max_concurrency=settings.max_concurrency,
        data_dir=settings.data_dir,
        secrets=settings.secrets,
        truss=TRUSS_CONFIG,
        env=settings.env,
        python_path=settings.python_path,
        # Truss's documented cancellation pattern polls `await request.is_disconnected()` in its own code
        on_disconnect="notify",
    )
    return ProjectConfig(root=root, apis=[api])


def apply_truss(api: ApiConfig, raw: dict[str, Any], where: str, root: Path, problems: _Problems) -> None:
    """``truss: config.yaml`` in an API of modelserve.yaml: the API gets what a Truss folder would (config,
    data_dir, secrets, packages); problems are added to the file's."""
    path = problems.take(raw, "truss", _string, where)
    if path is None:
        return
    try:
        settings = read_truss_config(root, path)
    except ConfigError as exc:
        problems.add(where, f"key 'truss': {exc}")
        return
    log_not_applied(settings)
    api.truss = path
    if api.handler is None and "model" not in raw and "handler" not in raw:
        api.handler = HandlerConfig(path=settings.handler_path, class_name=settings.class_name)
    if api.handler is not None:
        if api.handler.config:
            problems.add(where, "give 'handler.config' or 'truss', not both ('truss' gives the whole config.yaml)")
        api.handler.config = settings.config
    if "max_concurrency" not in raw:
        api.max_concurrency = settings.max_concurrency
    api.data_dir, api.secrets = settings.data_dir, settings.secrets
    api.env, api.python_path = settings.env, settings.python_path


def detect(root: Path) -> bool:
    """Whether a folder is a Truss: a config.yaml naming its own model folder or server image, or beside a
    ``model/`` folder. Not when that folder lacks the Truss's model file while a ``model.py`` stands beside
    it: that is a project served as a lone model.py, whose ``model/`` holds weights and whose config.yaml is
    its own (a Truss missing its model file, with no model.py beside, is still one, and told what it lacks)."""
    config = root / TRUSS_CONFIG
    if not config.is_file():
        return False
    data = _read_config(config)
    if "model_module_dir" in data or "docker_server" in data:
        return True
    if not (root / "model").is_dir():
        return False
    filename = data.get("model_class_filename")
    model_file = root / "model" / (filename if isinstance(filename, str) and filename else "model.py")
    return model_file.is_file() or not (root / "model.py").is_file()


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def load(root: Path) -> ProjectConfig:
    return load_truss_project(root)
