"""The model repository of a server: the versions of its versioned APIs, and loading and unloading APIs while
it serves.

A model API whose path is a folder of numbered versions (`modelserve.versions`) is served as one `Api` per
version its policy selects, each built from the API's configuration with the model path of its version
(`version_configs`): its own backend, line and limits, the same name and metrics. ``server.apis[name]`` is
the version that unversioned calls reach, the highest ready one (`Versions.current`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from modelserve.api import Api
from modelserve.backends import make_backend
from modelserve.config import ApiConfig
from modelserve.errors import BadRequest, ConfigError, LoadError
from modelserve.versions import model_in, version_folders

logger = logging.getLogger("modelserve")


def version_configs(config: ApiConfig, root: Path) -> dict[int, ApiConfig]:
    """Each served version of a versioned model API as a configuration of its own, by version number; empty
    for any other API. The folders are listed again now (the project may have gained one)."""
    model = config.model
    if model is None or model.version_policy is None:
        return {}
    folders = version_folders(root / model.path)
    configs = {}
    for number in model.version_policy.select(list(folders)):
        found = model_in(folders[number])
        if found is None:
            raise LoadError(
                f"api '{config.name}': {model.path}/{number} holds no model (a model.onnx, one .onnx file or a "
                "SavedModel)"
            )
        path = Path(model.path, str(number)) if found == folders[number] else Path(model.path, str(number), found.name)
        configs[number] = replace(config, model=replace(model, path=str(path)))
    return configs


class Versions:
    """The served versions of one API, by number."""

    def __init__(self, name: str, apis: dict[int, Api]) -> None:
        self.name = name
        self.apis = apis

    def current_number(self) -> int:
        """The highest ready version, or the highest one while none is ready (it answers 503 meanwhile)."""
        ready = [number for number, api in self.apis.items() if api.ready]
        return max(ready or self.apis)

    def current(self) -> Api:
        return self.apis[self.current_number()]

    def numbers(self) -> list[str]:
        return [str(number) for number in sorted(self.apis)]


#: Triton's states of a model in the repository index.
READY, UNAVAILABLE, LOADING = "READY", "UNAVAILABLE", "LOADING"
#: How often an unload looks whether the requests in flight are done.
DRAIN_POLL = 0.01


def _idle(api: Api) -> bool:
    limiter = api.limiter
    return not (limiter.running or limiter.waiting or limiter.admitted)


class Repository:
    """Loading and unloading a server's APIs while it serves (the V2 repository extension).

    With model control ``none`` (the default) every API loads at start and load or unload requests are refused;
    with ``explicit`` (`explicit`) the APIs named load at start (all of them when none is named), and the others
    wait for a load request. A load of an API that serves loads a new backend beside the one serving and
    switches once it is ready; a load of a versioned API lists its folder again, loads the versions its policy
    selects now beside the others and retires the ones it no longer selects. An unload lets the requests in
    flight finish before the model is freed. Loading runs in worker threads (the backends' own `load`), never
    on the event loop.
    """

    def __init__(self, server: Any) -> None:
        self.server = server
        self.control = "none"
        #: The configuration of each API, by name (a versioned API's versions are made from it).
        self.configs = {config.name: config for config in server.project.apis}
        #: Called after a load or an unload (the gRPC health service follows the APIs' readiness).
        self.on_change: list[Callable[[], Awaitable[None]]] = []
        self._busy: dict[str, asyncio.Lock] = {}

    def explicit(self, names: list[str]) -> None:
        """Model control explicit: only the APIs named load at start (every one when `names` is empty)."""
        unknown = [name for name in names if name not in self.configs]
        if unknown:
            raise ConfigError(f"--load-model: no API named {', '.join(map(repr, unknown))} in the project")
        self.control = "explicit"
        for api in self.server.all_apis():
            if names and api.name not in names:
                api.state = "unloaded"

    def _check(self, name: str, action: str) -> None:
        if self.control != "explicit":
            raise BadRequest(
                f"failed to {action} '{name}': explicit model {action} is not allowed; start the server with "
                "--model-control explicit"
            )
        if name not in self.configs or self.configs[name].kind != "realtime":
            raise BadRequest(f"failed to {action} '{name}', failed to poll from model repository")

    @staticmethod
    def check_parameters(action: str, name: str, keys: Iterable[str]) -> None:
        """A load or unload request's parameters: Triton's model configuration and files are refused (a model's
        configuration is its project's modelserve.yaml); ``unload_dependents`` is accepted (no model here has
        dependents)."""
        refused = sorted(key for key in keys if key != "unload_dependents")
        if refused:
            raise BadRequest(
                f"failed to {action} '{name}': modelserve takes no {', '.join(repr(k[:60]) for k in refused)} "
                f"parameter in a {action} request (a model's configuration is its project's modelserve.yaml)"
            )

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Every model of the repository, one entry per version: name, version, state and reason."""
        entries = []
        for name, config in self.configs.items():
            if config.kind != "realtime":
                continue
            versions = self.server.versions.get(name)
            apis = sorted(versions.apis.items()) if versions is not None else [(1, self.server.apis[name])]
            for number, api in apis:
                state = READY if api.ready else (LOADING if api.state == "loading" else UNAVAILABLE)
                if ready_only and state != READY:
                    continue
                reason = api.error or ("unloaded" if api.state == "unloaded" else "")
                entries.append({"name": name, "version": str(number), "state": state, "reason": reason})
        return entries

    async def load(self, name: str) -> None:
        """Load (or reload) the API `name`; returns once it serves. `LoadError` when it failed to."""
        self._check(name, "load")
        async with self._busy.setdefault(name, asyncio.Lock()):
            versions = self.server.versions.get(name)
            if versions is None:
                await self._reload(self.server.apis[name])
            else:
                await self._load_versions(versions, self.configs[name])
        await self._changed()

    async def unload(self, name: str) -> None:
        """Unload the API `name` (every version): new calls are refused, those in flight finish first."""
        self._check(name, "unload")
        async with self._busy.setdefault(name, asyncio.Lock()):
            versions = self.server.versions.get(name)
            for api in versions.apis.values() if versions is not None else [self.server.apis[name]]:
                await self._retire(api)
        await self._changed()

    async def _reload(self, api: Api) -> None:
        """A new backend of `api` loaded beside the one serving (if any), then switched to."""
        backend = make_backend(api.config, self.server.project.root, self.server.metrics_client, api.metrics)
        freed = api.state == "unloaded"  # its backend was closed by the unload (or never loaded)
        if not api.ready:
            api.state, api.error = "loading", None
        try:
            await backend.load()
            if api.config.batching is not None:
                backend.pipeline = backend.pipeline.limited(api.config.max_concurrency)
        except Exception as exc:
            await backend.close()
            if not api.ready:
                api.state, api.error = "failed", f"{type(exc).__name__}: {exc}"
            raise LoadError(f"failed to load '{api.name}': {exc}") from exc
        old, was_ready = api.backend, api.ready
        api.backend = backend
        api.state, api.ready, api.error = "ready", True, None
        logger.info("api '%s' is loaded (model control)", api.name)
        if was_ready:  # the calls that began on the old backend end there; then it is freed
            await self._drained(api)
        if not freed:
            await old.close()

    async def _load_versions(self, versions: Versions, config: ApiConfig) -> None:
        selected = version_configs(config, self.server.project.root)
        for number, version_config in sorted(selected.items()):
            api = versions.apis.get(number)
            if api is None:
                api = self.server.make_api(version_config)
                await api.load()  # beside the others: it joins them once ready
                versions.apis[number] = api
            elif not api.ready:
                await self._reload(api)
        for number in [number for number in versions.apis if number not in selected]:
            retired = versions.apis.pop(number)  # no new call reaches it; those in flight finish
            await self._retire(retired, routed=False)
        if selected:
            self.server.apis[config.name] = versions.apis[max(selected)]

    async def _retire(self, api: Api, routed: bool = True) -> None:
        """Stop `api` taking calls (when it is still `routed` to), let those in flight finish, free its model."""
        if routed:
            api.ready = False
        await self._drained(api)
        api.ready, api.state = False, "unloaded"
        await api.backend.close()
        logger.info("api '%s' is unloaded (model control)", api.name)

    @staticmethod
    async def _drained(api: Api) -> None:
        while not _idle(api):
            await asyncio.sleep(DRAIN_POLL)

    async def _changed(self) -> None:
        for listener in self.on_change:
            await listener()
