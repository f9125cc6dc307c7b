"""The registries in modelserve/config.py: `BACKENDS` (what serves an API, by kind) and `LAYOUTS` (folders of
other model servers), and `backends.make_backend`, which builds from the first."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from modelserve.backends import Backend, backend_class
from modelserve.config import (
    BACKENDS,
    LAYOUTS,
    ApiConfig,
    CortexConfig,
    HandlerConfig,
    ModelFileConfig,
    load_project_config,
)
from modelserve.errors import LoadError


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_every_registered_backend_imports_as_a_backend(kind: str) -> None:
    cls = backend_class(kind)
    assert isinstance(cls, type) and issubclass(cls, Backend)
    assert cls.kind == kind  # GET /<api> shows the registry's name


def test_an_unknown_kind_names_the_known_ones() -> None:
    with pytest.raises(LoadError) as caught:
        backend_class("pickle")
    assert "'pickle'" in str(caught.value)
    for kind in BACKENDS:
        assert kind in str(caught.value)


MODEL = ModelFileConfig(path="model.onnx")


@pytest.mark.parametrize(
    ("api", "kind"),
    [
        (ApiConfig(name="a", handler=HandlerConfig(path="model.py")), "model_class"),
        (ApiConfig(name="a", kind="async", handler=HandlerConfig(path="handler.py")), "handler_class"),
        (ApiConfig(name="a", model=MODEL), "model_file"),
        (ApiConfig(name="a", model=MODEL, handler=HandlerConfig(path="hooks.py")), "model_file"),
        (ApiConfig(name="a", model=MODEL, handler=HandlerConfig(path="h.py", class_name="Handler")), "cortex_handler"),
        (ApiConfig(name="a", handler=HandlerConfig(path="h.py"), cortex=CortexConfig()), "cortex_handler"),
    ],
)
def test_an_apis_kind_comes_from_what_it_configures(api: ApiConfig, kind: str) -> None:
    assert api.backend == kind


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_layout_module_detects_and_loads(name: str, tmp_path: Path) -> None:
    module = importlib.import_module(LAYOUTS[name])
    assert callable(module.load)
    assert module.detect(tmp_path) is False  # an empty folder is no one's layout


def test_a_folder_of_neither_layout_nor_modelserve_is_refused(tmp_path: Path) -> None:
    from modelserve.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_project_config(tmp_path)
    assert "modelserve.yaml" in str(caught.value)
