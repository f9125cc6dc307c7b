"""Ray Serve: a project's APIs on a Ray cluster, each replica one modelserve app.

`app` is a Ray Serve *application builder*: it takes a dict of arguments and returns the application, so it
works from Ray's command line, from a Serve config file (``serve build``, ``serve deploy``, KubeRay's
``RayService``) and from Python::

    serve run modelserve.ray:app project=examples/iris num_replicas=2

    from ray import serve
    import modelserve.ray
    serve.run(modelserve.ray.app({"project": "examples/iris", "num_replicas": 2}))

Each replica builds the project's app with `modelserve.http.create_app`, exactly as ``python -m modelserve``
does, and Ray's proxy hands it the HTTP requests as ASGI (``@serve.ingress``): the routes, error bodies,
limits, streaming, V2 routes, typed inputs and API keys are modelserve's. A replica takes traffic once every
API has loaded (its constructor waits for the load; a failure fails the replica with modelserve's message),
and Ray's health check asks the replica whether its APIs are still ready.

Ray's deployment options come from the arguments (``ARGUMENTS``) over the project's own, the ``ray:`` mapping
of its modelserve.yaml (`modelserve.config.RAY_KEYS`), key by key. Without either, what Ray is told is derived
from the project:

* ``max_ongoing_requests``: the requests a replica would hold at once, running or waiting, summed over the
  project's APIs (``max_concurrency + max_queue_length`` each), so that Ray sends a replica no more than
  modelserve would admit, and modelserve's own 503 comes only when both agree the replica is full;
* ``graceful_shutdown_timeout_s``: the project's ``graceful_timeout`` (the CLI's ``--graceful-timeout``).

Async APIs keep their jobs in the project's store; a job submitted through one replica is polled through any
only when the store is shared (Redis), so more than one replica with a ``memory`` or ``sqlite`` store is
refused before Ray starts anything.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import click  # uvicorn's dependency; `serve run` is a click command

from modelserve.config import RAY_KEYS, check_origin, load_project_config
from modelserve.errors import ConfigError, LoadError, MissingExtraError
from modelserve.jobs import STORE_CHOICES, store_kind
from modelserve.metrics import Metrics
from modelserve.project import caller_dir

#: The Ray Serve deployment's name, unless ``name`` says otherwise (a Serve config file's ``deployments:``
#: entry overrides its options by this name).
DEFAULT_NAME = "modelserve"
DEFAULT_GRACE = 30.0
#: Seconds between two copies of a replica's metrics into Ray's metrics export (`export_metrics`).
METRICS_INTERVAL = 5.0
#: Families that are not copied: the process's own, which Ray exports for every worker already.
_NOT_EXPORTED = ("process_", "python_")
#: Ray Serve's ``max_replicas`` when an ``autoscaling_config`` leaves it out (``AutoscalingConfig``'s default).
RAY_MAX_REPLICAS = 1
#: Keys of ``ray_actor_options`` (Ray's own names): what a replica reserves on a node.
ACTOR_OPTIONS = ("num_cpus", "num_gpus", "memory", "resources", "accelerator_type", "runtime_env")


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("a non-empty string")
    return value


def _count(value: Any) -> int:
    """A positive integer, also as the text ``serve run key=value`` passes."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError("a positive integer")
    return value


def _replicas(value: Any) -> int | str:
    if value == "auto":
        return "auto"
    try:
        return _count(value)
    except ValueError:
        raise ValueError("a positive integer or 'auto'") from None


