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
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from modelserve.api import Api
from modelserve.backends import Backend, make_backend
from modelserve.config import ApiConfig
from modelserve.errors import BadRequest, ConfigError, LoadError, shorten
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
        #: The loads and unloads under way (`_to_the_end`), and the backends to free once idle (`_free_when_idle`).
        self._tasks: set[asyncio.Task[None]] = set()

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
                f"failed to {action} {shorten(name)}: explicit model {action} is not allowed; start the server with "
                "--model-control explicit"
            )
        if name not in self.configs or self.configs[name].kind != "realtime":
            raise BadRequest(f"failed to {action} {shorten(name)}, failed to poll from model repository")

    def requested_config(self, action: str, name: str, parameters: Mapping[str, Any]) -> ApiConfig | None:
        """The configuration a load or unload request asks for: None for the project's own, or the project's
        with the fields of Triton's model configuration (the ``config`` parameter, JSON) that map onto it
        applied (`CONFIG_FIELDS`). Everything else is refused, before anything loads: the rest of a model's
        configuration, and a model's files (``file:<path>`` parameters), are its project's modelserve.yaml.
        ``unload_dependents`` is accepted (no model here has dependents)."""
        refused = sorted(key for key in parameters if key not in ("unload_dependents", "config"))
        if refused:
            raise BadRequest(
                f"failed to {action} {shorten(name)}: modelserve takes no {', '.join(repr(k[:60]) for k in refused)} "
                f"parameter in a {action} request (a model's files and configuration are its project's "
                "modelserve.yaml)"
            )
        text = parameters.get("config")
        if text is None:
            return None
        if action != "load":
            raise BadRequest(f"failed to {action} {shorten(name)}: the 'config' parameter is taken by a load only")
        if not isinstance(text, str):
            raise BadRequest(f"failed to load {shorten(name)}: the 'config' parameter must be a string of JSON")
        self._check(name, action)
        return overridden(self.configs[name], text)

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

    async def load(self, name: str, config: ApiConfig | None = None) -> None:
        """Load (or reload) the API `name`, with `config` (`requested_config`) or else its project's
        configuration; returns once it serves. `LoadError` when it failed to."""
        self._check(name, "load")
        await self._to_the_end(self._load(name, config or self.configs[name]))

    async def unload(self, name: str) -> None:
        """Unload the API `name` (every version): new calls are refused, those in flight finish first."""
        self._check(name, "unload")
        await self._to_the_end(self._unload(name))

    async def _to_the_end(self, work: Coroutine[Any, Any, None]) -> None:
        """Run a load or an unload to its end even when its caller is cancelled (a gRPC client's deadline
        passes while the calls in flight drain): cut short, it would leave the API refusing calls without being
        unloaded, or a new backend loaded and never switched to or freed. A failure nobody waits for is
        logged."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_log_failure)
            raise

    async def _load(self, name: str, config: ApiConfig) -> None:
        async with self._busy.setdefault(name, asyncio.Lock()):
            versions = self.server.versions.get(name)
            await self._started(versions.apis.values() if versions is not None else [self.server.apis[name]])
            if versions is None:
                await self._reload(self.server.apis[name], config)
            else:
                await self._load_versions(versions, config)
        await self._changed()

    async def _unload(self, name: str) -> None:
        async with self._busy.setdefault(name, asyncio.Lock()):
            versions = self.server.versions.get(name)
            apis = list(versions.apis.values()) if versions is not None else [self.server.apis[name]]
            await self._started(apis)
            for api in apis:
                await self._retire(api)
        await self._changed()

    @staticmethod
    async def _started(apis: Iterable[Api]) -> None:
        """Wait until the loading the server began at start has ended for each of `apis` (under the API's lock,
        nothing else loads one): an unload meanwhile was answered, then undone when that load ended; a load
        meanwhile closed the backend being loaded."""
        while any(api.state == "loading" for api in apis):
            await asyncio.sleep(DRAIN_POLL)

    async def _reload(self, api: Api, config: ApiConfig) -> None:
        """A new backend of `api` with `config` loaded beside the one serving (if any), then switched to."""
        backend = make_backend(config, self.server.project.root, self.server.metrics_client, api.metrics)
        freed = api.state == "unloaded"  # its backend was closed by the unload (or never loaded)
        if not api.ready:
            api.state, api.error = "loading", None
        try:
            await backend.load()
            if config.batching is not None:
                backend.pipeline = backend.pipeline.limited(config.max_concurrency)
        except Exception as exc:
            await backend.close()
            if not api.ready:
                api.state, api.error = "failed", f"{type(exc).__name__}: {exc}"
            raise LoadError(f"failed to load '{api.name}': {exc}") from exc
        old, was_ready = api.backend, api.ready
        api.backend = backend
        if config.batching != api.config.batching and config.batching is not None:
            # One more full batch than those running is admitted (`Api`); a larger batch admits more. Slots
            # beyond the old count are taken by new calls once the line that waits now has gone through.
            api.limiter.max_concurrency = (config.max_concurrency + 1) * config.batching.max_batch_size
        api.config = config
        api.state, api.ready, api.error = "ready", True, None
        logger.info("api '%s' is loaded (model control)", api.name)
        if was_ready:  # the calls that began on the old backend end there; then it is freed, not waited for
            self._in_background(self._free_when_idle(api, old))
        elif not freed:
            await old.close()

    async def _free_when_idle(self, api: Api, old: Backend) -> None:
        """Close `old`, the backend `api` served with before a load, once no call of `api` runs or waits. The
        calls of `api` are not told apart by backend, so this waits for a moment when none runs at all: the load
        that waited for it answered only then, which under steady traffic was never (and held every later load
        and unload of the API behind it)."""
        await self._drained(api)
        await old.close()
        logger.info("api '%s': the backend it served before the load is closed", api.name)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)

    async def _load_versions(self, versions: Versions, config: ApiConfig) -> None:
        selected = version_configs(config, self.server.project.root)
        if not selected:  # with no version left, nothing would answer its routes (they answered 500)
            path = config.model.path if config.model is not None else ""
            found = sorted(version_folders(self.server.project.root / path))
            raise LoadError(
                f"failed to load '{config.name}': its version_policy selects none of the versions {found} in "
                f"{path!r}; the versions it serves stay"
            )
        for number, version_config in sorted(selected.items()):
            api = versions.apis.get(number)
            if api is None:
                api = self.server.make_api(version_config)
                try:
                    await api.load()  # beside the others: it joins them once ready
                except BaseException:
                    await api.backend.close()
                    self.server.forget_api(api)
                    raise
                versions.apis[number] = api
            elif not api.ready or version_config != api.config:
                await self._reload(api, version_config)
        for number in [number for number in versions.apis if number not in selected]:
            retired = versions.apis.pop(number)  # no new call reaches it; those in flight finish
            await self._retire(retired, routed=False)
            self.server.forget_api(retired)
        if selected:
            self.server.apis[config.name] = versions.apis[max(selected)]

    async def _retire(self, api: Api, routed: bool = True) -> None:
        """Stop `api` taking calls (when it is still `routed` to), let those in flight finish, free its model."""
        if routed:  # refused as unloaded from now on (not as loading), and no longer counted by the readiness
            api.ready, api.state = False, "unloaded"
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


def _log_failure(task: asyncio.Task[None]) -> None:
    """A load or an unload whose caller left, or the freeing of a backend: its failure has no one else to tell."""
    if not task.cancelled() and task.exception() is not None:
        logger.warning("model control, in the background: %s", task.exception())


#: The fields of Triton's model configuration that a load's ``config`` parameter may set, and what they set:
#: ``name`` (the model's own), ``max_batch_size`` (``batching.max_batch_size`` of an API that batches; 0 of one
#: that does not) and ``dynamic_batching.max_queue_delay_microseconds`` (``batching.max_wait_ms``).
CONFIG_FIELDS = ("name", "max_batch_size", "dynamic_batching")


def _count(value: Any, field: str, name: str) -> int:
    # Triton's configuration is protobuf JSON, where a 64-bit number may be a string ("16").
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"failed to load '{name}': '{field}' must be a non-negative integer, got {str(value)[:40]!r}")
    return value


def overridden(config: ApiConfig, text: str) -> ApiConfig:
    """`config` with the fields of a Triton model configuration (JSON `text`) that map onto it applied."""
    name = config.name
    try:
        fields = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"failed to load '{name}': the 'config' parameter is not valid JSON: {exc}") from None
    if not isinstance(fields, dict):
        raise BadRequest(f"failed to load '{name}': the 'config' parameter must be a JSON object")
    unknown = sorted(key for key in fields if key not in CONFIG_FIELDS)
    if unknown:
        raise BadRequest(
            f"failed to load '{name}': modelserve cannot apply {', '.join(repr(k[:60]) for k in unknown[:10])} of a "
            f"model configuration (it applies {', '.join(CONFIG_FIELDS)}; the rest is the project's modelserve.yaml)"
        )
    if fields.get("name", name) != name:
        raise BadRequest(
            f"failed to load '{name}': the configuration names another model, {str(fields['name'])[:60]!r}"
        )
    batching = config.batching
    if "max_batch_size" in fields:
        size = _count(fields["max_batch_size"], "max_batch_size", name)
        if (size == 0) != (batching is None):
            have = "does not batch" if batching is None else "batches"
            raise BadRequest(
                f"failed to load '{name}': max_batch_size {size} would turn batching {'on' if size else 'off'}, and "
                f"the API {have} as its modelserve.yaml says (a batched Model class's predict takes a list)"
            )
        if batching is not None:
            batching = replace(batching, max_batch_size=size)
    if "dynamic_batching" in fields:
        dynamic = fields["dynamic_batching"]
        if not isinstance(dynamic, dict) or set(dynamic) - {"max_queue_delay_microseconds"}:
            raise BadRequest(
                f"failed to load '{name}': of 'dynamic_batching', modelserve applies max_queue_delay_microseconds only"
            )
        if batching is None:
            raise BadRequest(f"failed to load '{name}': 'dynamic_batching' is for an API that batches")
        if "max_queue_delay_microseconds" in dynamic:
            delay = _count(dynamic["max_queue_delay_microseconds"], "max_queue_delay_microseconds", name)
            batching = replace(batching, max_wait_ms=delay / 1000)
    return replace(config, batching=batching)
