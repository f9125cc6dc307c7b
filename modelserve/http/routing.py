"""The route table: every path the server answers, with its methods, in one list.

A `Route` maps explicit methods to raw ASGI handlers: ``GET`` describes or reads, ``POST`` runs or submits,
``DELETE`` cancels. ``HEAD`` is always derived from ``GET`` (the same handler, its body dropped), so it can
never run, submit or cancel anything. Any other method is a JSON 405 with an ``Allow`` header, an unknown
path a JSON 404, both through the error map.

`RouteTable` dispatches by exact path (a dict lookup), plus one trailing path parameter (``/<api>/{job_id}``),
and last a trailing ``{name:path}`` parameter that takes the rest of a path (``/v2/models/{rest:path}``, which
answers V2's unknown models), tried only when nothing else matched.
The app calls it directly while no middleware was added; with middleware it sits behind Starlette's router
as a single `TableRoute`, so both ways dispatch from the same table and cannot disagree.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from starlette.datastructures import URLPath
from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import Receive, Scope, Send

from modelserve.context import sane_request_id
from modelserve.errors import MethodNotAllowed, NotFound
from modelserve.http._asgi import header, without_body
from modelserve.http.access import answering
from modelserve.http.errors import send_error

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]
#: The methods a route may name; HEAD comes with GET.
METHODS = ("GET", "POST", "DELETE")


@dataclass
class Route:
    """One path and its handlers by method. A path may end with one parameter: ``/jobs/{job_id}``."""

    path: str
    handlers: dict[str, Handler]
    allowed: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        unknown = set(self.handlers) - set(METHODS)
        if unknown:
            raise ValueError(f"route {self.path}: methods {sorted(unknown)} are not allowed (HEAD comes with GET)")
        methods = [method for method in METHODS if method in self.handlers]
        if "GET" in self.handlers:
            methods.insert(1, "HEAD")
        self.allowed = tuple(methods)

    @property
    def parameter(self) -> tuple[str, str] | None:
        """(prefix, name) of a route ending with a parameter, else None (a ``{name:path}`` one included)."""
        prefix, sep, last = self.path.rpartition("/")
        if last.startswith("{") and last.endswith("}"):
            return prefix + sep, last[1:-1]
        return None

    @property
    def rest(self) -> tuple[str, str] | None:
        """(prefix, name) of a route ending with ``{name:path}``, which takes the rest of a path, else None."""
        parameter = self.parameter
        if parameter is not None and parameter[1].endswith(":path"):
            return parameter[0], parameter[1][: -len(":path")]
        return None


class RouteTable:
    """Dispatches requests to the handlers of its routes."""

    def __init__(self, routes: Iterable[Route]) -> None:
        self.routes = list(routes)
        self.exact: dict[str, Route] = {}
        self.prefixed: dict[str, tuple[Route, str]] = {}
        self.rests: dict[str, tuple[Route, str]] = {}
        for route in self.routes:
            parameter = route.parameter
            rest = route.rest
            if route.path in self.exact or (parameter is not None and parameter[0] in self.prefixed):
                raise ValueError(f"two routes for {route.path!r}")
            if rest is not None:
                if rest[0] in self.rests:
                    raise ValueError(f"two routes for {route.path!r}")
                self.rests[rest[0]] = (route, rest[1])
            elif parameter is None:
                self.exact[route.path] = route
            else:
                self.prefixed[parameter[0]] = (route, parameter[1])
        #: The send of an answer the table makes itself (404, 405), which writes its access line.
        self._answering = answering()

    def match(self, path: str) -> tuple[Route, dict[str, str]] | None:
        route = self.exact.get(path)
        if route is not None:
            return route, {}
        prefix, sep, last = path.rpartition("/")
        found = self.prefixed.get(prefix + sep) if last else None
        if found is not None:
            return found[0], {found[1]: last}
        for start, (route, name) in self.rests.items():
            if path.startswith(start) and len(path) > len(start):
                return route, {name: path[len(start) :]}
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        root_path = scope.get("root_path")
        if root_path:
            path = route_path(scope)
        method = scope["method"]
        route = self.exact.get(path)
        if route is None:
            found = self.match(path)
            if found is None:
                unknown = NotFound(f"no API at {path}")
                await send_error(_for(method, self._answering(scope, send)), unknown, _request_id(scope))
                return
            route, scope["path_params"] = found
        handler = route.handlers.get(method)
        if handler is None:
            if method == "HEAD" and "GET" in route.handlers:
                await route.handlers["GET"](scope, receive, without_body(send))
                return
            error = MethodNotAllowed(method, path, route.allowed)
            await send_error(_for(method, self._answering(scope, send)), error, _request_id(scope))
            return
        await handler(scope, receive, send)


def route_path(scope: Scope) -> str:
    """The path below the mount point (Starlette keeps the full path and puts the prefix in root_path)."""
    path: str = scope["path"]
    root_path = scope.get("root_path")
    if root_path and path.startswith(root_path + "/"):
        return path[len(root_path) :]
    return path


def _for(method: str, send: Send) -> Send:
    return without_body(send) if method == "HEAD" else send


def _request_id(scope: Scope) -> str:
    return sane_request_id(header(scope, b"x-request-id"))


class TableRoute(BaseRoute):
    """The whole table as one Starlette route, for an app with middleware (it answers its own 404s)."""

    def __init__(self, app: Handler) -> None:
        self.app = app

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        return (Match.FULL, {}) if scope["type"] == "http" else (Match.NONE, {})

    def url_path_for(self, name: str, /, **path_params: Any) -> URLPath:
        raise NoMatchFound(name, path_params)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)
