"""Cortex projects: a folder with ``cortex.yaml`` (or ``cortex.yml``), served as it is.

Three layouts of Cortex's API file are read:

* Cortex 0.11: ``kind: api`` with an ``onnx:`` or ``tensorflow:`` block (``model``, ``request_handler``,
  ``signature_key``, ``metadata``), served as a model API with the module-level pre_inference and
  post_inference hooks; or a ``predictor:`` (or ``python:``) block with module-level ``init(model_path,
  metadata)`` and ``predict(sample, metadata)``. ``kind: deployment`` only names the deployment.
* Cortex 0.19-0.35: ``kind: RealtimeAPI`` (``SyncAPI`` in 0.19) or ``kind: AsyncAPI`` with a ``predictor:``
  (0.19-0.31) or ``handler:`` (0.32-0.35) block: ``type`` python, tensorflow or onnx, ``path`` to the class,
  ``config``, and the models of its client (``model_path``, ``models``, ``multi_model_reloading``); a python
  handler's ``server_side_batching`` (0.25-0.35) becomes the API's batching.

Model paths must be local (relative to the project folder, or absolute): an ``s3://`` or ``gs://`` path is a
`ConfigError` that says to download the model. Keys that only matter to a Cortex cluster (``compute``,
``autoscaling``, ``networking``, ...) are accepted and listed once in the log as not applied here.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import yaml

from modelserve.config import (
    _NAME_RE,
    RESERVED_NAMES,
    ApiConfig,
    BatchingConfig,
    CortexConfig,
    HandlerConfig,
    ModelFileConfig,
    ProjectConfig,
    _Problems,
    escapes_project,
    outside_project,
    yaml_error,
)
from modelserve.errors import ConfigError

logger = logging.getLogger("modelserve")

#: Cortex's kinds of API and modelserve's kind for each.
KINDS = {"RealtimeAPI": "realtime", "SyncAPI": "realtime", "AsyncAPI": "async", "api": "realtime"}
#: Cortex's kinds of API that modelserve does not serve, and what to do instead (said in the config error).
UNSUPPORTED_KINDS = {
    "BatchAPI": "modelserve has no batch jobs: run the items through the handler with a script of your own, or "
    "serve it as kind: AsyncAPI (handle_async) and submit each batch as one job",
    "TaskAPI": "modelserve runs no tasks: run the definition's script yourself (python <definition.path>)",
    "TrafficSplitter": "modelserve does not split traffic: remove this entry and call each of its APIs at its own "
    "route (POST /<name>)",
}
HANDLER_TYPES = ("python", "tensorflow", "onnx")
REMOTE_PREFIXES = ("s3://", "gs://")

#: API keys that configure a Cortex cluster, not the server: accepted and listed as not applied.
CLUSTER_KEYS = frozenset(
    {
        "compute",
        "autoscaling",
        "networking",
        "update_strategy",
        "pod",
        "node_groups",
        "monitoring",
        "tracker",
        "endpoint",
        "shadow",
    }
)
#: Handler keys that configure Cortex's containers: accepted and listed as not applied.
CONTAINER_KEYS = frozenset(
    {
        "image",
        "tensorflow_serving_image",
        "processes_per_replica",
        "log_level",
        "shm_size",
        "dependencies",
        "shell",
        "cache_size",
        "disk_cache_size",
    }
)


#: The names of Cortex's API file, in the order looked for.
API_FILES = ("cortex.yaml", "cortex.yml")


def detect(root: Path) -> bool:
    """Whether a folder is a Cortex project (the entry of `modelserve.config.LAYOUTS`)."""
    return any((root / name).is_file() for name in API_FILES)


def load(root: Path) -> ProjectConfig:
    path = next(root / name for name in API_FILES if (root / name).is_file())
    return load_cortex_project(root, path)


def load_cortex_project(root: Path, path: Path) -> ProjectConfig:
    """Read a cortex.yaml into modelserve's `ProjectConfig`; every problem is reported in one `ConfigError`."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise yaml_error(path, exc) from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{path} is not valid: expected a list of APIs (- name: ..., kind: RealtimeAPI)")
    reader = _Reader(root, path)
    apis = [api for index, raw in enumerate(data) if (api := reader.api(raw, index)) is not None]
    if not apis and not reader.problems.items:
        reader.problems.add("top level", "no API found (kind: RealtimeAPI, AsyncAPI or api)")
    seen: set[str] = set()
    for api in apis:
        if api.name in seen:
            reader.problems.add(f"api '{api.name}'", "two APIs have this name")
        seen.add(api.name)
    reader.problems.raise_if_any()
    if reader.not_applied:
        logger.info(
            "%s: keys for a Cortex cluster, accepted but not applied here: %s",
            path.name,
            "; ".join(reader.not_applied),
        )
    return ProjectConfig(root=root, apis=apis)


