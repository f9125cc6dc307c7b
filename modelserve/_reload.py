"""``--reload``: restart the worker when a project file changes, except paths in ``.modelserveignore``.

`ProjectReload` is a uvicorn reloader built on uvicorn's public `BaseReload`: `should_restart` watches the
project folder with ``watchfiles`` and keeps the changes that `ProjectFilter` lets through. While the project
cannot be loaded (a syntax error, a bad import, a typo in modelserve.yaml), the worker serves `failed_app`,
which answers 503 naming the error (file and line), and the next saved change loads the project again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from socket import socket

import pathspec
import watchfiles
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.supervisors.basereload import BaseReload

IGNORE_FILE = ".modelserveignore"
_ALWAYS_IGNORED = ["__pycache__/", "*.py[cod]", ".*", "*.swp", "*~"]
_ALWAYS_WATCHED = {".env", IGNORE_FILE}

logger = logging.getLogger("modelserve")


class ProjectFilter:
    """True for a changed path that should restart the server."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        patterns = list(_ALWAYS_IGNORED)
        ignore_file = self.root / IGNORE_FILE
        if ignore_file.is_file():
            patterns.extend(ignore_file.read_text(encoding="utf-8").splitlines())
        self.spec = pathspec.GitIgnoreSpec.from_lines(patterns)

    def __call__(self, path: Path) -> bool:
        try:
            relative = Path(path).resolve().relative_to(self.root)
        except ValueError:
            return False
        if relative.name in _ALWAYS_WATCHED and len(relative.parts) == 1:
            return True
        return not self.spec.match_file(relative.as_posix())


class ProjectReload(BaseReload):
    """Restarts the worker process when a file of the project that `ProjectFilter` lets through changes."""

    def __init__(
        self,
        config: Config,
        target: Callable[[list[socket] | None], None],
        sockets: list[socket],
        project_dir: str,
    ) -> None:
        super().__init__(config, target, sockets)
        self.reloader_name = "WatchFiles"
        self.root = Path(project_dir)
        self.filter = ProjectFilter(self.root)
        self.watcher = watchfiles.watch(
            self.root,
            watch_filter=None,  # ProjectFilter decides, with the project's own ignore file
            stop_event=self.should_exit,
            yield_on_timeout=True,  # so that should_exit is seen while nothing changes
            ignore_permission_denied=True,
        )

    def should_restart(self) -> list[Path] | None:
        self.pause()
        changes = next(self.watcher)
        if not changes:
            return None
        paths = {Path(path) for _, path in changes}
        if any(path.name == IGNORE_FILE for path in paths):
            self.filter = ProjectFilter(self.root)
        return [path for path in paths if self.filter(path)] or None


def failed_app(error: Exception) -> ASGIApp:
    """What a ``--reload`` worker serves while the project cannot be loaded: 503 with the error on every route
    but ``/healthz`` (the process is alive, and restarts at the next saved change)."""
    from modelserve.errors import ServiceUnavailable
    from modelserve.http._asgi import request_headers, send_json
    from modelserve.http.errors import send_error

    message = f"the project failed to load; fix it and save to reload: {error}"
    logger.error("%s", message)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                event = await receive()
                if event["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif event["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        request_id = request_headers(scope)[0]
        if scope["path"] == "/healthz":
            await send_json(send, 200, {"status": "ok"}, request_id)
        else:
            await send_error(send, ServiceUnavailable(message), request_id)

    return app
