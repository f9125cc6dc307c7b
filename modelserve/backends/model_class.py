"""A Truss-style Model class: optional load(), preprocess / predict / postprocess.

The constructor gets what Truss gives, by name (or all of it through ``**kwargs``): ``config``, ``data_dir``,
``secrets``, ``environment``, ``lazy_data_resolver``, and modelserve's ``metrics_client``.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from modelserve.backends import Backend, resolve_class
from modelserve.batching import Batcher
from modelserve.errors import BadRequest, LoadError, StreamWithPostprocess
from modelserve.introspect import describe_callable, inspect_model_class, required_unknown_params, select_kwargs
from modelserve.pipeline import Pipeline, Stage, StageCall, adapt, run_in_thread
from modelserve.project import apply_api_environment, describe_error
from modelserve.secrets import Secrets

if TYPE_CHECKING:
    from modelserve.config import ApiConfig
    from modelserve.metrics import ApiMetrics, MetricsClient

#: What a constructor may ask for by name (Truss's arguments, then modelserve's own).
CONSTRUCTOR_ARGS = ("config", "data_dir", "secrets", "environment", "lazy_data_resolver", "metrics_client")


class LazyDataResolver:
    """Truss's ``lazy_data_resolver``: on Truss's platform it fetches ``data/`` while ``load()`` runs; here
    the data is already in the project folder, so waiting for it returns at once."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir

    def block_until_download_complete(self, log_stats: bool = True, issue_collect: bool = True) -> str:
        return ""

    def raise_if_not_collected(self) -> None:
        return None


def constructor_arguments(api: ApiConfig, root: Path | None, metrics_client: MetricsClient) -> dict[str, Any]:
    """Everything a constructor may ask for (see `CONSTRUCTOR_ARGS`), for one API.

    ``config`` is the API's ``handler.config`` (a Truss folder's whole config.yaml), ``data_dir`` the
    project's ``data/`` folder (or the API's ``data_dir``), ``secrets`` a `Secrets` mapping of the names the
    API declares, ``environment`` None (Truss's value when a deployment has no environment).
    """
    base = root if root is not None else Path.cwd()
    data_dir = (base / (api.data_dir or "data")).resolve()
    return {
        "config": api.handler.config if api.handler else {},
        "data_dir": data_dir,
        "secrets": Secrets(api.secrets),
        "environment": None,
        "lazy_data_resolver": LazyDataResolver(data_dir),
        "metrics_client": metrics_client,
    }


def _init_of(cls: type) -> Any:
    init = getattr(cls, "__init__")  # noqa: B009 - mypy refuses cls.__init__
    return _no_arguments if init is object.__init__ else init


def _no_arguments() -> None:
    return None


def check_constructor(cls: type, label: str) -> None:
    """Refuse, at import time, a constructor that requires arguments modelserve cannot give."""
    missing = required_unknown_params(_init_of(cls), {"self", *CONSTRUCTOR_ARGS})
    if missing:
        raise LoadError(
            f"{label}: {describe_callable(_init_of(cls), cls.__name__ + '.__init__')} requires {missing}; "
            f"a constructor may take {', '.join(CONSTRUCTOR_ARGS)} (or **kwargs)"
        )


def construct(cls: type, label: str, available: dict[str, Any]) -> Any:
    """Instantiate a user class, passing only the constructor arguments it names."""
    try:
        return cls(**select_kwargs(_init_of(cls), available))
    except Exception as exc:
        raise LoadError(f"{label}: {cls.__name__}() raised {describe_error(exc)}") from exc


async def call_load(instance: Any, label: str, is_async: bool) -> None:
    try:
        if is_async:
            await instance.load()
        else:
            await anyio.to_thread.run_sync(instance.load)
    except Exception as exc:
        raise LoadError(f"{label}: {type(instance).__name__}.load() raised {describe_error(exc)}") from exc


def _is_stream(value: Any) -> bool:
    return inspect.isgenerator(value) or inspect.isasyncgen(value)


def _refuse_streams(call: StageCall, is_async: bool) -> StageCall:
    """Seen only at run time: a predict that returns a generator while a postprocess waits for a value."""
    if is_async:

        async def checked_async(value: Any, request: Any) -> Any:
            result = await call(value, request)
            if _is_stream(result):
                raise StreamWithPostprocess()
            return result

        return checked_async

    def checked(value: Any, request: Any) -> Any:
        result = call(value, request)
        if _is_stream(result):
            raise StreamWithPostprocess()
        return result

    return checked


