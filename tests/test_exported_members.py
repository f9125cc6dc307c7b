"""The public surface of `modelserve`, pinned: a name added to or dropped from ``__all__`` is a decision."""

from __future__ import annotations

import modelserve

PUBLIC = [
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


def test_all_is_pinned() -> None:
    assert sorted(modelserve.__all__) == PUBLIC
    assert len(set(modelserve.__all__)) == len(modelserve.__all__)


def test_every_exported_name_exists() -> None:
    namespace: dict[str, object] = {}
    exec("from modelserve import *", namespace)
    for name in PUBLIC:
        assert getattr(modelserve, name) is namespace[name], name


def test_exported_members_belong_to_modelserve() -> None:
    for name in PUBLIC:
        member = getattr(modelserve, name)
        module = getattr(member, "__module__", None) or type(member).__module__
        assert module.split(".")[0] == "modelserve", (name, module)
