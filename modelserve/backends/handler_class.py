"""An async Handler class: ``handle_async(payload, request_id)`` runs each background job.

Its constructor may take what a Model class's may (`modelserve.backends.model_class.MODEL_ARGS`), by name.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelserve import _threads
from modelserve.backends import Backend, resolve_class
from modelserve.backends._children import Children
from modelserve.backends.model_class import call_load, check_constructor, construct, constructor_arguments
from modelserve.context import current_request_id
from modelserve.errors import LoadError
from modelserve.introspect import describe_callable, required_unknown_params, select_kwargs
from modelserve.pipeline import Pipeline, Stage, StageCall

if TYPE_CHECKING:
    from modelserve.api_metrics import ApiMetrics
    from modelserve.config import ApiConfig
    from modelserve.metrics import MetricsClient

JOB_ARGS = ("payload", "request_id")


class HandlerClassBackend(Backend):
    kind = "handler_class"

    def __init__(self, api: ApiConfig, root: Path | None, metrics_client: MetricsClient, api_metrics: ApiMetrics):
        self.api = api
        self.cls, self.label = resolve_class(api, root, "Handler")
        self.metrics_client = metrics_client
        self.api_metrics = api_metrics
        self.instance: Any = None
        self.children = Children(self.label)
        check_constructor(self.cls, self.label)
        handle = getattr(self.cls, "handle_async", None)
        if handle is None or not callable(handle):
            raise LoadError(f"{self.label}: a Handler class needs a method handle_async(payload, request_id)")
        label = f"{self.cls.__name__}.handle_async"
        missing = required_unknown_params(handle, {"self", *JOB_ARGS})
        if missing:
            raise LoadError(
                f"{self.label}: {describe_callable(handle, label)} requires {missing}; "
                "handle_async may take only payload and request_id"
            )
        if inspect.isasyncgenfunction(handle) or inspect.isgeneratorfunction(handle):
            raise LoadError(f"{self.label}: {label} is a generator; a job returns one JSON-serialisable result")
        self.is_async = inspect.iscoroutinefunction(handle)
        self.wants = {name for name in select_kwargs(handle, dict.fromkeys(JOB_ARGS))}
        self.has_load = callable(getattr(self.cls, "load", None))

    async def load(self) -> None:
        self.children.note()
        available = constructor_arguments(self.api, None, self.metrics_client)
        self.instance = await _threads.run_sync(construct, self.cls, self.label, available)
        if self.has_load:
            load = getattr(self.cls, "load")  # noqa: B009
            await call_load(self.instance, self.label, inspect.iscoroutinefunction(load))
        self.pipeline = Pipeline(
            [Stage("handle_async", self._stage_call(), self.is_async)],
            needs_inputs=True,
            needs_request=False,
            timer=self.api_metrics.stage_timer,
        )

    def _stage_call(self) -> StageCall:
        """handle_async as a pipeline stage: the job's payload is the value, its id the request id."""
        handle, wants_payload = self.instance.handle_async, "payload" in self.wants
        wants_id = "request_id" in self.wants

        def arguments(value: Any) -> dict[str, Any]:
            kwargs: dict[str, Any] = {}
            if wants_payload:
                kwargs["payload"] = value
            if wants_id:
                kwargs["request_id"] = current_request_id()
            return kwargs

        if self.is_async:

            async def call_async(value: Any, request: Any) -> Any:
                return await handle(**arguments(value))

            return call_async
        return lambda value, request: handle(**arguments(value))

    def describe(self) -> dict[str, Any]:
        return {
            "class": self.label,
            "handle_async": {"async": self.is_async, "takes": sorted(self.wants)},
        }

    async def close(self) -> None:
        await _threads.run_sync(self.children.stop)
        self.let_go()