class ModelClassBackend(Backend):
    kind = "model_class"

    def __init__(self, api: ApiConfig, root: Path | None, metrics_client: MetricsClient, api_metrics: ApiMetrics):
        self.api = api
        self.root = root
        if root is not None:
            apply_api_environment(root, api.env, api.python_path)
        self.cls, self.label = resolve_class(api, root, "Model")
        self.spec = inspect_model_class(self.cls, self.label)
        self.metrics_client = metrics_client
        self.api_metrics = api_metrics
        self.instance: Any = None
        check_constructor(self.cls, self.label)
        if api.batching is not None:
            predict = self.spec.stage("predict")
            assert predict is not None
            if predict.generator is not None:
                raise LoadError(f"{self.label}: predict streams, and streaming cannot be combined with batching")
            if predict.takes_request or not predict.takes_inputs:
                raise LoadError(
                    f"{self.label}: with batching, predict receives a list of inputs and cannot take the request; "
                    "read the request in preprocess"
                )

    @property
    def streams(self) -> bool:
        stages = (self.spec.stage("predict"), self.spec.stage("postprocess"))
        return any(stage is not None and stage.generator is not None for stage in stages)

    async def load(self) -> None:
        available = constructor_arguments(self.api, self.root, self.metrics_client)
        self.instance = await anyio.to_thread.run_sync(construct, self.cls, self.label, available)
        if self.spec.has_load:
            await call_load(self.instance, self.label, self.spec.load_is_async)
        self.pipeline = self.build_pipeline(self.instance)

    def build_pipeline(self, instance: Any) -> Pipeline:
        stages = []
        first = next((spec for spec in self.spec.stages if spec.takes_inputs), None)
        for spec in self.spec.stages:
            call = adapt(spec.bind(instance), spec.takes_inputs, spec.takes_request)
            if spec is first and spec.input_model is not None:
                call = _validating(call, spec.input_model)
            if spec.name == "predict" and self.api.batching is not None:
                stages.append(Stage("predict", self._batched(spec.bind(instance), spec.is_async), True, shared=True))
                continue
            if spec.name == "predict" and self.spec.stage("postprocess") is not None:
                call = _refuse_streams(call, spec.is_async)
            if spec.generator is not None and spec.name != "predict":
                # Calling a generator function runs none of its code: do it on the loop, no thread hop.
                stages.append(Stage(spec.name, _creating(call), True))
                continue
            stages.append(Stage(spec.name, call, spec.is_async))
        return Pipeline(
            stages,
            needs_inputs=self.spec.needs_inputs,
            needs_request=self.spec.needs_request,
            timer=self.api_metrics.stage_timer,
        )

    def _batched(self, predict: Any, is_async: bool) -> StageCall:
        """predict behind a Batcher: it receives a list of inputs and returns a list of results."""
        batching = self.api.batching
        assert batching is not None

        async def call_batch(items: list[Any]) -> list[Any]:
            if is_async:
                return await predict(items)
            return await run_in_thread(predict, items, ctx=None)

        self.batcher = Batcher(
            call_batch,
            name=self.api.name,
            max_batch_size=batching.max_batch_size,
            max_wait_ms=batching.max_wait_ms,
            max_concurrency=self.api.max_concurrency,
            on_batch=self.api_metrics.batch,
        )
        submit = self.batcher.submit

        async def batched(value: Any, request: Any) -> Any:
            return await submit(value)

        return batched

    def describe(self) -> dict[str, Any]:
        return {
            "class": self.label,
            "stages": {
                stage.name: {
                    "takes_inputs": stage.takes_inputs,
                    "takes_request": stage.takes_request,
                    "async": stage.is_async,
                    "streams": stage.generator is not None,
                }
                for stage in self.spec.stages
            },
            "load": self.spec.has_load,
            "secrets": sorted(self.api.secrets),
        }


def _creating(call: StageCall) -> StageCall:
    """A generator preprocess/postprocess as an async stage that returns its generator (streamed by the
    endpoint, or consumed by predict)."""

    async def create(value: Any, request: Any) -> Any:
        return call(value, request)

    return create


def _validating(call: StageCall, model: Any) -> StageCall:
    """The decoded body validated into the pydantic model the inputs are annotated with (a 400 if it does
    not fit), as Truss does."""

    def validate(value: Any) -> Any:
        if isinstance(value, model):
            return value
        try:
            if isinstance(value, (str, bytes)):
                parse = getattr(model, "model_validate_json", None) or model.parse_raw
            else:
                parse = getattr(model, "model_validate", None) or model.parse_obj
            return parse(value)
        except Exception as exc:
            if type(exc).__name__ != "ValidationError":
                raise
            details = "; ".join(
                f"{'.'.join(str(part) for part in error.get('loc', ())) or 'body'}: {error.get('msg')}"
                for error in exc.errors()  # type: ignore[attr-defined]
            )
            raise BadRequest(f"the inputs do not match {model.__name__}: {details}") from None

    return lambda value, request: call(validate(value), request)
