"""A Truss-style Model class: optional load(), preprocess / predict / postprocess."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio.to_thread

from modelserve.backends import Backend, resolve_class
from modelserve.batching import Batcher
from modelserve.errors import LoadError
from modelserve.introspect import describe_callable, inspect_model_class, required_unknown_params, select_kwargs
from modelserve.pipeline import Pipeline, Stage, StageCall, adapt, run_in_thread
from modelserve.project import describe_error
from modelserve.streaming import is_stream

if TYPE_CHECKING:
    from modelserve.config import ApiConfig
    from modelserve.metrics import ApiMetrics, MetricsClient

CONSTRUCTOR_ARGS = ("config", "metrics_client")


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
            "a constructor may take only config and metrics_client (or **kwargs)"
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


class StreamWithPostprocess(TypeError):
    def __init__(self) -> None:
        super().__init__(
            "predict returned a generator (a stream), but postprocess needs a whole value; "
            "remove postprocess or return a value from predict"
        )


def _refuse_streams(call: StageCall, is_async: bool) -> StageCall:
    """Seen only at run time: a predict that returns a generator while a postprocess waits for a value."""
    if is_async:

        async def checked_async(value: Any, request: Any) -> Any:
            result = await call(value, request)
            if is_stream(result):
                raise StreamWithPostprocess()
            return result

        return checked_async

    def checked(value: Any, request: Any) -> Any:
        result = call(value, request)
        if is_stream(result):
            raise StreamWithPostprocess()
        return result

    return checked


class ModelClassBackend(Backend):
    kind = "model_class"

    def __init__(self, api: ApiConfig, root: Path | None, metrics_client: MetricsClient, api_metrics: ApiMetrics):
        self.api = api
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
        predict = self.spec.stage("predict")
        return predict is not None and predict.generator is not None

    async def load(self) -> None:
        config = self.api.handler.config if self.api.handler else {}
        available = {"config": config, "metrics_client": self.metrics_client}
        self.instance = await anyio.to_thread.run_sync(construct, self.cls, self.label, available)
        if self.spec.has_load:
            await call_load(self.instance, self.label, self.spec.load_is_async)
        self.pipeline = self.build_pipeline(self.instance)

    def build_pipeline(self, instance: Any) -> Pipeline:
        stages = []
        for spec in self.spec.stages:
            call = adapt(spec.bind(instance), spec.takes_inputs, spec.takes_request)
            if spec.name == "predict" and self.api.batching is not None:
                stages.append(Stage("predict", self._batched(spec.bind(instance), spec.is_async), True))
                continue
            if spec.name == "predict" and self.spec.stage("postprocess") is not None:
                call = _refuse_streams(call, spec.is_async)
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
        }
