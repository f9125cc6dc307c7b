"""modelserve: serve Model classes, async Handlers, ONNX and TensorFlow models over HTTP.

import modelserve
app = modelserve.create_app("path/to/project")    # an ASGI (Starlette) app
"""

from __future__ import annotations

from modelserve.config import ApiConfig, BatchingConfig, HandlerConfig, JobsConfig, ModelFileConfig, ProjectConfig
from modelserve.context import current_request_id, is_cancelled
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
    "is_cancelled",
    "logger",
    "serve",
]


def serve(project_dir: str, host: str = "127.0.0.1", port: int = 8888, **options: object) -> int:
    """Serve a project folder like ``python -m modelserve`` would; returns the exit code."""
    from modelserve.cli import main

    argv = [str(project_dir), "--host", host, "--port", str(port)]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value not in (False, None):
            argv.extend([flag, str(value)])
    return main(argv)
