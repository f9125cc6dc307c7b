"""The server of a project, whatever the transport: its APIs, their loading, their metrics, its jobs service.

User code is imported and validated when the server is built (a bad signature or a missing file is an
error before anything is served); constructing and loading (``__init__`` and ``load()``) start with
`start`, on the running event loop, and each API answers 503 until it is done.

The APIs load concurrently, each in a task of its own (their sync constructors and ``load()`` run in worker
threads, an async ``load()`` on the loop): an API that loads in a moment serves while a slow one still
loads. What loading shares stays as it was: the working directory is the project folder of every API
(`modelserve.project.prepare_environment` moved there once, before any user code), and each API's
environment variables and ``sys.path`` folders were applied when its code was imported, one API after the
other, before any load begins. Each API logs one line when it starts loading and one when it is ready (or
an ERROR line naming it when it fails), with the time taken.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable
from typing import Protocol

from modelserve import devices
from modelserve.api import Api
from modelserve.api_metrics import ApiMetrics
from modelserve.backends import make_backend
from modelserve.config import ApiConfig, ProjectConfig
from modelserve.errors import LoadError
from modelserve.jobs.service import Jobs
from modelserve.metrics import Metrics, MetricsClient
from modelserve.repository import Repository, Versions, version_configs

logger = logging.getLogger("modelserve")

LoadErrorCallback = Callable[[LoadError], None]


class Companion(Protocol):
    """A server of another transport that runs beside the HTTP app on its loop (`modelserve.grpc`)."""

    async def start(self) -> None: ...

    async def stop(self, grace: float | None = None) -> None: ...


#: The collector's youngest-generation threshold in a served process (the interpreter's default: 700 before
#: Python 3.13, 2,000 since): net new containers before a collection. See `tune_collector`.
YOUNG_THRESHOLD = 10_000
#: The thresholds this process started with, to tell them from ones a project's own code set while loading.
_STARTING_THRESHOLDS = gc.get_threshold()


class ModelServer:
    """Everything one app serves: its APIs, their loading, their metrics, and the jobs of its async APIs."""

    def __init__(
        self,
        project: ProjectConfig,
        on_load_error: LoadErrorCallback | None = None,
        workers: int = 1,
    ) -> None:
        self.project = project
        self.workers = workers
        self.metrics = Metrics()
        self.metrics_client = MetricsClient(self.metrics)
        self.on_load_error = on_load_error
        self.apis: dict[str, Api] = {}
        #: The versions of the APIs whose model is a folder of numbered versions (`modelserve.repository`);
        #: ``apis[name]`` is the highest of them.
        self.versions: dict[str, Versions] = {}
        for config in project.apis:
            versions = version_configs(config, project.root)
            if versions:
                self.versions[config.name] = Versions(config.name, {n: self.make_api(c) for n, c in versions.items()})
                self.apis[config.name] = self.versions[config.name].apis[max(versions)]
            else:
                self.apis[config.name] = self.make_api(config)
        #: Loading and unloading APIs while serving (`--model-control explicit`).
        self.repository = Repository(self)
        async_apis = [api for api in self.apis.values() if api.config.kind == "async"]
        #: The jobs service, when the project has async APIs.
        self.jobs = Jobs(project.jobs, project.root, async_apis, self.metrics, workers) if async_apis else None
        #: Whether the jobs service, when there is one, has opened its store and started its workers: its APIs
        #: load first, and until then a submit is refused (503), so the server is not ready either.
        self.jobs_started = self.jobs is None
        #: Why the jobs service could not start (its store did not open), else None.
        self.jobs_error: str | None = None
        self._loading: asyncio.Task[None] | None = None
        #: Whether loading ends with `tune_collector()` (the CLI's processes, which serve one project each).
        self.tune_collector_after_load = False
        #: Servers of other transports, started with loading and stopped by `close` (the gRPC server).
        self.companions: list[Companion] = []
        self._companions: list[asyncio.Task[None]] = []

    def make_api(self, config: ApiConfig) -> Api:
        """An API of this server (not yet loaded), with its metrics."""
        api_metrics = ApiMetrics(self.metrics, config.name)
        backend = make_backend(config, self.project.root, self.metrics_client, api_metrics)
        api = Api(config, backend, api_metrics)
        self.metrics.add_refresher(api.refresh_gauges)
        return api

    def forget_api(self, api: Api) -> None:
        """An API of `make_api` that is no longer served (a version a repository load retired, or one that failed
        to load): its metrics stop holding it, so that it and its model can be freed (each load that added and
        retired a version kept one more model for good)."""
        self.metrics.remove(api.refresh_gauges, api.metrics.flush)

    def all_apis(self) -> list[Api]:
        """Every API, each served version of a versioned one included."""
        apis = [api for name, api in self.apis.items() if name not in self.versions]
        return apis + [api for versions in self.versions.values() for api in versions.apis.values()]

    @property
    def ready(self) -> bool:
        """Every API ready but those unloaded (`--model-control explicit`), and the jobs service started."""
        return self.jobs_started and all(api.ready for api in self.all_apis() if api.state != "unloaded")

    def workers_ready(self) -> tuple[bool, str]:
        """(ready, why not) for this server's every process: `ready`, and with ``--workers N`` every worker
        loaded (each worker answers ``/readyz``, and a loading one answers its APIs' requests 503)."""
        if not self.ready:
            return False, ""
        loaded, started = devices.workers_loaded()
        if loaded < started:
            return False, f"loading: {loaded} of {started} workers have loaded"
        return True, ""

    @property
    def started(self) -> bool:
        return self._loading is not None

    @property
    def graceful_timeout(self) -> float:
        """Seconds that running async jobs get to finish at shutdown (the CLI's --graceful-timeout)."""
        return self.jobs.graceful_timeout if self.jobs is not None else 30.0

    @graceful_timeout.setter
    def graceful_timeout(self, seconds: float) -> None:
        if self.jobs is not None:
            self.jobs.graceful_timeout = seconds

    def start(self) -> None:
        """Start loading every API, once, on the running loop."""
        if self._loading is None:
            loop = asyncio.get_running_loop()
            self._loading = loop.create_task(self._load_all())
            self.metrics.start()
            self._companions = [loop.create_task(self._start(companion)) for companion in self.companions]

    async def _start(self, companion: Companion) -> None:
        try:
            await companion.start()
        except LoadError as exc:
            logger.error("%s", exc)
            self._failed(exc)

    async def _load_all(self) -> None:
        # gather: cancelling loading (close()) cancels every API's load.
        loading = [api for api in self.all_apis() if api.state != "unloaded"]
        loaded = await asyncio.gather(*(self._load(api) for api in loading))
        if not all(loaded):
            return
        try:
            if self.jobs is not None:
                await self.jobs.start()
                self.jobs_started = True
        except LoadError as exc:
            self.jobs_error = str(exc)
            logger.error("%s", exc)
            self._failed(exc)
            return
        devices.mark_loaded()
        if self.tune_collector_after_load:
            tune_collector()

    async def _load(self, api: Api) -> bool:
        """Load one API, with its log lines; False when it failed (told to `on_load_error` at once)."""
        logger.info("api '%s' is loading (%s)", api.name, api.backend.kind)
        started = time.perf_counter()
        try:
            await api.load()  # logs "api '...' is ready (loaded in ... s)"
        except LoadError as exc:
            seconds = time.perf_counter() - started
            message = str(exc).removeprefix(f"api '{api.name}': ")
            logger.error("api '%s' failed to load after %.2f s: %s", api.name, seconds, message)
            self._failed(exc)
            return False
        return True

    def _failed(self, exc: LoadError) -> None:
        """Tell the owner (the CLI stops serving; ``--reload`` keeps answering 503 until the next change)."""
        if self.on_load_error is not None:
            self.on_load_error(exc)

    async def wait_loaded(self) -> None:
        """Wait until loading has ended (successfully or not)."""
        self.start()
        assert self._loading is not None
        await asyncio.shield(self._loading)

    async def close(self) -> None:
        for companion in self.companions:
            await companion.stop(self.graceful_timeout)
        if self.jobs is not None:
            await self.jobs.stop()
        if self._loading is not None and not self._loading.done():
            self._loading.cancel()
        for api in self.all_apis():
            if api.state != "unloaded":
                await api.backend.close()
        await self.metrics.stop()


def tune_collector() -> None:
    """Set the garbage collector for a process that serves: collect what loading left, freeze the rest, and
    collect the youngest generation less often (`YOUNG_THRESHOLD`).

    Frozen: a busy server keeps many requests in flight long enough to reach the oldest generation, so full
    collections come often, and each walked every object the process had loaded: a model runtime's modules
    are hundreds of thousands. Frozen, they are still freed by reference counting; only cycles among them
    are never collected, and loading makes them once.

    Less often: the interpreter counts net new containers, and the requests in flight come and go in waves
    (a batch of 64 answered, 64 new ones read) far larger than its threshold, so it collected every 40
    requests or so, each time walking the objects of all the requests in flight (the batched stand-in of
    `benchmarks/gpu_serving.py` at 256 connections: 13-25 us of a request's 150-250). At 10,000, a
    collection comes once the process holds that many more containers than at the last one (cycles that
    reference counting cannot free: a few MB, not a leak). A threshold the project's own code set while
    loading is left as it is."""
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    if thresholds == _STARTING_THRESHOLDS and thresholds[0] < YOUNG_THRESHOLD:
        gc.set_threshold(YOUNG_THRESHOLD, *thresholds[1:])
