"""modelserve.yaml: the configuration types and their validation.

Every problem in the file is collected and reported in one `ConfigError` that names the API, the key,
what was expected and what was found, so that a user fixes the whole file in one go.
"""

from __future__ import annotations

import importlib
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from modelserve.errors import ConfigError
from modelserve.jobs import STORE_CHOICES, store_kind
from modelserve.limiter import AUTO
from modelserve.versions import VersionPolicy, model_in, parse_policy, version_folders

CONFIG_FILE = "modelserve.yaml"
DEFAULT_MAX_BODY_SIZE = 10 * 1024 * 1024
DEFAULT_MAX_QUEUED_BYTES = 256 * 1024 * 1024
DEFAULT_RESULT_TTL = 7 * 24 * 3600.0
#: The environment variable that turns tracing on as ``--tracing`` does (the CLI sets it for its workers).
TRACING_ENV = "MODELSERVE_TRACING"
RESERVED_NAMES = frozenset({"healthz", "readyz", "metrics", "v2", "openapi.json", "openapi", "docs"})
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
MODEL_FORMATS = ("onnx", "tensorflow")
ON_DISCONNECT = ("cancel", "notify")
#: The wire protocols a project may serve (``protocols:``), each with the spec modules that make its routes
#: (`modelserve.http.specs`), in the order their routes enter the table: ``native`` is ``POST /<api>`` of the
#: realtime APIs (and of each version), the job routes of the async ones, OpenAI's paths of the APIs that ask
#: for them (``openai:``, or a Truss class's ``chat_completions``...), Truss's and SageMaker's routes of a
#: Truss API, and the WebSocket routes; ``v2`` the Open Inference Protocol (``/v2/...``). Adding a transport is
#: its module and one line here; a module is imported only when a project serves its protocol.
PROTOCOLS: dict[str, tuple[str, ...]] = {
    "native": (
        "modelserve.http.realtime",
        "modelserve.http.versions",
        "modelserve.http.jobs",
        "modelserve.http.openai",
        "modelserve.http.truss",
        "modelserve.http.websocket",
    ),
    "v2": ("modelserve.http.v2",),
}
#: What an API's ``openai:`` serves it as (`modelserve.http.openai`): ``/v1/chat/completions``,
#: ``/v1/completions`` or ``/v1/embeddings``, with the OpenAI envelope built around its predict.
OPENAI_KINDS = ("chat", "completions", "embeddings")
#: The methods a CORS policy may allow (Starlette's list); ``*`` allows them all.
CORS_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "QUERY")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ORIGIN_RE = re.compile(r"^[a-z][a-z0-9+.-]*://(\[[0-9a-f:.]+\]|[a-z0-9_.-]+)(:[0-9]{1,5})?$")
_TOKEN_RE = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

#: What serves an API, by kind (`ApiConfig.backend`): the import string of its `modelserve.backends.Backend`,
#: imported only when a project has such an API. Truss's Model-class contract and Cortex's handlers live in
#: `modelserve.compat`. Validation names these kinds, and `modelserve.backends.make_backend` builds from here.
BACKENDS: dict[str, str] = {
    "model_class": "modelserve.compat.truss_backend:TrussModelClassBackend",
    "handler_class": "modelserve.backends.handler_class:HandlerClassBackend",
    "model_file": "modelserve.backends.model_file:ModelFileBackend",
    "cortex_handler": "modelserve.compat.cortex_backend:CortexHandlerBackend",
}
#: Folders laid out for other model servers, served as they are when there is no modelserve.yaml: each
#: module offers ``detect(root) -> bool`` and ``load(root) -> ProjectConfig``, tried in this order.
LAYOUTS: dict[str, str] = {
    "truss": "modelserve.compat.truss",
    "cortex": "modelserve.compat.cortex",
}


def layout(name: str) -> ModuleType:
    """The module of a `LAYOUTS` entry (imported when a project needs it)."""
    return importlib.import_module(LAYOUTS[name])


@dataclass
class HandlerConfig:
    """Where the user's Python code lives: a file in the project and, for classes, the class name."""

    path: str | None = None
    class_name: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    #: A class given directly in Python (create_app(handler=...)); then `path` is None.
    obj: Any = None


@dataclass
class ModelFileConfig:
    """An ONNX file or a TensorFlow SavedModel served directly."""

    path: str
    format: str = "onnx"
    signature_key: str = "serving_default"
    #: Execution providers in order of preference: names, or ``{name: {option: value}}`` (``device_id`` is
    #: filled in from the API's device when not given).
    providers: list[str | dict[str, dict[str, Any]]] = field(default_factory=lambda: ["CPUExecutionProvider"])
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    #: TensorFlow: the GPU memory the model may take (None: it grows as needed).
    gpu_memory_limit_mb: int | None = None
    #: Calls measured under this many milliseconds run inline on the event loop; slower ones in a thread.
    inline_threshold_ms: float = 1.0
    #: For a folder of numbered versions (`modelserve.versions`): which of them are served; None for one model.
    version_policy: VersionPolicy | None = None


