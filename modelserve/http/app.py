"""The HTTP edge's app: `create_app` turns a project folder (or a class) into a Starlette app.

The app's routes are one `RouteTable` built by `routes()`: the server's own (``/healthz``, ``/readyz``,
``/metrics``), the realtime APIs and the async APIs' job routes. While no middleware is added the app hands
HTTP requests straight to the table (Starlette's error middleware and router would only add their cost, a
tenth of a small model's request); with middleware, the table sits behind Starlette's usual stack. Either
way, API keys, CORS and the Host check (`modelserve.http.guard`) run in front of the table when configured.

Constructing and loading the APIs starts on the app's first ASGI event, lifespan or request, so it works
whether the app runs alone or is mounted inside another app (which does not forward lifespan events);
meanwhile ``/readyz`` and the APIs answer 503.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from modelserve import project as project_module
from modelserve.codecs import JSON_TYPE
from modelserve.config import (
    TRACING_ENV,
    HandlerConfig,
    ProjectConfig,
    apply_command_line,
    class_api,
    load_project_config,
)
from modelserve.errors import ConfigError, ServiceUnavailable
from modelserve.http import specs, websocket
from modelserve.http._asgi import request_headers, send_body, send_json
from modelserve.http.access import logged
from modelserve.http.auth import named, shown_states
from modelserve.http.docs import docs_routes
from modelserve.http.errors import render, send_error
from modelserve.http.guard import Guard
from modelserve.http.routing import Handler, Route, RouteTable, TableRoute
from modelserve.http.streaming import quiet_aborts
from modelserve.project import caller_dir, prepare_environment
from modelserve.server import LoadErrorCallback, ModelServer

#: The values of ``MODELSERVE_TRACING`` that leave tracing off (in any case, as YAML reads a boolean).
_OFF = frozenset({"", "0", "false", "no", "off"})


class ServerRoutes:
    """The routes of the server itself: liveness, readiness, metrics."""

    def __init__(self, server: ModelServer) -> None:
        self.server = server

    async def healthz(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"status": "ok"}, request_headers(scope)[0])

    async def readyz(self, scope: Scope, receive: Receive, send: Send) -> None:
        """200 once every API is ready and the jobs service (of async APIs) has started, in every worker of
        ``--workers N``, else 503 naming the APIs that failed (or else those still loading, or else the jobs store,
        or else how many workers have loaded); either way ``apis`` gives each API's state in the worker that
        answers: ``loading``, ``ready`` or ``failed``. With API keys on, a request without one reads only the
        names of the APIs that ``auth.apis`` leaves open (`modelserve.http.auth.shown_states`)."""
        request_id = request_headers(scope)[0]
        every = {name: api.state for name, api in self.server.apis.items()}
        states = shown_states(scope, every)  # with API keys on, a request without one reads no guarded name
        ready, workers = self.server.workers_ready()
        if ready:
            await send_json(send, 200, {"status": "ready", "apis": states}, request_id)
            return
        failed = [name for name, state in states.items() if state == "failed"]
        loading = [name for name, state in states.items() if state == "loading"]
        hidden_failed = sum(state == "failed" for state in every.values()) - len(failed)
        hidden_loading = sum(state == "loading" for state in every.values()) - len(loading)
        if failed or hidden_failed:
            not_ready = ServiceUnavailable(f"failed to load: {named(failed, hidden_failed)}")
        elif loading or hidden_loading:
            not_ready = ServiceUnavailable(f"loading: {named(loading, hidden_loading)}")
        elif self.server.jobs_error is not None:  # every API loaded, but the jobs store did not open
            not_ready = ServiceUnavailable(f"failed to start the jobs: {self.server.jobs_error}")
        elif workers:  # this worker has loaded, another of --workers N has not
            not_ready = ServiceUnavailable(workers)
        else:  # every API loaded; the jobs service is opening its store, then starts its workers
            not_ready = ServiceUnavailable("starting: the jobs store is opening")
        not_ready.extra = {"apis": states}
        await send_error(send, not_ready, request_id)

    async def metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id, _, _, accept = request_headers(scope)
        body, content_type = self.server.metrics.negotiated(accept)  # OpenMetrics when asked for (exemplars)
        await send_body(send, 200, body, content_type, request_id)


def routes(server: ModelServer) -> list[Route]:
    """The route table of a server: its APIs' first, from the specs of the protocols its project serves
    (`modelserve.http.specs`: native routes, then V2's), then the server's own routes. Every handler writes an
    access line: the exchanges their own, at their end, the others wrapped here (`modelserve.http.access`)."""
    table = specs.routes(server)
    own = ServerRoutes(server)
    table += [
        Route("/healthz", {"GET": own.healthz}),
        Route("/readyz", {"GET": own.readyz}),
        Route("/metrics", {"GET": own.metrics}),
    ]
    table += docs_routes(server, table)  # /openapi.json describes this very table
    for route in table:  # in place: the docs read this very list
        route.handlers = {method: _logged(handler) for method, handler in route.handlers.items()}
    if server.project.tracing:  # the exchanges' routes in their server spans; off, the table is as it was
        from modelserve.tracing import install

        install().traced_routes(table)
    return table


def _logged(handler: Handler) -> Handler:
    if getattr(handler, "writes_access_line", False):  # an exchange's route (`modelserve.http.exchange`)
        return handler
    api = getattr(getattr(handler, "__self__", None), "api", None)  # an API's endpoint holds it (as auth reads it)
    return logged(handler, api.name if api is not None else None)


async def _unhandled(request: Request, exc: Exception) -> Response:
    """A failure in middleware added by the user: the usual JSON 500 instead of Starlette's plain text."""
    request_id = request_headers(request.scope)[0]
    status, body, headers = render(exc, request_id)
    response = Response(body, status, media_type=JSON_TYPE.decode())
    for key, value in headers:
        response.headers[key.decode("latin-1")] = value.decode("latin-1")
    return response


class ModelserveApp(Starlette):
    """A Starlette app that serves a `ModelServer` and starts loading it on its first ASGI event."""

    server: ModelServer

    def __init__(self, server: ModelServer, base_url: str | None, host: str | None = None) -> None:
        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            server.start()
            try:
                yield
            finally:
                await server.close()

        self.server = server
        self.table = RouteTable(routes(server))
        # The Host check, CORS and API keys (modelserve.http.guard), or the table itself when none is on.
        self._edge = Guard.of(self.table, self.table, server.project, host, server.metrics)
        self._base_url_known = base_url is not None or "MODELSERVE_URL" in os.environ
        #: True until the first request: it starts loading when no lifespan did, and notes the server's URL.
        self._first = True
        super().__init__(
            routes=[TableRoute(self._http)],
            exception_handlers={Exception: _unhandled},
            lifespan=lifespan,
        )
        self.state.modelserve = server
        quiet_aborts()

    def build_middleware_stack(self) -> ASGIApp:
        """Starlette's stack once middleware is added; else the router alone, for what `__call__` passes on
        (the lifespan)."""
        if self.user_middleware:
            return super().build_middleware_stack()
        return self.router

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Starlette's entry point; while no middleware is added, an HTTP request goes straight to the edge
        (`_http`'s work in line: no coroutine between Starlette's entry point and the edge)."""
        if scope["type"] == "http" and not self.user_middleware:
            scope["app"] = self
            if self._first:
                self._first_request(scope)
            await self._edge(scope, receive, send)
            return
        if scope["type"] == "websocket":  # the WebSocket routes, with the guard's checks (modelserve.http.websocket)
            scope["app"] = self
            if self._first:
                self._first_request(scope)
            await websocket.serve(scope, receive, send, self.table, self._edge if type(self._edge) is Guard else None)
            return
        await super().__call__(scope, receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An HTTP request reaching the table through Starlette's stack (user middleware was added)."""
        if self._first:
            self._first_request(scope)
        await self._edge(scope, receive, send)

    def _first_request(self, scope: Scope) -> None:
        """Start loading (when no lifespan did) and note the server's URL, once."""
        self._first = False
        if self.middleware_stack is None:  # as Starlette does: no middleware can be added once serving began
            self.middleware_stack = self.build_middleware_stack()
        self.server.start()
        if not self._base_url_known:
            os.environ.setdefault("MODELSERVE_URL", _base_url_of(scope))


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
    host: str | None = None,
    api_key_env: str | None = None,
    cors_origins: Sequence[str] = (),
    docs: bool = True,
    **api_options: Any,
) -> ModelserveApp:
    """Build the ASGI app of a project folder, or of one handler class given directly.

    From a folder (its ``modelserve.yaml``, a Truss folder, a Cortex project, or a lone ``model.py`` with a
    class ``Model``)::

        app = modelserve.create_app("examples/iris")

    The project folder becomes the working directory; a relative `project_dir` is relative to the folder the
    program was in, even after an earlier ``create_app`` moved into its own project folder.

    From a class, for tests and notebooks (``api_options`` are the keys of an API in modelserve.yaml)::

        app = modelserve.create_app(handler=MyModel, name="echo", config={"greeting": "hi"},
                                    max_concurrency=4)

    Mounted inside another app, it serves ``POST /ml/<api>`` with no extra wiring::

        Starlette(routes=[Mount("/ml", app=modelserve.create_app(path))])

    `jobs_store` overrides the project's ``jobs: store:`` (sqlite, memory or a redis:// URL); `workers` is the
    number of processes that will serve this project (some stores refuse more than one).

    `host` is the address the server is bound to, when the caller knows it (the CLI's ``--host``): a
    loopback address turns on the Host check against DNS rebinding (see ``allowed_hosts``).
    `api_key_env` and `cors_origins` are the CLI's ``--api-key-env`` and ``--cors-origin``, over the
    project's ``auth`` and ``cors``. API keys are read here, from the environment or the keys file.
    ``docs=False`` (the CLI's ``--no-docs``) leaves out the ``/docs`` page, as ``docs: false`` does.

    `base_url` is the URL the server is reached at (with the mount prefix); user code reads it as
    ``MODELSERVE_URL`` to call the other APIs of the same server. Raises `ConfigError` for a bad project
    folder and `LoadError` for user code that cannot be imported or has invalid signatures; either way the
    working directory is the caller's again.
    """
    if (project_dir is None) == (handler is None):
        raise ConfigError("create_app needs a project folder or a handler class (one of the two)")
    if project_dir is not None:  # else silently ignored: a project folder's APIs are its modelserve.yaml's
        given = [*(["name"] if name != "model" else []), *(["config"] if config is not None else []), *api_options]
        if given:
            raise ConfigError(
                f"create_app: {given[0]!r} is for a class given as handler=; the APIs of a project folder take "
                "theirs from its modelserve.yaml"
            )
    before, moved = _working_dir(), project_module._moved
    try:
        if project_dir is not None:
            project = load_project_config(caller_dir() / os.fspath(project_dir))
            prepare_environment(project.root, base_url)
        else:
            if base_url is not None:
                os.environ["MODELSERVE_URL"] = base_url.rstrip("/")
            api = class_api(name, HandlerConfig(config=config or {}, obj=handler), api_options, Path.cwd())
            project = ProjectConfig(root=Path.cwd(), apis=[api])
        if jobs_store is not None:
            project.jobs.store = jobs_store
        apply_command_line(project, api_key_env, cors_origins)
        project.docs = project.docs and docs
        server = ModelServer(project, on_load_error=on_load_error, workers=workers)
        if project.tracing or os.environ.get(TRACING_ENV, "").strip().lower() not in _OFF:
            from modelserve.tracing import install  # imported only when tracing is on

            project.tracing = True
            install().instrument(server)
        return ModelserveApp(server, base_url, host)
    except BaseException:
        # Loading a project moved into its folder: a project that fails leaves the caller where it was.
        if before is not None and _working_dir() != before:
            os.chdir(before)
            project_module._moved = moved  # relative paths stay relative to where the program was
        raise


def _working_dir() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the folder was removed
        return None
