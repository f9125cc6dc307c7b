"""``--reload``: restart the worker when a project file changes, except paths in ``.modelserveignore``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from socket import socket
from typing import Any

import pathspec
from uvicorn.config import Config
from uvicorn.supervisors.watchfilesreload import WatchFilesReload

IGNORE_FILE = ".modelserveignore"
_ALWAYS_IGNORED = ["__pycache__/", "*.py[cod]", ".*", "*.swp", "*~"]
_ALWAYS_WATCHED = {".env", IGNORE_FILE}


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


class ProjectReload(WatchFilesReload):
    def __init__(
        self,
        config: Config,
        target: Callable[[list[socket] | None], None],
        sockets: list[socket],
        project_dir: str,
        **kwargs: Any,
    ) -> None:
        config.reload_dirs = [project_dir]  # type: ignore[list-item]
        super().__init__(config, target, sockets)
        self.watch_filter = ProjectFilter(Path(project_dir))  # type: ignore[assignment]