@dataclass
class CortexConfig:
    """A Cortex handler: a class of Cortex 0.19-0.35 (``Handler``, ``PythonPredictor``, ``TensorFlowPredictor``,
    ``ONNXPredictor``) or a predictor module of Cortex 0.11 (module-level ``init`` and ``predict``)."""

    #: python, tensorflow or onnx: which client the constructor gets.
    type: str = "python"
    #: "class" or "module".
    style: str = "class"
    #: The models of the client by name; a lone model is named "" (any model_name reaches it, as in Cortex).
    #: For type python, `format` is "python": the path is given to the handler's load_model(model_path).
    models: dict[str, ModelFileConfig] = field(default_factory=dict)


@dataclass
class BatchingConfig:
    max_batch_size: int = 8
    max_wait_ms: float = 0.0


@dataclass
class ApiConfig:
    """One API of a project: what serves it, and its limits."""

    name: str
    kind: str = "realtime"
    handler: HandlerConfig | None = None
    model: ModelFileConfig | None = None
    max_concurrency: int = 1
    max_queue_length: int = 100
    timeout: float | None = None
    max_body_size: int = DEFAULT_MAX_BODY_SIZE
    #: Body bytes the requests waiting for this API may hold together; beyond, 503 before reading a body.
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES
    #: Seconds a request may wait in the line; one whose turn comes later gets 503 instead. "auto": longer than
    #: the full line takes to go through (only while the line is full); None (`false` in YAML): no bound.
    max_queue_wait: float | str | None = AUTO
    #: Seconds a WebSocket session may pass without a message either way before it is closed (1001).
    websocket_idle_timeout: float = 300.0
    result_ttl: float = DEFAULT_RESULT_TTL
    batching: BatchingConfig | None = None
    #: What a client's disconnect does to running async user code: "cancel" it, or "notify" it (is_cancelled).
    on_disconnect: str = "cancel"
    #: The folder the constructor gets as ``data_dir``, relative to the project (None: the project's data/).
    data_dir: str | None = None
    #: The secrets the constructor's ``secrets`` may read: name -> the value written in the declaration.
    secrets: dict[str, str | None] = field(default_factory=dict)
    #: The Truss config.yaml this API follows (a Truss folder, or ``truss:`` in modelserve.yaml).
    truss: str | None = None
    #: Environment variables set before the API's code is imported (variables already set win).
    env: dict[str, str] = field(default_factory=dict)
    #: Folders put on sys.path before the API's code is imported, relative to the project.
    python_path: list[str] = field(default_factory=list)
    #: Set for Cortex handlers (cortex.yaml projects, or `model:` with `handler.class`).
    cortex: CortexConfig | None = None
    #: GPU ids spread over the worker processes (worker i uses devices[i mod n]), or "auto": every visible GPU,
    #: the CPU without one (`modelserve.devices`).
    devices: list[int] | str = "auto"
    #: What the API does, for its OpenAPI document (None: the class's docstring).
    description: str | None = None
    #: Served at an OpenAI path too (`OPENAI_KINDS`: chat, completions, embeddings); None: not.
    openai: str | None = None

    @property
    def backend(self) -> str:
        """The kind of `BACKENDS` that serves this API, from what its configuration names: a Cortex handler
        (cortex.yaml, or a model with a handler class: the handler gets the model's client), a model file, an
        async Handler class, or a Model class."""
        handler_class = self.handler is not None and self.handler.class_name is not None
        if self.cortex is not None or (self.model is not None and handler_class):
            return "cortex_handler"
        if self.model is not None:
            return "model_file"
        return "handler_class" if self.kind == "async" else "model_class"


@dataclass
class JobsConfig:
    """Where async jobs are kept (project-level `jobs:` block)."""

    store: str = "sqlite"
    path: str = ".modelserve/jobs.db"
    prefix: str = "modelserve"


@dataclass
class AuthConfig:
    """API keys (project-level `auth:`): where the keys are read from, never the keys themselves."""

    #: An environment variable holding the API keys, separated by commas or whitespace.
    api_keys_env: str | None = None
    #: A file of the project holding the API keys, one per line (``#`` starts a comment).
    api_keys_file: str | None = None
    #: An environment variable holding the keys that open ``/metrics`` (the API keys open it too).
    metrics_key_env: str | None = None
    #: The APIs whose routes need a key; None: every route but the probes.
    apis: list[str] | None = None


@dataclass
class CorsConfig:
    """Cross-origin requests from browsers (project-level `cors:`), with Starlette's CORSMiddleware rules."""

    allow_origins: list[str] = field(default_factory=list)
    allow_methods: list[str] = field(default_factory=lambda: ["GET", "HEAD", "POST", "DELETE"])
    allow_headers: list[str] = field(
        default_factory=lambda: ["Authorization", "X-API-Key", "X-Request-ID", "Inference-Header-Content-Length"]
    )
    #: Answer headers a page may read besides the safelisted ones (Starlette's default: none).
    expose_headers: list[str] = field(default_factory=list)
    allow_credentials: bool = False
    #: Answer Chrome's Private Network Access preflights (a public web site calling a server on this network).
    allow_private_network: bool = False
    max_age: int = 600


