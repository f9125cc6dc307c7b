"""A Model class served as Truss serves it: the constructor arguments Truss gives, and Truss's paths explained.

Truss's ``Model`` is the Model class of modelserve, so the backend registry (`modelserve.config.BACKENDS`) picks
`TrussModelClassBackend` for every Model class. Over `ModelClassBackend` it adds:

* ``environment`` (``None``: Truss's value when a deployment has no environment) and ``lazy_data_resolver``
  (`LazyDataResolver`) to what a constructor may ask for (`CONSTRUCTOR_ARGS`, in the order errors list them);
* a hint when the constructor or ``load()`` failed on a path that Baseten fills (``/app/model_cache``): the
  command that fills it (`modelserve.compat.truss_cache`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelserve.backends.model_class import ModelClassBackend, constructor_arguments, data_dir_of
from modelserve.compat.truss_cache import hint
from modelserve.errors import LoadError

if TYPE_CHECKING:
    from modelserve.config import ApiConfig
    from modelserve.metrics import MetricsClient

#: What a constructor may ask for by name (Truss's arguments, then modelserve's own).
CONSTRUCTOR_ARGS = (
    "config",
    "data_dir",
    "secrets",
    "environment",
    "lazy_data_resolver",
    "metrics_client",
    "device",
)


class LazyDataResolver:
    """Truss's ``lazy_data_resolver``: on Truss's platform it fetches ``data/`` while ``load()`` runs; here
    the data is already in the project folder, so waiting for it returns at once."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    def block_until_download_complete(self, log_stats: bool = True, issue_collect: bool = True) -> str:
        return ""

    def raise_if_not_collected(self) -> None:
        return None


def truss_arguments(api: ApiConfig, root: Path | None, metrics_client: MetricsClient) -> dict[str, Any]:
    """Everything a Truss constructor may ask for (`CONSTRUCTOR_ARGS`): modelserve's arguments
    (`modelserve.backends.model_class.constructor_arguments`) with ``environment`` and ``lazy_data_resolver``."""
    available = constructor_arguments(api, root, metrics_client)
    available["environment"] = None
    available["lazy_data_resolver"] = LazyDataResolver(data_dir_of(api, root))
    return {name: available[name] for name in CONSTRUCTOR_ARGS}


class TrussModelClassBackend(ModelClassBackend):
    """A Model class with Truss's constructor arguments and Truss's paths explained."""

    constructor_args = CONSTRUCTOR_ARGS

    def arguments(self) -> dict[str, Any]:
        return truss_arguments(self.api, self.root, self.metrics_client)

    def explain(self, error: LoadError) -> str | None:
        return hint(self.root or Path.cwd(), str(error))
