"""A Model class served as Truss serves it: the constructor arguments Truss gives, and Truss's paths explained.

Truss's ``Model`` is the Model class of modelserve, so the backend registry (`modelserve.config.BACKENDS`) picks
`TrussModelClassBackend` for every Model class. Over `ModelClassBackend` it adds:

* ``environment`` (``None``: Truss's value when a deployment has no environment) and ``lazy_data_resolver``
  (`LazyDataResolver`) to what a constructor may ask for (`CONSTRUCTOR_ARGS`, in the order errors list them);
* a hint when the constructor or ``load()`` failed on a path that Baseten fills (``/app/model_cache``): the
  command that fills it (`modelserve.compat.truss_cache`); and when the constructor requires an argument that
  only Baseten's platform passes (`PLATFORM_ARGS`: ``trt_llm``), what that argument is;
* Truss's other entry points (`ENDPOINT_METHODS`): ``chat_completions``, ``completions``, ``embeddings``,
  ``messages`` and ``responses``, each called as Truss calls it (the decoded body, the request, or both; sync
  or async; a generator streams), and ``async def websocket(self, websocket)``, which replaces predict (a
  class with both is refused, as Truss refuses it). Once loaded, each is an entry of `entries`: a `Pipeline`
  of one stage that `Api.call(..., pipeline=...)` runs with the API's line, slot, timeout and metrics. The
  routes that reach them are the HTTP edge's (`modelserve.http.truss`, `modelserve.http.websocket`).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocketDisconnect

from modelserve.backends.model_class import ModelClassBackend, constructor_arguments, data_dir_of
from modelserve.compat.truss_cache import hint
from modelserve.errors import ClientDisconnected, LoadError, NotFound
from modelserve.introspect import STAGES, ModelSpec, StageSpec, describe_callable, inspect_model_class, inspect_stage
from modelserve.pipeline import Pipeline, Stage, StageCall, adapt

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

#: Constructor arguments that only Baseten's platform passes, and what each is: named in the load error of a
#: class that requires one, so that it says why no local server can give it.
PLATFORM_ARGS = {
    "trt_llm": (
        "the TensorRT-LLM engine (Briton) that Baseten's engine builder runs beside the model for config.yaml's "
        "trt_llm; modelserve runs no engine: give the class an engine client of its own (vLLM's, say) instead"
    ),
}


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


#: Truss's methods served at OpenAI's paths (``chat_completions`` at ``/v1/chat/completions``...), in its order.
ENDPOINT_METHODS = ("chat_completions", "completions", "embeddings", "messages", "responses")
#: Truss's WebSocket method, served at ``/v1/websocket``: ``async def websocket(self, websocket)``.
WEBSOCKET_METHOD = "websocket"


def inspect_endpoints(cls: type, label: str) -> dict[str, StageSpec]:
    """The Truss entry points `cls` defines besides predict (`ENDPOINT_METHODS`), validated as stages are;
    every problem in one `LoadError`."""
    problems: list[str] = []
    found = {}
    for name in ENDPOINT_METHODS:
        if callable(getattr(cls, name, None)):
            spec = inspect_stage(cls, name, problems)
            if spec is not None:
                found[name] = spec
    if problems:
        listing = "\n  - ".join(problems)
        raise LoadError(f"{label}: class {cls.__name__} cannot be served:\n  - {listing}")
    return found


def inspect_websocket(cls: type, label: str) -> ModelSpec:
    """A class with ``websocket``: Truss's rules (no predict, preprocess or postprocess beside it; async; one
    argument, the WebSocket), and a spec with no stages (its predict route answers 404)."""
    method = getattr(cls, WEBSOCKET_METHOD)
    shown = describe_callable(method, f"{cls.__name__}.{WEBSOCKET_METHOD}")
    problems = []
    beside = [name for name in STAGES if callable(getattr(cls, name, None))]
    if beside:
        problems.append(
            f"a Truss model cannot have both `websocket` and any of `predict`, `preprocess`, `postprocess` "
            f"(it has {', '.join(beside)}); serve the WebSocket from a class of its own"
        )
    if not inspect.iscoroutinefunction(method):
        problems.append(f"{shown}: a websocket method must be a coroutine function (async def)")
    try:
        params = [p for p in inspect.signature(method).parameters.values() if p.name != "self"]
    except (TypeError, ValueError):
        params = []
    if len(params) != 1:
        problems.append(f"{shown}: takes {len(params)} arguments; a websocket method takes one, the WebSocket")
    if problems:
        listing = "\n  - ".join(problems)
        raise LoadError(f"{label}: class {cls.__name__} cannot be served:\n  - {listing}")
    load = getattr(cls, "load", None)
    return ModelSpec(cls=cls, stages=(), has_load=callable(load), load_is_async=inspect.iscoroutinefunction(load))


def _closing(call: StageCall) -> StageCall:
    """A websocket method whose client's close (``WebSocketDisconnect`` left uncaught) ends the call as a
    disconnect, not as a failure of user code."""

    async def closing(value: Any, request: Any) -> Any:
        try:
            return await call(value, request)
        except WebSocketDisconnect as exc:
            raise ClientDisconnected(f"the client closed the WebSocket ({exc.code})") from None

    return closing


class TrussModelClassBackend(ModelClassBackend):
    """A Model class with Truss's constructor arguments, its other entry points, and Truss's paths explained."""

    constructor_args = CONSTRUCTOR_ARGS

    def __init__(self, *args: Any) -> None:
        try:
            super().__init__(*args)
        except LoadError as exc:
            said = [f"'{name}' is {what}" for name, what in PLATFORM_ARGS.items() if f"'{name}'" in str(exc)]
            if not said:
                raise
            raise LoadError(f"{exc}; {'; '.join(said)}") from exc.__cause__
        #: How each of Truss's other methods is called (`ENDPOINT_METHODS`, and `WEBSOCKET_METHOD`).
        self.endpoints = inspect_endpoints(self.cls, self.label)
        if self.websocket:
            self.endpoints[WEBSOCKET_METHOD] = StageSpec(WEBSOCKET_METHOD, True, False, True)
        #: Once loaded: each of those methods as a pipeline of its own, for `Api.call(..., pipeline=...)`.
        self.entries: dict[str, Pipeline] = {}

    @property
    def websocket(self) -> bool:
        """Whether the class serves a WebSocket (and then no predict)."""
        return callable(getattr(self.cls, WEBSOCKET_METHOD, None))

    def inspect_class(self) -> ModelSpec:
        if not callable(getattr(self.cls, WEBSOCKET_METHOD, None)):
            return inspect_model_class(self.cls, self.label)
        if self.api.batching is not None:
            raise LoadError(f"{self.label}: a websocket method cannot be batched; remove 'batching'")
        return inspect_websocket(self.cls, self.label)

    def arguments(self) -> dict[str, Any]:
        return truss_arguments(self.api, self.root, self.metrics_client)

    def explain(self, error: LoadError) -> str | None:
        return hint(self.root or Path.cwd(), str(error))

    def build_pipeline(self, instance: Any) -> Pipeline:
        timer = self.api_metrics.stage_timer
        self.entries = {}
        for name, spec in self.endpoints.items():
            call = adapt(spec.bind(instance), spec.takes_inputs, spec.takes_request)
            if name == WEBSOCKET_METHOD:
                call = _closing(call)
            stage = Stage(name, call, spec.is_async)
            self.entries[name] = Pipeline(
                [stage], needs_inputs=spec.takes_inputs, needs_request=spec.takes_request, timer=timer
            )
        if self.websocket:
            return Pipeline([Stage("predict", self._no_predict, False)], needs_inputs=False, timer=timer)
        return super().build_pipeline(instance)

    def _no_predict(self, value: Any, request: Any) -> Any:
        raise NotFound(f"{self.label} serves a WebSocket (/v1/websocket) and has no predict")

    async def close(self) -> None:
        await super().close()
        self.entries = {}  # each holds a bound method of the instance (the WebSocket route finds none: 503)

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        if self.endpoints:
            described["endpoints"] = sorted(self.endpoints)
        return described