@dataclass
class ProjectConfig:
    root: Path
    apis: list[ApiConfig]
    jobs: JobsConfig = field(default_factory=JobsConfig)
    #: The wire protocols served (`PROTOCOLS`): ``protocols: [native, v2]`` at the top of modelserve.yaml.
    protocols: list[str] = field(default_factory=lambda: list(PROTOCOLS))
    #: API keys (``auth:``); None: no route needs a key.
    auth: AuthConfig | None = None
    #: Cross-origin requests (``cors:``); None: no ``Access-Control-*`` header is sent.
    cors: CorsConfig | None = None
    #: The ``Host`` values answered (``allowed_hosts:``, ``*.example.com`` wildcards); None: decided by the bind.
    allowed_hosts: list[str] | None = None
    #: Whether ``/docs`` serves the interactive page of the OpenAPI document (``docs: false``, ``--no-docs``).
    docs: bool = True
    #: OpenTelemetry tracing (``tracing: true``, ``--tracing``, ``MODELSERVE_TRACING=1``; `modelserve.tracing`).
    tracing: bool = False
    #: Ray Serve's deployment options for the project (``ray:``, keys in `RAY_KEYS`); their values are checked
    #: by `modelserve.ray`, which alone uses them, and its builder's arguments override them key by key.
    ray: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------
# Validation helpers. Each checker returns the converted value or raises _Invalid(expected).


class _Invalid(Exception):
    """What was expected; `found`, when given, names the bad item of a list in place of the whole value."""

    def __init__(self, expected: str, found: str | None = None) -> None:
        super().__init__(expected)
        self.found = found


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _Invalid("a positive integer")
    return value


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _Invalid("an integer >= 0")
    return value


