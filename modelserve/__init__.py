"""modelserve: serve Model classes, async Handlers, ONNX and TensorFlow models over HTTP.

import modelserve
app = modelserve.create_app("path/to/project")    # an ASGI (Starlette) app
"""

from __future__ import annotations

from modelserve.config import ApiConfig, BatchingConfig, HandlerConfig, JobsConfig, ModelFileConfig, ProjectConfig
from modelserve.context import current_request_id, is_cancelled
from modelserve.devices import device
from modelserve.errors import (
    BadRequest,
    ConfigError,
    HTTPError,
    LoadError,
    MissingExtraError,
    ModelserveError,
)
from modelserve.http import ModelserveApp, create_app
from modelserve.logs import logger
from modelserve.metrics import MetricsClient

__version__ = "0.1.0"

__all__ = [
    "ApiConfig",
    "BadRequest",
    "BatchingConfig",
    "ConfigError",
    "HTTPError",
    "HandlerConfig",
    "JobsConfig",
    "LoadError",
    "MetricsClient",
    "MissingExtraError",
    "ModelFileConfig",
    "ModelserveApp",
    "ModelserveError",
    "ProjectConfig",
    "create_app",
    "current_request_id",
    "device",
    "is_cancelled",
    "logger",
    "serve",
]


def serve(project_dir: str, host: str = "127.0.0.1", port: int = 8888, **options: object) -> int:
    """Serve a project folder like ``python -m modelserve`` would; returns the exit code.

    `options` are the command line's options, ``_`` for ``-``: ``log_format="json"``, ``reload=True``,
    ``docs=False`` and ``access_log=False`` (``--no-docs``, ``--no-access-log``), a list for a repeatable option
    (``cors_origin=["https://a.example", "https://b.example"]``).

    A relative `project_dir` is relative to the folder the program was in. With ``workers=N`` or
    ``reload=True`` the worker processes re-import the script that called `serve` (Python's ``spawn``);
    there this call returns 0 at once instead of serving again, so a plain script needs no
    ``if __name__ == "__main__":`` guard (the script's other top-level code still runs in each worker).
    """
    import sys

    caller = sys._getframe(1).f_globals.get("__name__")
    if caller == "__mp_main__":  # a worker process importing the user's script: the parent serves
        return 0
    from modelserve.cli import command_line, main
    from modelserve.project import caller_dir

    return main([str(caller_dir() / project_dir), "--host", host, "--port", str(port), *command_line(options)])