class _Reader:
    def __init__(self, root: Path, path: Path) -> None:
        self.root = root
        self.problems = _Problems(str(path))
        self.not_applied: list[str] = []

    def api(self, raw: Any, index: int) -> ApiConfig | None:
        if not isinstance(raw, dict):
            self.problems.add(f"item #{index + 1}", f"expected a mapping, got {type(raw).__name__}")
            return None
        kind = raw.get("kind", "RealtimeAPI")
        name = raw.get("name")
        where = f"api '{name}'" if isinstance(name, str) else f"item #{index + 1}"
        if kind == "deployment":  # Cortex 0.11: names the deployment, which prefixed the endpoints
            self.not_applied.append(f"{where}: kind: deployment")
            return None
        if kind in UNSUPPORTED_KINDS:
            self.problems.add(
                where,
                f"kind {kind} is not served by modelserve (RealtimeAPI, AsyncAPI or api are): "
                f"{UNSUPPORTED_KINDS[kind]}",
            )
            return None
        if "pod" in raw and not any(key in raw for key in _READ_KEYS - {"name", "kind"}):
            # Cortex 0.36+: the API is a container image (pod: containers:), with no handler code to load
            self.problems.add(
                where,
                "key 'pod': this is a Cortex 0.36+ API, which runs its own container image (pod.containers); "
                "modelserve serves handler code (0.11-0.35's handler: or predictor:), not images: run the image "
                "itself (docker run -p 8080:8080 <image>)",
            )
            return None
        if kind not in KINDS:
            known = ", ".join(sorted(KINDS))
            self.problems.add(where, f"key 'kind': expected one of {known}, got {kind!r}")
            return None
        if not isinstance(name, str) or not _NAME_RE.match(name):
            self.problems.add(
                where, f"key 'name': expected a URL segment (letters, digits, '-', '_', '.'), got {name!r}"
            )
            return None
        if name in RESERVED_NAMES:
            self.problems.add(where, f"key 'name': {name!r} is reserved for the server's own routes")
            return None
        skipped = sorted(key for key in raw if key in CLUSTER_KEYS)
        if kind == "api":
            api = self._old_api(raw, name, where)
        else:
            api = self._handler_api(raw, name, where, KINDS[kind])
        unknown = sorted(key for key in raw if key not in CLUSTER_KEYS and key not in _READ_KEYS)
        if unknown:
            self.not_applied.append(f"{where}: unknown keys {', '.join(unknown)} (ignored)")
        if skipped:
            self.not_applied.append(f"{where}: {', '.join(skipped)}")
        return api

    # ---------------------------------------------------------------------------------------------------
    # Cortex 0.11: kind: api

    def _old_api(self, raw: dict[str, Any], name: str, where: str) -> ApiConfig | None:
        blocks = [key for key in ("onnx", "tensorflow", "predictor", "python") if key in raw]
        if len(blocks) != 1:
            self.problems.add(where, "kind: api needs one of the blocks onnx:, tensorflow:, predictor: (or python:)")
            return None
        block_name = blocks[0]
        block = raw[block_name]
        where = f"{where}, {block_name}"
        if not isinstance(block, dict):
            self.problems.add(where, f"expected a mapping, got {type(block).__name__}")
            return None
        metadata = block.get("metadata") or {}
        if not isinstance(metadata, dict):
            self.problems.add(where, "key 'metadata': expected a mapping")
            metadata = {}
        self._container_keys(block, where)
        self._unknown_keys(block, _OLD_BLOCK_KEYS[block_name], where)
        api = ApiConfig(name=name)
        if block_name in ("onnx", "tensorflow"):
            model = self._model(block.get("model"), block_name, where, "model", block.get("signature_key"))
            if model is None:
                return None
            api.model = model
            if "python_path" in block:  # hook files are imported with the project folder on sys.path only
                self.not_applied.append(f"{where}: python_path")
            hooks = block.get("request_handler")
            if hooks is not None and self._file(hooks, where, "request_handler"):
                api.handler = HandlerConfig(path=hooks, config=metadata)
            return api
        path = block.get("path")
        if not self._file(path, where, "path"):
            return None
        models: dict[str, ModelFileConfig] = {}
        if block.get("model") is not None:
            model = self._model(block["model"], "python", where, "model", None)
            if model is None:
                return None
            models[""] = model
        api.handler = HandlerConfig(path=path, config=metadata)
        api.cortex = CortexConfig(type="python", style="module", models=models)
        self._environment(api, block, where)
        return api

    # ---------------------------------------------------------------------------------------------------
    # Cortex 0.19-0.35: RealtimeAPI / AsyncAPI with a predictor: or handler: block

    def _handler_api(self, raw: dict[str, Any], name: str, where: str, kind: str) -> ApiConfig | None:
        block_name = "handler" if "handler" in raw else "predictor"
        block = raw.get(block_name)
        where = f"{where}, {block_name}"
        if not isinstance(block, dict):
            self.problems.add(where, "a 'handler:' (or 'predictor:') mapping is required")
            return None
        handler_type = block.get("type", "python")
        if handler_type not in HANDLER_TYPES:
            self.problems.add(where, f"key 'type': expected python, tensorflow or onnx, got {handler_type!r}")
            return None
        path = block.get("path")
        if not self._file(path, where, "path"):
            return None
        config = block.get("config") or {}
        if not isinstance(config, dict):
            self.problems.add(where, "key 'config': expected a mapping")
            config = {}
        if "protobuf_path" in block:  # Cortex 0.34-0.35: a gRPC API, whose class has the service's RPC methods
            self.problems.add(
                where,
                "key 'protobuf_path': a Cortex gRPC API is not served by modelserve (its Cortex APIs are HTTP); "
                "remove protobuf_path and give the class a handle_post(payload) to serve it over HTTP",
            )
            return None
        self._container_keys(block, where)
        self._unknown_keys(block, _HANDLER_KEYS, where)
        models = self._models(block, handler_type, where)
        if models is None:
            return None
        if handler_type != "python" and not models:
            self.problems.add(where, f"a {handler_type} handler needs its models (models: path: ...)")
            return None
        api = ApiConfig(name=name, kind=kind)
        api.handler = HandlerConfig(path=path, config=config)
        api.cortex = CortexConfig(type=handler_type, style="class", models=models)
        self._environment(api, block, where)
        threads = block.get("threads_per_process")
        if threads is not None:
            if isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1:
                api.max_concurrency = threads
            else:
                self.problems.add(where, f"key 'threads_per_process': expected a positive integer, got {threads!r}")
        batching = block.get("server_side_batching")
        if batching is not None:
            if handler_type == "python" and kind == "realtime":
                api.batching = self._batching(batching, where)
            elif kind != "realtime":  # Cortex batched a RealtimeAPI's requests only
                self.not_applied.append(f"{where}: server_side_batching (an AsyncAPI)")
            else:  # TensorFlow Serving batched a tensorflow handler's model calls itself
                self.not_applied.append(f"{where}: server_side_batching ({handler_type} handler)")
        return api

    def _batching(self, raw: Any, where: str) -> BatchingConfig | None:
        """Cortex 0.25-0.35's ``server_side_batching`` of a python handler: ``max_batch_size`` payloads at most,
        waiting at most ``batch_interval`` (a Go duration: ``0.1s``, ``100ms``) after the first."""
        where = f"{where}, server_side_batching"
        if not isinstance(raw, dict):
            self.problems.add(where, f"expected a mapping (max_batch_size, batch_interval), got {raw!r}")
            return None
        size = raw.get("max_batch_size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            self.problems.add(where, f"key 'max_batch_size': expected a positive integer, got {size!r}")
            return None
        given = raw.get("batch_interval")
        interval = parse_duration(given)
        if interval is None or interval <= 0:
            self.problems.add(where, f"key 'batch_interval': expected a duration above 0 (0.1s, 100ms), got {given!r}")
            return None
        return BatchingConfig(max_batch_size=size, max_wait_ms=interval * 1000)

    def _models(self, block: dict[str, Any], handler_type: str, where: str) -> dict[str, ModelFileConfig] | None:
        """The models of a handler's client, by name ("" for a lone model)."""
        fmt = handler_type
        default_key = block.get("signature_key")
        models: dict[str, ModelFileConfig] = {}
        ok = True

        def add(name: str, raw_path: Any, key_name: str, signature_key: Any) -> None:
            nonlocal ok
            model = self._model(raw_path, fmt, where, key_name, signature_key or default_key)
            if model is None:
                ok = False
            else:
                models[name] = model

        if block.get("model_path") is not None:  # 0.19-0.2x: one model
            add("", block["model_path"], "model_path", None)
        for key in ("models", "multi_model_reloading"):
            section = block.get(key)
            if section is None:
                continue
            if isinstance(section, list):  # 0.19: models: [{name, model_path, signature_key}]
                section = {"paths": section}
            if not isinstance(section, dict):
                self.problems.add(where, f"key '{key}': expected a mapping")
                return None
            self._unknown_keys(section, _MODELS_KEYS, f"{where}, {key}")
            default_key = section.get("signature_key", default_key)
            if section.get("path") is not None:
                add("", section["path"], f"{key}.path", None)
            for item in section.get("paths") or []:
                if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                    self.problems.add(where, f"key '{key}.paths': each model needs a name and a path")
                    ok = False
                    continue
                add(item["name"], item.get("path", item.get("model_path")), f"{key}.paths", item.get("signature_key"))
            if section.get("dir") is not None:
                folder = self._local(section["dir"], where, f"{key}.dir")
                if folder is None:
                    ok = False
                else:
                    for child in sorted((self.root / folder).iterdir()):
                        if child.is_dir() or child.suffix == ".onnx":
                            add(child.stem if child.is_file() else child.name, str(child), f"{key}.dir", None)
            for extra in sorted(set(section) & {"cache_size", "disk_cache_size"}):
                self.not_applied.append(f"{where}: {key}.{extra}")
        return models if ok else None

    # ---------------------------------------------------------------------------------------------------
    # paths

    def _file(self, path: Any, where: str, key: str) -> bool:
        if not isinstance(path, str) or not path:
            self.problems.add(where, f"key '{key}' is required (a Python file in the project)")
            return False
        outside = outside_project(self.root, path)
        if outside is not None:
            self.problems.add(
                where,
                f"key '{key}': {path!r} leads to {str(outside)!r}, outside the project folder; user code must be "
                "in the project",
            )
            return False
        if not (self.root / path).is_file():
            self.problems.add(where, f"key '{key}': file {path!r} not found in {self.root}")
            return False
        return True

    def _local(self, raw: Any, where: str, key: str) -> str | None:
        if not isinstance(raw, str) or not raw:
            self.problems.add(where, f"key '{key}': expected a path, got {raw!r}")
            return None
        if raw.startswith(REMOTE_PREFIXES):
            self.problems.add(
                where,
                f"key '{key}': {raw!r} is in cloud storage, which modelserve does not download from; download "
                "the model (for instance `aws s3 cp --recursive` or `gsutil cp -r`) and give its local path, "
                "relative to the folder of cortex.yaml",
            )
            return None
        if escapes_project(raw):
            self.problems.add(
                where, f"key '{key}': {raw!r} leaves the project folder; a model elsewhere needs an absolute path"
            )
            return None
        if not (self.root / raw).exists():
            self.problems.add(where, f"key '{key}': {raw!r} not found in {self.root}")
            return None
        return raw

    def _model(self, raw: Any, fmt: str, where: str, key: str, signature_key: Any) -> ModelFileConfig | None:
        path = self._local(raw, where, key)
        if path is None:
            return None
        resolved = _model_path(self.root / path, fmt)
        if resolved is None:
            expected = "an .onnx file" if fmt == "onnx" else "a SavedModel folder (saved_model.pb)"
            self.problems.add(where, f"key '{key}': no {expected} found in {path!r}")
            return None
        model = ModelFileConfig(path=str(resolved), format=fmt)
        if isinstance(signature_key, str) and signature_key:
            model.signature_key = signature_key
        return model

    def _container_keys(self, block: dict[str, Any], where: str) -> None:
        skipped = sorted(key for key in block if key in CONTAINER_KEYS)
        if skipped:
            self.not_applied.append(f"{where}: {', '.join(skipped)}")

    def _unknown_keys(self, block: dict[str, Any], known: frozenset[str], where: str) -> None:
        """Keys of a block that no Cortex version had (a misspelt ``model_path``, say): listed as ignored, as
        unknown API keys are, rather than silently dropped."""
        unknown = sorted(str(key) for key in block if key not in known and key not in CONTAINER_KEYS)
        if unknown:
            self.not_applied.append(f"{where}: unknown keys {', '.join(unknown)} (ignored)")

    def _environment(self, api: ApiConfig, block: dict[str, Any], where: str) -> None:
        """``env`` is set before the handler is imported (variables already set win); ``python_path`` goes on
        sys.path (Cortex appended it to PYTHONPATH; the project folder is there already)."""
        env = block.get("env")
        if isinstance(env, dict):
            api.env = {str(name): str(value) for name, value in env.items()}
        elif env is not None:
            self.problems.add(where, "key 'env': expected a mapping of names to strings")
        python_path = block.get("python_path")
        if isinstance(python_path, str) and python_path:
            outside = outside_project(self.root, python_path)
            if outside is not None:  # its modules are user code, which must be in the project
                self.problems.add(
                    where, f"key 'python_path': {python_path!r} leads to {str(outside)!r}, outside the project folder"
                )
            elif (self.root / python_path).is_dir():
                api.python_path = [python_path]
            else:
                self.problems.add(where, f"key 'python_path': folder {python_path!r} not found in {self.root}")
        elif python_path is not None:
            self.problems.add(where, f"key 'python_path': expected a folder, got {python_path!r}")


#: The API keys this module reads.
_READ_KEYS = frozenset({"name", "kind", "handler", "predictor", "onnx", "tensorflow", "python"})
#: The keys of a 0.19-0.35 ``handler:`` / ``predictor:`` block this module reads (besides `CONTAINER_KEYS`).
_HANDLER_KEYS = frozenset(
    {
        "type",
        "path",
        "config",
        "env",
        "python_path",
        "threads_per_process",
        "server_side_batching",
        "model_path",
        "signature_key",
        "models",
        "multi_model_reloading",
    }
)
#: The keys of a ``models:`` / ``multi_model_reloading:`` section (``cache_size`` and ``disk_cache_size`` are
#: listed as not applied).
_MODELS_KEYS = frozenset({"path", "paths", "dir", "signature_key", "cache_size", "disk_cache_size"})
#: The keys of Cortex 0.11's blocks.
_OLD_MODEL_KEYS = frozenset({"model", "request_handler", "signature_key", "metadata", "python_path"})
_OLD_PREDICTOR_KEYS = frozenset({"path", "model", "metadata", "python_path", "env"})
_OLD_BLOCK_KEYS = {
    "onnx": _OLD_MODEL_KEYS,
    "tensorflow": _OLD_MODEL_KEYS,
    "predictor": _OLD_PREDICTOR_KEYS,
    "python": _OLD_PREDICTOR_KEYS,
}


def _model_path(path: Path, fmt: str) -> Path | None:
    """The model file or folder that a Cortex model path names.

    Cortex took a folder of numbered versions (``1/``, ``1568236430/``) and served the highest; ONNX models
    might be a folder holding one ``.onnx`` file. A python handler's model path is given as it is.
    """
    if fmt == "python":
        return path
    if fmt == "tensorflow" and (path / "saved_model.pb").is_file():
        return path
    if fmt == "onnx" and path.is_file():
        return path
    if not path.is_dir():
        return None
    versions = sorted((child for child in path.iterdir() if child.is_dir() and child.name.isdigit()), key=_version)
    for candidate in reversed(versions):
        found = _model_path(candidate, fmt)
        if found is not None:
            return found
    if fmt == "onnx":
        files = sorted(path.glob("*.onnx"))
        if files:
            return files[0]
    return None


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(raw: Any) -> float | None:
    """Seconds from a Go duration as Cortex read them (``0.1s``, ``100ms``, ``1m30s``); a bare number is
    seconds. None when it is neither."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, (int, float)):
        return float(raw)
    if not isinstance(raw, str) or not raw:
        return None
    seconds, position = 0.0, 0
    for match in _DURATION.finditer(raw):
        if match.start() != position:
            return None
        seconds += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    return seconds if position == len(raw) else None


def _version(path: Path) -> int:
    return int(path.name)