def _finite(value: Any) -> bool:
    """An int or a finite float: YAML's ``.nan`` and ``.inf`` are floats, and a NaN timeout would never fire
    (nor an infinite batching wait end), silently; they are refused as the command line refuses them."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond a float's range (400 digits): no number of seconds is that long
        return False


def _positive_number(value: Any) -> float:
    if not _finite(value) or value <= 0:
        raise _Invalid("a number > 0")
    return float(value)


def _queue_wait(value: Any) -> float | str | None:
    if value is False:
        return None
    if value == AUTO:
        return AUTO
    try:
        return _positive_number(value)
    except _Invalid:
        raise _Invalid("'auto', a number of seconds > 0, or false") from None


def _non_negative_number(value: Any) -> float:
    if not _finite(value) or value < 0:
        raise _Invalid("a number >= 0")
    return float(value)


def _string(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _Invalid("a non-empty string")
    return value


def _mapping(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Invalid("a mapping")
    return value


def _providers(value: Any) -> list[str | dict[str, dict[str, Any]]]:
    """``[CUDAExecutionProvider, CPUExecutionProvider]``, an entry possibly ``{name: {option: value}}``."""
    if isinstance(value, str):
        value = [value]
    problem = "a list of execution provider names, each possibly a mapping {name: {option: value}}"
    if not isinstance(value, list) or not value:
        raise _Invalid(problem)
    for entry in value:
        if isinstance(entry, str) and entry:
            continue
        if isinstance(entry, dict) and len(entry) == 1:
            name, options = next(iter(entry.items()))
            if isinstance(name, str) and name and (options is None or isinstance(options, dict)):
                continue
        raise _Invalid(problem)
    return [entry if isinstance(entry, str) else {k: dict(v or {}) for k, v in entry.items()} for entry in value]


def _devices(value: Any) -> list[int] | str:
    if value == "auto":
        return "auto"
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        raise _Invalid("'auto' or a list of GPU ids (integers >= 0)")
    return value


def _string_list(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _Invalid("a list of strings")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid("true or false")
    return value


def _env_name(value: Any) -> str:
    if not isinstance(value, str) or not _ENV_NAME_RE.match(value):
        raise _Invalid("the name of an environment variable (letters, digits and '_')")
    return value


def check_origin(origin: str) -> str:
    """`origin` as browsers send it (``https://app.example.com:8443``, or ``*``); `_Invalid` says why not."""
    if origin != "*" and not _ORIGIN_RE.match(origin):
        raise _Invalid("an origin like 'https://app.example.com' (scheme, host, port; no path)", repr(origin))
    return origin


def _origins(value: Any) -> list[str]:
    return [check_origin(origin) for origin in _string_list(value)]


def _methods(value: Any) -> list[str]:
    methods = [method.upper() for method in _string_list(value)]
    if any(method != "*" and method not in CORS_METHODS for method in methods):
        raise _Invalid("a list of HTTP methods (" + ", ".join(CORS_METHODS) + ") or '*'")
    return methods


def _header_names(value: Any) -> list[str]:
    if value == []:  # none beyond those always allowed or exposed: expose_headers' default
        return []
    names = _string_list(value)
    if any(name != "*" and not _TOKEN_RE.match(name) for name in names):
        raise _Invalid("a list of header names (or '*')")
    return names


def check_host_pattern(pattern: str) -> str:
    """A host name for `allowed_hosts` with Starlette's TrustedHostMiddleware rules: ``*``, ``*.example.com``,
    ``example.com``, ``[::1]``; no scheme and no port."""
    bracketed = pattern.startswith("[") and pattern.endswith("]")
    if "*" in pattern[1:] or (pattern.startswith("*") and pattern != "*" and not pattern.startswith("*.")):
        raise _Invalid("a host name; wildcards must be like '*.example.com'", repr(pattern))
    if ("/" in pattern or ":" in pattern) and not bracketed:
        raise _Invalid("a host name without scheme or port (the port is not checked)", repr(pattern))
    return pattern


def _host_patterns(value: Any) -> list[str]:
    return [check_host_pattern(pattern) for pattern in _string_list(value)]


def _choice(*choices: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise _Invalid("one of " + ", ".join(repr(c) for c in choices))
        return str(value)

    return check


class _Problems:
    """Collects every problem of a file, to report them all at once."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")

    def take(
        self,
        section: dict[str, Any],
        key: str,
        check: Callable[[Any], Any],
        where: str,
        default: Any = None,
    ) -> Any:
        if key not in section or (section[key] is None and default is not None):
            return default
        value = section[key]
        try:
            return check(value)
        except _Invalid as exc:
            found = exc.found if exc.found is not None else _describe(value)
            self.add(where, f"key '{key}': expected {exc}, got {found}")
            return default

    def unknown_keys(self, section: dict[str, Any], allowed: set[str], where: str) -> None:
        for key in section:
            if key not in allowed:
                known = ", ".join(sorted(allowed))
                self.add(where, f"unknown key '{key}' (known keys: {known})")

    def raise_if_any(self) -> None:
        if self.items:
            lines = "\n  - ".join(self.items)
            raise ConfigError(f"{self.source} is not valid:\n  - {lines}")


_API_KEYS = {
    "name",
    "devices",
    "on_disconnect",
    "kind",
    "handler",
    "model",
    "max_concurrency",
    "max_queue_length",
    "timeout",
    "max_body_size",
    "max_queued_bytes",
    "max_queue_wait",
    "websocket_idle_timeout",
    "result_ttl",
    "batching",
    "data_dir",
    "secrets",
    "truss",
    "description",
    "openai",
}
_HANDLER_KEYS = {"path", "class", "config"}
_MODEL_KEYS = {
    "path",
    "format",
    "signature_key",
    "providers",
    "intra_op_threads",
    "inter_op_threads",
    "inline_threshold_ms",
    "gpu_memory_limit_mb",
    "version_policy",
}
_BATCHING_KEYS = {"max_batch_size", "max_wait_ms"}
_JOBS_KEYS = {"store", "path", "prefix"}
_AUTH_KEYS = {"api_keys_env", "api_keys_file", "metrics_key_env", "apis"}
_CORS_KEYS = {
    "allow_origins",
    "allow_methods",
    "allow_headers",
    "expose_headers",
    "allow_credentials",
    "allow_private_network",
    "max_age",
}
_TOP_KEYS = {"apis", "jobs", "protocols", "auth", "cors", "allowed_hosts", "docs", "tracing", "ray"}
#: Keys of ``ray:``: Ray Serve's own names for a deployment's options (`modelserve.ray` checks their values).
RAY_KEYS = {
    "num_replicas",
    "autoscaling_config",
    "ray_actor_options",
    "max_ongoing_requests",
    "max_queued_requests",
    "health_check_period_s",
    "health_check_timeout_s",
}


def infer_model_format(path: str) -> str | None:
    """onnx for a .onnx file, tensorflow for a folder holding saved_model.pb; None when unclear."""
    if path.lower().endswith(".onnx"):
        return "onnx"
    if path.rstrip("/").lower().endswith(".pb") or Path(path, "saved_model.pb").exists():
        return "tensorflow"
    return None


def outside_project(root: Path, path: str) -> Path | None:
    """Where `path` (relative to the project, or absolute) leads when it leaves the project folder, after
    symlinks; None when it stays inside. User code must live in the project (``handler.path``)."""
    resolved = (root / path).resolve()
    return None if resolved.is_relative_to(root.resolve()) else resolved


def escapes_project(path: str) -> bool:
    """Whether a relative `path` climbs out of the project with ``..`` (an absolute path is the user's
    explicit choice: models often live on a shared volume, and a symlink in the project is one too)."""
    if Path(path).is_absolute():
        return False
    return os.path.normpath(path).split(os.sep)[0] == os.pardir


def _parse_handler(raw: Any, where: str, root: Path, problems: _Problems) -> HandlerConfig | None:
    try:
        section = _mapping(raw)
    except _Invalid:
        problems.add(where, f"key 'handler': expected a mapping, got {_describe(raw)}")
        return None
    problems.unknown_keys(section, _HANDLER_KEYS, f"{where}, handler")
    path = problems.take(section, "path", _string, f"{where}, handler")
    if path is None:
        if "path" not in section:
            problems.add(f"{where}, handler", "key 'path' is required (a Python file in the project)")
        return None
    outside = outside_project(root, path)
    if outside is not None:
        problems.add(
            f"{where}, handler",
            f"key 'path': {path!r} leads to {str(outside)!r}, outside the project folder; user code must be "
            "in the project",
        )
    elif not (root / path).is_file():
        problems.add(f"{where}, handler", f"key 'path': file {path!r} not found in {root}")
    return HandlerConfig(
        path=path,
        class_name=problems.take(section, "class", _string, f"{where}, handler"),
        config=problems.take(section, "config", _mapping, f"{where}, handler", default={}),
    )


def _parse_model(raw: Any, where: str, root: Path, problems: _Problems) -> ModelFileConfig | None:
    try:
        section = _mapping(raw)
    except _Invalid:
        problems.add(where, f"key 'model': expected a mapping, got {_describe(raw)}")
        return None
    where = f"{where}, model"
    problems.unknown_keys(section, _MODEL_KEYS, where)
    path = problems.take(section, "path", _string, where)
    if path is None:
        if "path" not in section:
            problems.add(where, "key 'path' is required (an .onnx file or a SavedModel folder)")
        return None
    if escapes_project(path):
        problems.add(where, f"key 'path': {path!r} leaves the project folder; a model elsewhere needs an absolute path")
    elif not (root / path).exists():
        problems.add(where, f"key 'path': {path!r} not found in {root}")
    policy, probe = _versions(section, path, root, where, problems)
    fmt = problems.take(section, "format", _choice(*MODEL_FORMATS), where)
    found = infer_model_format(probe) if fmt is not None else None
    if found is not None and found != fmt:  # refused here, before the wrong runtime is imported
        problems.add(where, f"key 'format': {fmt!r} contradicts the path {path!r}, which is a {found} model")
    if fmt is None and "format" not in section:
        fmt = infer_model_format(probe)
        if fmt is None:
            problems.add(where, f"key 'format': cannot tell the format of {path!r}; say 'onnx' or 'tensorflow'")
    config = ModelFileConfig(path=path, format=fmt or "onnx", version_policy=policy)
    config.signature_key = problems.take(section, "signature_key", _string, where, config.signature_key)
    config.providers = problems.take(section, "providers", _providers, where, config.providers)
    config.intra_op_threads = problems.take(section, "intra_op_threads", _positive_int, where)
    config.inter_op_threads = problems.take(section, "inter_op_threads", _positive_int, where)
    config.gpu_memory_limit_mb = problems.take(section, "gpu_memory_limit_mb", _positive_int, where)
    config.inline_threshold_ms = problems.take(
        section, "inline_threshold_ms", _non_negative_number, where, config.inline_threshold_ms
    )
    return config


def _versions(
    section: dict[str, Any], path: str, root: Path, where: str, problems: _Problems
) -> tuple[VersionPolicy | None, str]:
    """A folder of numbered versions: its policy (``latest: 1`` by default) and the path whose format the
    model's is (the highest selected version's model); else (None, the path)."""
    folders = version_folders(root / path) if not escapes_project(path) else {}
    if not folders:
        if "version_policy" in section:
            problems.add(where, f"key 'version_policy': {path!r} is not a folder of numbered versions (1/, 2/...)")
        return None, str(root / path)
    try:
        policy = parse_policy(section.get("version_policy", {"latest": 1}))
    except ValueError as exc:
        problems.add(where, f"key 'version_policy': {exc}")
        return None, str(root / path)
    selected = policy.select(list(folders))
    if not selected:
        problems.add(where, f"key 'version_policy': selects none of the versions {sorted(folders)} in {path!r}")
        return None, str(root / path)
    model = model_in(folders[selected[-1]])
    if model is None:
        problems.add(where, f"{path}/{selected[-1]} holds no model (a model.onnx, one .onnx file or a SavedModel)")
        return None, str(root / path)
    return policy, str(model)


def _parse_batching(raw: Any, where: str, problems: _Problems) -> BatchingConfig | None:
    try:
        section = _mapping(raw)
    except _Invalid:
        problems.add(where, f"key 'batching': expected a mapping, got {_describe(raw)}")
        return None
    where = f"{where}, batching"
    problems.unknown_keys(section, _BATCHING_KEYS, where)
    config = BatchingConfig()
    config.max_batch_size = problems.take(section, "max_batch_size", _positive_int, where, config.max_batch_size)
    config.max_wait_ms = problems.take(section, "max_wait_ms", _non_negative_number, where, config.max_wait_ms)
    return config


def _secret_names(value: Any) -> dict[str, str | None]:
    """``secrets: [hf_token]`` or Truss's ``secrets: {hf_token: null}``: the names an API may read."""
    if isinstance(value, list) and all(isinstance(name, str) and name for name in value):
        return dict.fromkeys(value)
    if isinstance(value, dict) and all(isinstance(name, str) and name for name in value):
        return {name: None if default is None else str(default) for name, default in value.items()}
    raise _Invalid("a list of secret names, or a mapping of names to null")


def _parse_api(
    raw: Any, index: int, root: Path, problems: _Problems, handler: HandlerConfig | None = None
) -> ApiConfig | None:
    """One API of modelserve.yaml; with `handler` (a class given in Python), the API of that class, whose
    `raw` names no handler or model."""
    if not isinstance(raw, dict):
        problems.add(f"api #{index + 1}", f"expected a mapping, got {_describe(raw)}")
        return None
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        segment = "a URL segment (letters, digits, '-', '_', '.')"
        if isinstance(name, str) and _NAME_RE.match(name[:64]):
            segment = "a URL segment of at most 64 characters"
        elif isinstance(name, str) and name and _NAME_RE.match("a" + name[1:]):
            segment = "a URL segment that starts with a letter or a digit"
        problems.add(f"api #{index + 1}", f"key 'name': expected {segment}, got {_describe(name)}")
        name = f"#{index + 1}"
    elif name in RESERVED_NAMES:
        problems.add(f"api '{name}'", f"key 'name': {name!r} is reserved for the server's own routes")
    where = f"api '{name}'"
    problems.unknown_keys(raw, _API_KEYS, where)

    api = ApiConfig(name=name)
    api.kind = problems.take(raw, "kind", _choice("realtime", "async"), where, "realtime")
    if handler is not None:
        api.handler = handler
    elif raw.get("handler") is not None:
        api.handler = _parse_handler(raw["handler"], where, root, problems)
    if raw.get("model") is not None:
        api.model = _parse_model(raw["model"], where, root, problems)
    if raw.get("truss") is not None:
        layout("truss").apply_truss(api, raw, where, root, problems)
    elif handler is None and "handler" not in raw and "model" not in raw:
        problems.add(where, "needs a 'handler' (a Python class) or a 'model' (an ONNX or TensorFlow file)")
    api.data_dir = problems.take(raw, "data_dir", _string, where, api.data_dir)
    if raw.get("secrets") is not None:
        api.secrets = {**api.secrets, **problems.take(raw, "secrets", _secret_names, where, default={})}
    api.max_concurrency = problems.take(raw, "max_concurrency", _positive_int, where, api.max_concurrency)
    api.max_queue_length = problems.take(raw, "max_queue_length", _non_negative_int, where, api.max_queue_length)
    api.timeout = problems.take(raw, "timeout", _positive_number, where)
    api.max_body_size = problems.take(raw, "max_body_size", _positive_int, where, api.max_body_size)
    api.max_queued_bytes = problems.take(raw, "max_queued_bytes", _positive_int, where, api.max_queued_bytes)
    api.max_queue_wait = problems.take(raw, "max_queue_wait", _queue_wait, where, api.max_queue_wait)
    api.websocket_idle_timeout = problems.take(
        raw, "websocket_idle_timeout", _positive_number, where, api.websocket_idle_timeout
    )
    api.result_ttl = problems.take(raw, "result_ttl", _positive_number, where, api.result_ttl)
    if raw.get("batching") is not None:
        api.batching = _parse_batching(raw["batching"], where, problems)
    _refuse_inapplicable(api, raw, where, problems)
    api.on_disconnect = problems.take(raw, "on_disconnect", _choice(*ON_DISCONNECT), where, api.on_disconnect)
    api.devices = problems.take(raw, "devices", _devices, where, api.devices)
    api.description = problems.take(raw, "description", _string, where)
    api.openai = problems.take(raw, "openai", _choice(*OPENAI_KINDS), where)
    if api.openai is not None and api.kind != "realtime":
        problems.add(where, "key 'openai' applies to realtime APIs (an OpenAI client waits for its answer)")
    return api


#: The keys of an API that `create_app(handler=...)` takes as keywords: all but what the class itself replaces.
CLASS_API_KEYS = frozenset(_API_KEYS - {"name", "handler", "model", "truss"})


def class_api(name: str, handler: HandlerConfig, options: dict[str, Any], root: Path) -> ApiConfig:
    """The API of a class given in Python (``create_app(handler=..., name=..., **options)``): `options` are
    keys of an API in modelserve.yaml, checked as they are there (a bad value is a `ConfigError` naming it, not
    a failure on the first request); ``batching`` may also be a `BatchingConfig`."""
    unknown = sorted(set(options) - CLASS_API_KEYS)
    if unknown and unknown[0] in _API_KEYS:
        raise ConfigError(
            f"create_app: {unknown[0]!r} is a key of modelserve.yaml that a class given as handler= has no use for"
        )
    if unknown:
        known = ", ".join(sorted(CLASS_API_KEYS))
        raise ConfigError(f"create_app: unknown API option {unknown[0]!r} (known options: {known})")
    # None is the default where the API's default is None (timeout=None: no timeout); max_queue_wait=None is no
    # bound, as ApiConfig has it (false in YAML).
    nothing = {item.name for item in fields(ApiConfig) if item.default is None}
    raw: dict[str, Any] = {key: value for key, value in options.items() if value is not None or key not in nothing}
    if "max_queue_wait" in raw and raw["max_queue_wait"] is None:
        raw["max_queue_wait"] = False
    raw["name"] = name
    if isinstance(raw.get("batching"), BatchingConfig):
        raw["batching"] = asdict(raw["batching"])
    problems = _Problems("create_app")
    api = _parse_api(raw, 0, root, problems, handler)
    problems.raise_if_any()
    assert api is not None
    return api


def _refuse_inapplicable(api: ApiConfig, raw: dict[str, Any], where: str, problems: _Problems) -> None:
    """Keys that the API's kind would silently ignore: each is a problem saying where it applies."""
    model_class = api.backend == "model_class"  # a Model class gets data_dir and secrets
    model_file = api.backend == "model_file"
    if "result_ttl" in raw and api.kind != "async":
        problems.add(where, "key 'result_ttl' applies to async APIs only (how long a job's result is kept)")
    if raw.get("batching") is not None and not (model_class or model_file):
        served_by = "an async Handler class" if api.model is None else "a handler class with its model's client"
        problems.add(where, f"key 'batching' applies to a Model class or a model file, not to {served_by}")
    for key in ("data_dir", "secrets"):
        if raw.get(key) is not None and not model_class:
            problems.add(where, f"key '{key}' is given to a Model class's constructor; this API has none")
    model = raw.get("model")
    if api.model is not None and isinstance(model, dict):
        only = {"signature_key": "tensorflow", "providers": "onnx", "gpu_memory_limit_mb": "tensorflow"}
        for key, fmt in only.items():
            if key in model and api.model.format != fmt:
                problems.add(f"{where}, model", f"key '{key}' applies to {fmt} models; this one is {api.model.format}")
        if "inline_threshold_ms" in model and not model_file:
            problems.add(
                f"{where}, model",
                "key 'inline_threshold_ms' applies to a model file served with hooks or none, "
                "not through a handler class",
            )


def _parse_jobs(raw: Any, problems: _Problems) -> JobsConfig:
    config = JobsConfig()
    try:
        section = _mapping(raw)
    except _Invalid:
        problems.add("jobs", f"expected a mapping, got {_describe(raw)}")
        return config
    problems.unknown_keys(section, _JOBS_KEYS, "jobs")
    config.store = problems.take(section, "store", _string, "jobs", config.store)
    config.path = problems.take(section, "path", _string, "jobs", config.path)
    config.prefix = problems.take(section, "prefix", _string, "jobs", config.prefix)
    if store_kind(config.store) is None:
        problems.add("jobs", f"key 'store': expected {STORE_CHOICES}, got {config.store!r}")
    return config


def _parse_auth(raw: Any, root: Path, problems: _Problems) -> AuthConfig | None:
    try:
        section = _mapping(raw)
    except _Invalid:
        problems.add("auth", f"expected a mapping, got {_describe(raw)}")
        return None
    problems.unknown_keys(section, _AUTH_KEYS, "auth")
    config = AuthConfig()
    config.api_keys_env = problems.take(section, "api_keys_env", _env_name, "auth")
    config.api_keys_file = problems.take(section, "api_keys_file", _string, "auth")
    config.metrics_key_env = problems.take(section, "metrics_key_env", _env_name, "auth")
    config.apis = problems.take(section, "apis", _string_list, "auth")
    if config.api_keys_file is not None and not (root / config.api_keys_file).is_file():
        problems.add("auth", f"key 'api_keys_file': file {config.api_keys_file!r} not found in {root}")
    if not any(key in section for key in ("api_keys_env", "api_keys_file", "metrics_key_env")):
        problems.add("auth", "needs 'api_keys_env' or 'api_keys_file' (where the keys are; never the keys themselves)")
    if config.apis is not None and config.api_keys_env is None and config.api_keys_file is None:
        problems.add("auth", "key 'apis': the APIs it names need API keys ('api_keys_env' or 'api_keys_file')")
    return config


def _parse_cors(raw: Any, problems: _Problems) -> CorsConfig | None:
    try:
        section = _mapping(raw)
    except _Invalid:
        problems.add("cors", f"expected a mapping, got {_describe(raw)}")
        return None
    problems.unknown_keys(section, _CORS_KEYS, "cors")
    config = CorsConfig()
    config.allow_origins = problems.take(section, "allow_origins", _origins, "cors", config.allow_origins)
    config.allow_methods = problems.take(section, "allow_methods", _methods, "cors", config.allow_methods)
    config.allow_headers = problems.take(section, "allow_headers", _header_names, "cors", config.allow_headers)
    config.expose_headers = problems.take(section, "expose_headers", _header_names, "cors", config.expose_headers)
    config.allow_credentials = problems.take(section, "allow_credentials", _bool, "cors", config.allow_credentials)
    config.allow_private_network = problems.take(
        section, "allow_private_network", _bool, "cors", config.allow_private_network
    )
    config.max_age = problems.take(section, "max_age", _non_negative_int, "cors", config.max_age)
    if "allow_origins" not in section:
        problems.add("cors", "key 'allow_origins' is required (the origins of the pages that may call, or '*')")
    return config


def _protocols(value: Any) -> list[str]:
    names = _string_list(value)
    if any(name not in PROTOCOLS for name in names):
        raise _Invalid("a list of " + ", ".join(repr(p) for p in PROTOCOLS))
    return names


def parse_project(data: Any, root: Path, source: str = CONFIG_FILE) -> ProjectConfig:
    """Validate the parsed content of modelserve.yaml (a mapping with `apis:`, or a bare list of APIs)."""
    problems = _Problems(source)
    jobs = JobsConfig()
    protocols = list(PROTOCOLS)
    auth: AuthConfig | None = None
    cors: CorsConfig | None = None
    allowed_hosts: list[str] | None = None
    docs = True
    tracing = False
    ray: dict[str, Any] = {}
    if isinstance(data, list):
        raw_apis: Any = data
    elif isinstance(data, dict):
        problems.unknown_keys(data, _TOP_KEYS, "top level")
        raw_apis = data.get("apis")
        if "jobs" in data:
            jobs = _parse_jobs(data["jobs"], problems)
        protocols = problems.take(data, "protocols", _protocols, "top level", protocols)
        if data.get("auth") is not None:
            auth = _parse_auth(data["auth"], root, problems)
        if data.get("cors") is not None:
            cors = _parse_cors(data["cors"], problems)
        allowed_hosts = problems.take(data, "allowed_hosts", _host_patterns, "top level")
        docs = problems.take(data, "docs", _bool, "top level", docs)
        tracing = problems.take(data, "tracing", _bool, "top level", tracing)
        ray = problems.take(data, "ray", _mapping, "top level", ray)
        problems.unknown_keys(ray, RAY_KEYS, "ray")
    else:
        raise ConfigError(f"{source} is not valid: expected a mapping with 'apis:' or a list of APIs")
    if not isinstance(raw_apis, list) or not raw_apis:
        problems.add("top level", f"key 'apis': expected a non-empty list of APIs, got {_describe(raw_apis)}")
        problems.raise_if_any()

    apis = []
    for index, raw in enumerate(raw_apis):
        api = _parse_api(raw, index, root, problems)
        if api is not None:
            apis.append(api)
    seen: set[str] = set()
    for api in apis:
        if api.name in seen:
            problems.add(f"api '{api.name}'", "key 'name': two APIs have this name")
        seen.add(api.name)
    for name in auth.apis or () if auth is not None else ():
        if name not in seen:
            problems.add("auth", f"key 'apis': no API is named {name!r} (APIs: {', '.join(sorted(seen))})")
    problems.raise_if_any()
    return ProjectConfig(
        root=root,
        apis=apis,
        jobs=jobs,
        protocols=protocols,
        auth=auth,
        cors=cors,
        allowed_hosts=allowed_hosts,
        docs=docs,
        tracing=tracing,
        ray=ray,
    )


def apply_command_line(project: ProjectConfig, api_key_env: str | None, cors_origins: Sequence[str]) -> None:
    """The command line's ``--api-key-env`` and ``--cors-origin`` over modelserve.yaml's `auth` and `cors`: the
    variable replaces ``api_keys_env`` (a keys file is still read), the origins are added to ``allow_origins``.
    The checks that need both (credentials with the origin ``*``) run here, on the final settings."""
    problems = _Problems("the command line")
    if api_key_env is not None:
        if not _ENV_NAME_RE.match(api_key_env):
            problems.add("--api-key-env", f"expected the name of an environment variable, got {api_key_env!r}")
        project.auth = project.auth or AuthConfig()
        project.auth.api_keys_env = api_key_env
    for origin in cors_origins:
        try:
            check_origin(origin)
        except _Invalid as exc:
            problems.add("--cors-origin", f"expected {exc}, got {exc.found}")
    problems.raise_if_any()
    if cors_origins:
        project.cors = project.cors or CorsConfig()
        project.cors.allow_origins = list(dict.fromkeys([*project.cors.allow_origins, *cors_origins]))
    if project.cors is not None and project.cors.allow_credentials and "*" in project.cors.allow_origins:
        star = "--cors-origin '*'" if "*" in cors_origins else "the origin '*'"
        raise ConfigError(
            f"{CONFIG_FILE}: cors: allow_credentials with {star} would let every web site send a browser's"
            " credentials; list the origins instead"
        )


def yaml_error(path: str | Path, exc: yaml.YAMLError) -> ConfigError:
    """A YAML syntax error as a `ConfigError` naming the file, the line and the column (PyYAML, given the
    file's text, would name ``"<unicode string>"``)."""
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return ConfigError(f"{path} is not valid YAML: {exc}")
    problem = getattr(exc, "problem", None) or "syntax error"
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None and context_mark.line != mark.line:
        problem += f" ({context} that started at line {context_mark.line + 1}, column {context_mark.column + 1})"
    elif context:
        problem += f" ({context})"
    snippet = mark.get_snippet()
    if snippet is not None and not snippet.strip(" \n^"):  # the end of the file: nothing to show
        snippet = None
    return ConfigError(
        f"{path}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}"
        + (f"\n{snippet}" if snippet else "")
    )


def load_project_config(project_dir: str | Path) -> ProjectConfig:
    """Read a project folder: its modelserve.yaml, a folder of another server (`LAYOUTS`), or a lone model.py
    with a class Model."""
    root = Path(project_dir).resolve()
    if not root.is_dir():
        raise ConfigError(f"project folder {str(project_dir)!r} does not exist or is not a folder")
    config_path = root / CONFIG_FILE
    if config_path.is_file():
        try:
            data = yaml.safe_load(config_path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            raise yaml_error(config_path, exc) from None
        return parse_project(data, root, str(config_path))
    for name in LAYOUTS:
        module = layout(name)
        if module.detect(root):
            return module.load(root)  # type: ignore[no-any-return]
    if (root / "model.py").is_file():
        api = ApiConfig(name="model", handler=HandlerConfig(path="model.py", class_name="Model"))
        return ProjectConfig(root=root, apis=[api])
    raise ConfigError(f"{root} has neither {CONFIG_FILE} nor a model.py with a class Model")
