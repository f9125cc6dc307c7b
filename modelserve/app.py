"""The app factory: `create_app` turns a project folder (or a class) into a Starlette app.

User code is imported and validated when the app is created, so that a bad signature or a missing file is
an error before anything is served. Constructing and loading (``__init__`` and ``load()``) starts on the
app's first ASGI event, lifespan or request, so it works whether the app runs alone or is mounted inside
another app (which does not forward lifespan events); meanwhile ``/readyz`` and the APIs answer 503.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from modelserve.apis import Api
from modelserve.backends import make_backend
from modelserve.codecs import JSON_TYPE, encode_json
from modelserve.config import ApiConfig, HandlerConfig, ProjectConfig, load_project_config
from modelserve.context import sane_request_id
from modelserve.endpoint import RealtimeEndpoint
from modelserve.errors import ConfigError, LoadError, error_body
from modelserve.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from modelserve.metrics import ApiMetrics, Metrics, MetricsClient
from modelserve.project import prepare_environment

logger = logging.getLogger("modelserve")

LoadErrorCallback = Callable[[LoadError], None]


class ModelServer:
    """Everything one app serves: its APIs, their loading, their metrics."""

    def __init__(
        self,
        project: ProjectConfig,
        on_load_error: LoadErrorCallback | None = None,
        workers: int = 1,
    ) -> None:
        self.project = project
        self.workers = workers
        #: Seconds that running async jobs get to finish at shutdown (the CLI's --graceful-timeout).
        self.graceful_timeout = 30.0
        self.metrics = Metrics()
        self.metrics_client = MetricsClient(self.metrics)
        self.on_load_error = on_load_error
        self.apis: dict[str, Api] = {}
        self.extensions: list[Any] = []
        for config in project.apis:
            api_metrics = ApiMetrics(self.metrics, config.name)
            backend = make_backend(config, project.root, self.metrics_client, api_metrics)
            api = Api(config, backend, api_metrics)
            self.apis[config.name] = api
            self.metrics.add_refresher(api.refresh_gauges)
        self._loading: asyncio.Task[None] | None = None
        #: The realtime endpoints by route path, for `ModelserveApp`'s direct dispatch.
        self.endpoints: dict[str, RealtimeEndpoint] = {}

    @property
    def ready(self) -> bool:
        return all(api.ready for api in self.apis.values())

    def start(self) -> None:
        """Start loading every API, once, on the running loop."""
        if self._loading is None:
            self._loading = asyncio.get_running_loop().create_task(self._load_all())
            self.metrics.start()

    async def _load_all(self) -> None:
        for api in self.apis.values():
            try:
                await api.load()
            except LoadError as exc:
                logger.error("%s", exc)
                if self.on_load_error is not None:
                    self.on_load_error(exc)
                return
        for extension in self.extensions:
            try:
                await extension.start()
            except LoadError as exc:
                logger.error("%s", exc)
                if self.on_load_error is not None:
                    self.on_load_error(exc)
                return

    async def wait_loaded(self) -> None:
        """Wait until loading has ended (successfully or not)."""
        self.start()
        assert self._loading is not None
        await asyncio.shield(self._loading)

    async def close(self) -> None:
        for extension in self.extensions:
            await extension.stop()
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        for api in self.apis.values():
            await api.backend.close()
        await self.metrics.stop()

    # ---------------------------------------------------------------------------------------------
    # routes of the server itself

    async def healthz(self, request: Request) -> Response:
        return _json_response(200, {"status": "ok"}, request)

    async def readyz(self, request: Request) -> Response:
        states = {name: api.state for name, api in self.apis.items()}
        if self.ready:
            return _json_response(200, {"status": "ready", "apis": states}, request)
        request_id = _request_id(request)
        failed = [name for name, state in states.items() if state == "failed"]
        message = f"failed to load: {', '.join(failed)}" if failed else "loading"
        body = {"error": message, "request_id": request_id, "apis": states}
        return _json_response(503, body, request, headers={"retry-after": "1"})

    async def metrics_route(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type=METRICS_CONTENT_TYPE)

    def routes(self) -> list[BaseRoute]:
        routes: list[BaseRoute] = [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics_route, methods=["GET"]),
        ]
        api_routes: list[BaseRoute] = []
        async_apis = [api for api in self.apis.values() if api.config.kind == "async"]
        if async_apis:
            from modelserve.jobs.routes import Jobs

            jobs = Jobs(self, async_apis)
            self.extensions.append(jobs)
            api_routes.extend(jobs.routes())
        for api in self.apis.values():
            if api.config.kind != "async":
                endpoint = RealtimeEndpoint(api)
                paths = [f"/{api.name}", "/"] if len(self.apis) == 1 else [f"/{api.name}"]
                for path in paths:
                    api_routes.append(Route(path, endpoint, methods=["GET", "POST"]))
                    self.endpoints[path] = endpoint
        # The APIs first: they take the traffic, and every route tried before one costs a regex match.
        return api_routes + routes


def _request_id(request: Request) -> str:
    return sane_request_id(request.headers.get("x-request-id"))


def _json_response(status: int, body: Any, request: Request, headers: dict[str, str] | None = None) -> Response:
    response = Response(encode_json(body), status_code=status, media_type=JSON_TYPE.decode(), headers=headers)
    response.headers["x-request-id"] = _request_id(request)
    return response


async def _http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    request_id = _request_id(request)
    if exc.status_code == 404:
        message = f"no API at {request.url.path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    headers = dict(exc.headers or {})
    headers["x-request-id"] = request_id
    return Response(error_body(message, request_id), exc.status_code, headers=headers, media_type="application/json")


async def _server_error(request: Request, exc: Exception) -> Response:
    request_id = _request_id(request)
    logger.error("unhandled error while serving %s: %r", request.url.path, exc, exc_info=exc)
    body = error_body("internal server error", request_id)
    return Response(body, 500, headers={"x-request-id": request_id}, media_type="application/json")


class ModelserveApp(Starlette):
    """A Starlette app that starts loading its APIs on its first ASGI event.

    ``GET`` and ``POST`` to a realtime API go straight to its endpoint: the endpoint answers every error
    itself, so Starlette's error middleware and router would only add their cost (several microseconds a
    request, a tenth of a small model's). Everything else, and everything once middleware has been added
    to the app, takes the usual Starlette path (routes, 404, 405, error handlers).
    """

    server: ModelServer

    def __init__(self, server: ModelServer, base_url: str | None) -> None:
        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            server.start()
            try:
                yield
            finally:
                await server.close()

        super().__init__(
            routes=server.routes(),
            exception_handlers={HTTPException: _http_exception, Exception: _server_error},
            lifespan=lifespan,
        )
        self.server = server
        self.state.modelserve = server
        self._base_url_known = base_url is not None or "MODELSERVE_URL" in os.environ

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.server._loading is None:
            self.server.start()
        if scope["type"] == "http":
            if not self._base_url_known:
                self._base_url_known = True
                os.environ.setdefault("MODELSERVE_URL", _base_url_of(scope))
            endpoint = self.server.endpoints.get(_route_path(scope))
            if endpoint is not None and not self.user_middleware and scope["method"] in _DIRECT_METHODS:
                scope["app"] = self
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


_DIRECT_METHODS = frozenset(("GET", "POST"))


def _route_path(scope: Scope) -> str:
    """The path below the mount point (Starlette keeps the full path and puts the prefix in root_path)."""
    path: str = scope["path"]
    root_path = scope.get("root_path")
    if root_path and path.startswith(root_path + "/"):
        return path[len(root_path) :]
    return path


def _base_url_of(scope: Scope) -> str:
    server = scope.get("server") or ("127.0.0.1", 80)
    host, port = server[0], server[1]
    netloc = host if port is None else f"{host}:{port}"  # a unix socket or a test transport has no port
    return f"{scope.get('scheme', 'http')}://{netloc}{scope.get('root_path', '')}".rstrip("/")


def create_app(
    project_dir: str | os.PathLike[str] | None = None,
    *,
    handler: type | None = None,
    name: str = "model",
    config: dict[str, Any] | None = None,
    base_url: str | None = None,
    on_load_error: LoadErrorCallback | None = None,
    jobs_store: str | None = None,
    workers: int = 1,
    **api_options: Any,
) -> ModelserveApp:
    """Build the ASGI app of a project folder, or of one handler class given directly.

    From a folder (its ``modelserve.yaml``, or a lone ``model.py`` with a class ``Model``)::

        app = modelserve.create_app("examples/iris")

    From a class, for tests and notebooks (``api_options`` are the keys of an API in modelserve.yaml)::

        app = modelserve.create_app(handler=MyModel, name="echo", config={"greeting": "hi"},
                                    max_concurrency=4)

    Mounted inside another app, it serves ``POST /ml/<api>`` with no extra wiring::

        Starlette(routes=[Mount("/ml", app=modelserve.create_app(path))])

    `jobs_store` overrides the project's ``jobs: store:`` (sqlite, memory or a redis:// URL); `workers` is the
    number of processes that will serve this project (some stores refuse more than one).

    `base_url` is the URL the server is reached at (with the mount prefix); user code reads it as
    ``MODELSERVE_URL`` to call the other APIs of the same server. Raises `ConfigError` for a bad project
    folder and `LoadError` for user code that cannot be imported or has invalid signatures.
    """
    if (project_dir is None) == (handler is None):
        raise ConfigError("create_app needs a project folder or a handler class (one of the two)")
    if project_dir is not None:
        project = load_project_config(os.fspath(project_dir))
        prepare_environment(project.root, base_url)
    else:
        if base_url is not None:
            os.environ["MODELSERVE_URL"] = base_url.rstrip("/")
        api = ApiConfig(name=name, handler=HandlerConfig(config=config or {}, obj=handler))
        for key, value in api_options.items():
            if not hasattr(api, key) or key in ("name", "handler"):
                raise ConfigError(f"create_app: unknown API option {key!r}")
            setattr(api, key, value)
        project = ProjectConfig(root=Path.cwd(), apis=[api])
    if jobs_store is not None:
        project.jobs.store = jobs_store
    server = ModelServer(project, on_load_error=on_load_error, workers=workers)
    return ModelserveApp(server, base_url)