def _seconds(value: Any) -> float:
    try:
        number = float(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else math.nan
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise ValueError("a number of seconds >= 0")
    return number


def _mapping(value: Any) -> dict[str, Any]:
    """A mapping, also as the JSON text ``serve run key=value`` passes (``ray_actor_options='{"num_cpus": 1}'``)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError("a mapping (JSON on the command line)") from None
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ValueError("a mapping (JSON on the command line)")
    return value


def _texts(value: Any) -> list[str]:
    if isinstance(value, str):
        value = [part for part in value.split(",") if part]
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise ValueError("a list of strings (comma-separated on the command line)")
    return value


def _env_name(value: Any) -> str:
    """The name of an environment variable, as ``--api-key-env`` takes it."""
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        raise ValueError("the name of an environment variable")
    return value


def _origins(value: Any) -> list[str]:
    """Origins as ``--cors-origin`` takes them (comma-separated on the command line)."""
    origins = _texts(value)
    for origin in origins:
        try:
            check_origin(origin)
        except Exception:  # config's own reason; the argument's message says what is wanted
            raise ValueError("origins like 'https://app.example.com' (scheme, host, port; no path), or '*'") from None
    return origins


def _store(value: Any) -> str:
    """A jobs store as ``--jobs-store`` takes it."""
    if not isinstance(value, str) or store_kind(value) is None:
        raise ValueError(STORE_CHOICES)
    return value


def _flag(value: Any) -> bool:
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise ValueError("true or false")
    return value


#: The builder's arguments: name -> (checker, what it is). modelserve's own settings first, then the
#: deployment options passed on to Ray under the same names.
ARGUMENTS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "project": (_text, "the project folder (relative to the working directory of the process that builds)"),
    "name": (_text, f"the deployment's name (default: {DEFAULT_NAME})"),
    "jobs_store": (_store, "overrides the project's jobs store (a redis:// URL for several replicas)"),
    "api_key_env": (_env_name, "require an API key; the keys are in this environment variable (--api-key-env)"),
    "cors_origins": (_origins, "origins of web pages allowed to call (--cors-origin)"),
    "docs": (_flag, "serve /docs (default: true)"),
    "graceful_timeout": (_seconds, f"seconds in-flight work gets at shutdown (default: {DEFAULT_GRACE:g})"),
    "metrics_interval_s": (
        _seconds,
        f"seconds between copies of the metrics into Ray's export (0: none; default {METRICS_INTERVAL:g})",
    ),
    "num_replicas": (_replicas, "replicas (default: 1), or 'auto' for Ray's default autoscaling"),
    "autoscaling_config": (_mapping, "Ray's autoscaling_config (min_replicas, max_replicas, ...)"),
    "ray_actor_options": (_mapping, "what each replica reserves: " + ", ".join(ACTOR_OPTIONS)),
    "max_ongoing_requests": (_count, "requests a replica holds at once (default: from the project's limits)"),
    "max_queued_requests": (_count, "requests Ray's router holds for the deployment (default: Ray's, no bound)"),
    "health_check_period_s": (_seconds, "seconds between Ray's health checks of a replica"),
    "health_check_timeout_s": (_seconds, "seconds a health check may take"),
}
#: Arguments that are options of the deployment itself, passed on to ``serve.deployment``: the keys of
#: modelserve.yaml's ``ray:``.
_DEPLOYMENT_KEYS = tuple(sorted(RAY_KEYS))


class _ArgumentsError(ConfigError, click.ClickException):
    """A `ConfigError` of `app`: ``serve run`` (a click command) prints its message on one line, where any other
    exception would be a traceback."""

    def __init__(self, message: str) -> None:
        ConfigError.__init__(self, message)
        click.ClickException.__init__(self, message)


@dataclass
class Plan:
    """What `app` deploys: the project folder, the settings every replica's app gets, and Ray's options."""

    project: str
    name: str = DEFAULT_NAME
    settings: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def max_replicas(self) -> int | None:
        """The most replicas this deployment may run (None: Ray decides, as with ``num_replicas: auto``)."""
        autoscaling = self.options.get("autoscaling_config")
        if autoscaling is not None:
            most = autoscaling.get("max_replicas", RAY_MAX_REPLICAS)
            return most if isinstance(most, int) else None
        replicas = self.options.get("num_replicas", 1)
        return replicas if isinstance(replicas, int) else None


def plan(args: Mapping[str, Any]) -> Plan:
    """Check the builder's arguments and the project (its modelserve.yaml, without importing its code) and
    derive Ray's options: every mistake in one `ConfigError`, before Ray starts anything."""
    if not isinstance(args, Mapping):
        raise ConfigError(f"modelserve.ray.app: expected a dict of arguments, got {type(args).__name__}")
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key, raw in args.items():
        if key not in ARGUMENTS:
            known = ", ".join(ARGUMENTS)
            problems.append(f"unknown argument {key!r} (modelserve.ray knows: {known})")
            continue
        check, wanted = ARGUMENTS[key]
        try:
            values[key] = check(raw)
        except ValueError as exc:
            problems.append(f"argument {key!r}: expected {exc}, got {raw!r}")
    if "project" not in args:
        problems.append("argument 'project' is required: the project folder (project=path/to/project)")
    problems += _deployment_problems(values, "argument")
    if problems:
        raise ConfigError("modelserve.ray: " + "; ".join(problems))

    project_dir = caller_dir() / values["project"]
    project = load_project_config(project_dir)  # a ConfigError names the file and every problem in it
    values = _over_project(project.ray, values, project_dir)
    result = Plan(project=str(project.root), name=values.get("name", DEFAULT_NAME))
    grace = values.get("graceful_timeout", DEFAULT_GRACE)
    result.settings = {
        "project_as_given": values["project"],
        "jobs_store": values.get("jobs_store"),
        "api_key_env": values.get("api_key_env"),
        "cors_origins": values.get("cors_origins", []),
        "docs": values.get("docs", True),
        "graceful_timeout": grace,
        "metrics_interval_s": values.get("metrics_interval_s", METRICS_INTERVAL),
    }
    result.options = {key: values[key] for key in _DEPLOYMENT_KEYS if key in values}
    result.options.setdefault(
        "max_ongoing_requests", sum(api.max_concurrency + api.max_queue_length for api in project.apis)
    )
    result.options["graceful_shutdown_timeout_s"] = grace

    async_apis = [api.name for api in project.apis if api.kind == "async"]
    store = result.settings["jobs_store"] or project.jobs.store
    replicas = result.max_replicas
    if async_apis and store_kind(store) != "redis" and (replicas is None or replicas > 1):
        how_many = "an autoscaled number of" if replicas is None else str(replicas)
        raise ConfigError(
            f"modelserve.ray: the async APIs ({', '.join(async_apis)}) keep their jobs in the {store!r} store, which"
            f" {how_many} replicas cannot share (a job submitted through one replica must be polled through any):"
            " set jobs: store: redis://... in modelserve.yaml, or the argument jobs_store=redis://..."
        )
    result.settings["workers"] = replicas or 2
    return result


def _deployment_problems(values: Mapping[str, Any], what: str) -> list[str]:
    """The mistakes no single value shows: an unknown actor option, replicas fixed and autoscaled at once."""
    problems = [
        f"{what} 'ray_actor_options': unknown option {option!r} (known: {', '.join(ACTOR_OPTIONS)})"
        for option in values.get("ray_actor_options", {})
        if option not in ACTOR_OPTIONS
    ]
    if "num_replicas" in values and "autoscaling_config" in values:
        problems.append(f"{what}s: give 'num_replicas' or 'autoscaling_config', not both")
    return problems


def _over_project(defaults: Mapping[str, Any], values: dict[str, Any], project_dir: Any) -> dict[str, Any]:
    """The arguments over modelserve.yaml's ``ray:`` (its keys are known: `load_project_config` checked them),
    key by key; ``num_replicas`` and ``autoscaling_config`` count as one setting, so that an argument of either
    replaces the file's choice."""
    problems: list[str] = []
    checked: dict[str, Any] = {}
    for key, raw in defaults.items():
        check, _ = ARGUMENTS[key]
        try:
            checked[key] = check(raw)
        except ValueError as exc:
            problems.append(f"key {key!r}: expected {exc}, got {raw!r}")
    problems += _deployment_problems(checked, "key")
    if problems:
        raise ConfigError(f"{project_dir}/modelserve.yaml, ray: " + "; ".join(problems))
    if "num_replicas" in values or "autoscaling_config" in values:
        checked.pop("num_replicas", None)
        checked.pop("autoscaling_config", None)
    return {**checked, **values}


def app(args: Mapping[str, Any]) -> Any:
    """The Ray Serve application of a project folder (a Ray Serve application builder).

    ``args`` are the ones `ARGUMENTS` names (``serve run modelserve.ray:app project=... num_replicas=2``
    passes them as text; a config file's ``args:`` as YAML values)::

        serve.run(modelserve.ray.app({"project": "examples/iris", "num_replicas": 2,
                                      "ray_actor_options": {"num_cpus": 1, "num_gpus": 0.5}}))

    Raises `ConfigError` for a mistake in the arguments or the project, `MissingExtraError` without Ray Serve.
    """
    try:
        deployment_plan = plan(args)
    except ConfigError as exc:
        raise _ArgumentsError(str(exc)) from None
    serve = _serve()
    ingress = serve.ingress()(Replica)
    deployment = serve.deployment(ingress, name=deployment_plan.name, **deployment_plan.options)
    return deployment.bind(deployment_plan.project, deployment_plan.settings)


def _serve() -> Any:
    try:
        from ray import serve
    except ImportError:
        raise MissingExtraError("ray[serve]", "ray") from None
    return serve


class Replica:
    """One replica: the project's app (`create_app`), loaded before Ray sends it a request.

    Ray Serve's ``serve.ingress()`` wraps it (in `app`), so that Ray's proxy hands requests to the app this
    class builds (``__serve_build_asgi_app__``); the ASGI lifespan Ray runs then closes the server at the
    replica's shutdown (async jobs released back to their queue).
    """

    async def __init__(self, project: str, settings: dict[str, Any]) -> None:  # type: ignore[misc]
        from modelserve.http import create_app

        failures: list[LoadError] = []
        self._app = create_app(
            _project_folder(project, settings.get("project_as_given")),
            on_load_error=failures.append,
            jobs_store=settings["jobs_store"],
            workers=settings["workers"],
            api_key_env=settings["api_key_env"],
            cors_origins=settings["cors_origins"],
            docs=settings["docs"],
        )
        server = self._app.server
        server.graceful_timeout = settings["graceful_timeout"]
        await server.wait_loaded()  # Ray routes to a replica once its constructor returns
        if failures:
            reasons = "; ".join(map(str, failures))
            raise LoadError(f"modelserve.ray: the project failed to load in this replica: {reasons}")
        interval = settings["metrics_interval_s"]
        #: The task that copies this replica's metrics into Ray's metrics export (None: not copied).
        self.exporter = (
            asyncio.get_running_loop().create_task(export_metrics(server.metrics, interval)) if interval else None
        )

    def __serve_build_asgi_app__(self) -> Any:
        return _OneRequestId(self._app)

    def check_health(self) -> None:
        """Ray's health check: a replica whose APIs are not all ready is replaced."""
        server = self._app.server
        if not server.ready:
            states = ", ".join(f"{name}: {api.state}" for name, api in server.apis.items())
            raise RuntimeError(f"modelserve replica not ready ({states})")


class _OneRequestId:
    """The replica's app as Ray's proxy serves it: an answer without the app's own ``X-Request-ID`` of the
    request's id, since the proxy adds that header to every answer (the id it gave the request, or the client's).

    Both at once reached the client as two equal headers, which most clients join into one value
    (``"3f2c..., 3f2c..."``). An id the app does not take from the request (the client's was not a sane token, and
    the app made its own) is left in the answer: it is the one the error body and the logs name.
    """

    def __init__(self, app: Any) -> None:
        #: The modelserve app (`create_app`'s), which every scope reaches unchanged.
        self.app = app

    @property
    def routes(self) -> Any:
        """The app's routes: Ray names the route of each request in its own metrics from them."""
        return self.app.routes

    @property
    def router(self) -> Any:
        return self.app.router

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((value for key, value in scope["headers"] if key == b"x-request-id"), None)

        async def send_once(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (key, value)
                    for key, value in message.get("headers", ())
                    if (key.lower(), value) != (b"x-request-id", given)
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_once)


async def export_metrics(metrics: Metrics, interval: float) -> None:
    """Copy a replica's metrics into Ray's metrics export every `interval` seconds, for ever.

    Every sample of the replica's registry (what its ``/metrics`` shows, less the process's own families)
    becomes a Ray gauge of the same name and labels, plus ``replica``; Ray's metrics agent on each node
    serves them to Prometheus with the prefix ``ray_`` (``ray_modelserve_requests_total``). They are
    gauges to Ray: ``rate()`` works on the counters' series all the same, and a replica that restarts starts
    its counters again from 0, as a restarted process does."""
    from ray.util.metrics import Gauge

    replica = _replica_id()
    gauges: dict[str, Any] = {}
    while True:
        metrics.flush()  # buffered observations and live gauges, as a scrape of /metrics would
        for family in metrics.registry.collect():
            if family.name.startswith(_NOT_EXPORTED):
                continue
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                gauge = gauges.get(sample.name)
                if gauge is None:
                    keys = (*sorted(sample.labels), "replica")
                    gauge = gauges[sample.name] = Gauge(sample.name, description=family.documentation, tag_keys=keys)
                gauge.set(sample.value, tags={**sample.labels, "replica": replica})
        await asyncio.sleep(interval)


def _project_folder(resolved: str, as_given: str | None) -> str:
    """Where a replica finds the project: the folder as the arguments gave it, relative to the replica's working
    directory, when it is there (a config file's ``runtime_env: working_dir`` unpacks the project on each node,
    and makes that the replicas' working directory); else the folder the builder found."""
    if as_given is not None and not os.path.isabs(as_given) and (caller_dir() / as_given).is_dir():
        return str(caller_dir() / as_given)
    return resolved


def _replica_id() -> str:
    """This replica's id in Ray Serve (its process id outside a replica)."""
    try:
        from ray import serve

        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # not in a replica, or another Ray version's context
        return str(os.getpid())
