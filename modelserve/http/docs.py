"""The routes of the OpenAPI document and of its interactive page.

``GET /openapi.json`` is the document of the whole server, ``GET /openapi/<api>.json`` the one of a single
API (a path of its own, so that it cannot be taken for a job id under ``/<api>/``), ``GET /docs`` Swagger UI
showing the document. The page's files are served from the ``swagger-ui-bundle-v2`` package
(the ``schema`` extra), never from a CDN, so it works without internet access; without the
package ``/docs`` is a 404 that says what to install. ``docs: false`` in modelserve.yaml (or ``--no-docs``)
removes ``/docs``; the document stays.
"""

from __future__ import annotations

import mimetypes
from functools import cache
from pathlib import Path
from typing import Any

from starlette.types import Receive, Scope, Send

from modelserve.errors import NotFound, install_hint
from modelserve.http._asgi import request_headers, send_body, send_json
from modelserve.http.errors import send_error
from modelserve.http.openapi import document
from modelserve.http.routing import Route
from modelserve.server import ModelServer

#: The files of Swagger UI the page loads, below ``/docs/``.
ASSETS = ("swagger-ui.css", "swagger-ui-bundle.js", "favicon-32x32.png")
_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>{title}</title>
  <link rel="stylesheet" href="docs/swagger-ui.css">
  <link rel="icon" type="image/png" href="docs/favicon-32x32.png">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="docs/swagger-ui-bundle.js"></script>
  <script>SwaggerUIBundle({{url: "openapi.json", dom_id: "#swagger-ui", deepLinking: true}});</script>
</body>
</html>
"""
_MISSING = f"the /docs page needs Swagger UI's files (swagger-ui-bundle-v2): {install_hint('schema')}"


@cache
def swagger_ui_folder() -> Path | None:
    """Swagger UI's files, from the swagger-ui-bundle-v2 package (5.x: the first to read OpenAPI 3.1)."""
    try:
        import swagger_ui_bundle
    except ImportError:
        return None
    folder = Path(swagger_ui_bundle.swagger_ui_path)
    major = folder.name.rpartition("-")[2].split(".")[0]
    if not major.isdigit() or int(major) < 5 or not (folder / "swagger-ui-bundle.js").is_file():
        return None
    return folder


class DocsRoutes:
    """The handlers of ``/openapi.json``, ``/openapi/<api>.json``, ``/docs`` and its files."""

    def __init__(self, server: ModelServer, routes: list[Route]) -> None:
        self.server = server
        #: The whole route table, read when a document is asked for (this list is the table being built).
        self.routes = routes
        self._documents: dict[str | None, dict[str, Any]] = {}

    def _document(self, api: str | None, scope: Scope) -> dict[str, Any]:
        doc = self._documents.get(api)
        if doc is None:
            doc = document(self.server, self.routes, api)
            if self.server.ready:  # a model file's inputs are known once it has loaded: keep it from then on
                self._documents[api] = doc
        root_path = scope.get("root_path")
        return {**doc, "servers": [{"url": root_path}]} if root_path else doc

    async def openapi(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, self._document(None, scope), request_headers(scope)[0])

    async def openapi_of_api(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = request_headers(scope)[0]
        name, dot_json, rest = scope["path_params"]["api"].rpartition(".json")
        if rest or not dot_json or name not in self.server.apis:
            known = ", ".join(f"/openapi/{api}.json" for api in self.server.apis)
            await send_error(send, NotFound(f"no API document at {scope['path']}; the APIs': {known}"), request_id)
            return
        await send_json(send, 200, self._document(name, scope), request_id)

    async def docs(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = request_headers(scope)[0]
        if swagger_ui_folder() is None:
            await send_error(send, NotFound(_MISSING), request_id)
            return
        page = _PAGE.format(title="modelserve API docs").encode()
        await send_body(send, 200, page, b"text/html; charset=utf-8", request_id)

    async def asset(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = request_headers(scope)[0]
        name = scope["path_params"]["asset"]
        folder = swagger_ui_folder()
        if folder is None or name not in ASSETS:
            await send_error(send, NotFound(_MISSING if folder is None else f"no file {name!r} in /docs"), request_id)
            return
        body = _read(folder / name)
        media_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        cache = [(b"cache-control", b"public, max-age=86400")]
        await send_body(send, 200, body, media_type.encode(), request_id, cache)


@cache
def _read(path: Path) -> bytes:
    return path.read_bytes()


def docs_routes(server: ModelServer, routes: list[Route]) -> list[Route]:
    """The document's routes, and the page's unless the project turned it off (``docs: false``)."""
    own = DocsRoutes(server, routes)
    table = [
        Route("/openapi.json", {"GET": own.openapi}),
        Route("/openapi/{api}", {"GET": own.openapi_of_api}),
    ]
    if server.project.docs:
        table += [Route("/docs", {"GET": own.docs}), Route("/docs/{asset}", {"GET": own.asset})]
    return table
