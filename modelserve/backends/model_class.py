"""A Model class: optional load(), preprocess / predict / postprocess.

The constructor gets what it names (or all of it through ``**kwargs``): ``config``, ``data_dir``, ``secrets``,
``metrics_client`` and ``device`` (`MODEL_ARGS`). Truss's own arguments (``environment``,
``lazy_data_resolver``) and its hints are added by `modelserve.compat.truss_backend`, the backend that the
registry (`modelserve.config.BACKENDS`) picks for a Model class.
"""

from __future__ import annotations

import inspect
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from starlette.exceptions import HTTPException

from modelserve import _threads, devices
from modelserve._threads import BatchThreads
from modelserve.backends import Backend, resolve_class
from modelserve.backends._children import Children
from modelserve.batching import Batcher, Failed
from modelserve.context import RequestContext, current
from modelserve.errors import (
    BatchSizeMismatch,
    HTTPError,
    LoadError,
    RequestCancelled,
    StreamWithPostprocess,
    UserCodeError,
)
from modelserve.introspect import (
    ModelSpec,
    describe_callable,
    inspect_model_class,
    required_unknown_params,
    select_kwargs,
)
from modelserve.pipeline import Pipeline, Stage, StageCall, StageTimer, adapt
from modelserve.project import apply_api_environment, describe_error
from modelserve.schema import TypedValue
from modelserve.secrets import Secrets

logger = logging.getLogger("modelserve")

if TYPE_CHECKING:
    from modelserve.api_metrics import ApiMetrics
    from modelserve.config import ApiConfig
    from modelserve.metrics import MetricsClient

#: What a constructor may ask for by name.
MODEL_ARGS = ("config", "data_dir", "secrets", "metrics_client", "device")


def constructor_arguments(api: ApiConfig, root: Path | None, metrics_client: MetricsClient) -> dict[str, Any]:
    """Everything a constructor may ask for (see `MODEL_ARGS`), for one API.

    ``config`` is the API's ``handler.config`` (a Truss folder's whole config.yaml), ``data_dir`` the
    project's ``data/`` folder (or the API's ``data_dir``), ``secrets`` a `Secrets` mapping of the names the
    API declares, ``device`` the API's device in this process (``"cuda:0"`` or ``"cpu"``, as
    `modelserve.device()` says; `modelserve.devices`).
    """
    return {
        "config": api.handler.config if api.handler else {},
        "data_dir": data_dir_of(api, root),
        "secrets": Secrets(api.secrets),
        "metrics_client": metrics_client,
        "device": devices.assign(api.devices).name,
    }


def data_dir_of(api: ApiConfig, root: Path | None) -> Path:
    """The folder an API's constructor gets as ``data_dir``: its ``data_dir``, or the project's ``data/``."""
    base = root if root is not None else Path.cwd()
    return (base / (api.data_dir or "data")).resolve()


def _init_of(cls: type) -> Any:
    init = getattr(cls, "__init__")  # noqa: B009 - mypy refuses cls.__init__
    return _no_arguments if init is object.__init__ else init


def _no_arguments() -> None:
    return None


def check_constructor(cls: type, label: str, accepted: tuple[str, ...] = MODEL_ARGS) -> None:
    """Refuse, at import time, a constructor that requires arguments other than `accepted`."""
    missing = required_unknown_params(_init_of(cls), {"self", *accepted})
    if missing:
        raise LoadError(
            f"{label}: {describe_callable(_init_of(cls), cls.__name__ + '.__init__')} requires {missing}; "
            f"a constructor may take {', '.join(accepted)} (or **kwargs)"
        )


def construct(cls: type, label: str, available: dict[str, Any]) -> Any:
    """Instantiate a user class, passing only the constructor arguments it names."""
    try:
        return cls(**select_kwargs(_init_of(cls), available))
    except Exception as exc:
        raise LoadError(f"{label}: {cls.__name__}() raised {describe_error(exc)}") from exc


async def call_load(instance: Any, label: str, is_async: bool, threads: BatchThreads | None = None) -> None:
    """Run the instance's ``load()``: on the loop when async, else in a thread (one of `threads` when given)."""
    try:
        if is_async:
            await instance.load()
        elif threads is not None:
            await threads.run_here(instance.load)
        else:
            await _threads.run_sync(instance.load)
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
    #: The names a constructor may ask for (a subclass for another server's contract adds its own).
    constructor_args: tuple[str, ...] = MODEL_ARGS

    def __init__(self, api: ApiConfig, root: Path | None, metrics_client: MetricsClient, api_metrics: ApiMetrics):
        self.api = api
        self.root = root
        if root is not None:
            apply_api_environment(root, api.env, api.python_path)
        self.cls, self.label = resolve_class(api, root, "Model")
        self.spec = self.inspect_class()
        self.metrics_client = metrics_client
        self.api_metrics = api_metrics
        self.instance: Any = None
        #: With batching and a sync predict: the API's own threads (`BatchThreads`), started by `load`.
        self.threads: BatchThreads | None = None
        #: Where the API's code runs in this process (`modelserve.devices`); the CPU until loaded.
        self.device = devices.CPU
        #: The processes its code starts, stopped when the API closes.
        self.children = Children(self.label)
        check_constructor(self.cls, self.label, self.constructor_args)
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

    def inspect_class(self) -> ModelSpec:
        """The class's stages, validated (a subclass for another server's contract accepts its own shapes:
        Truss's websocket class has no predict, `modelserve.compat.truss_backend`)."""
        return inspect_model_class(self.cls, self.label)

    def arguments(self) -> dict[str, Any]:
        """What the constructor may ask for, by name (`constructor_args`)."""
        return constructor_arguments(self.api, self.root, self.metrics_client)

    def explain(self, error: LoadError) -> str | None:
        """What to add to a failure of the constructor or load() (None: nothing)."""
        return None

    @property
    def streams(self) -> bool:
        stages = (self.spec.stage("predict"), self.spec.stage("postprocess"))
        return any(stage is not None and stage.generator is not None for stage in stages)

    async def load(self) -> None:
        self.children.note()
        self.device = devices.assign(self.api.devices)
        devices.place(self.api.name, self.device)
        predict = self.spec.stage("predict")
        if self.api.batching is not None and predict is not None and not predict.is_async:
            # The batch threads start before load(), which runs on the first of them: a warm-up call made in
            # load() warms the thread that runs predict (a GPU runtime builds per-thread state on a thread's
            # first call).
            self.threads = BatchThreads(self.api.name, self.api.max_concurrency)
            await _threads.run_sync(self.threads.start)
        token = devices.enter(self.api.name)  # modelserve.device() in the constructor and load() knows the API
        try:
            available = self.arguments()
            self.instance = await _threads.run_sync(construct, self.cls, self.label, available)
            if self.spec.has_load:
                await call_load(self.instance, self.label, self.spec.load_is_async, self.threads)
        except LoadError as exc:
            said = self.explain(exc)
            if said is None:
                raise
            raise LoadError(f"{exc}; {said}") from exc.__cause__
        finally:
            devices.leave(token)
        self.pipeline = self.build_pipeline(self.instance)

    def build_pipeline(self, instance: Any) -> Pipeline:
        stages = []
        first = next((spec for spec in self.spec.stages if spec.takes_inputs), None)
        for spec in self.spec.stages:
            call = adapt(spec.bind(instance), spec.takes_inputs, spec.takes_request)
            if spec is first and spec.input_type is not None:
                call = _validating(call, spec.input_type, spec.is_async)
            if spec.name == "predict" and self.api.batching is not None:
                stages.append(Stage("predict", adapt(spec.bind(instance), True, False), spec.is_async, shared=True))
                continue
            if spec.name == "predict" and self.spec.stage("postprocess") is not None:
                call = _refuse_streams(call, spec.is_async)
            if spec.generator is not None and spec.name != "predict":
                # Calling a generator function runs none of its code: do it on the loop, no thread hop.
                stages.append(Stage(spec.name, _creating(call), True))
                continue
            stages.append(Stage(spec.name, call, spec.is_async))
        if self.api.batching is not None:
            stages = self._batched(stages)
        return Pipeline(
            stages,
            needs_inputs=self.spec.needs_inputs,
            needs_request=self.spec.needs_request,
            timer=self.api_metrics.stage_timer,
        )

    def _batched(self, stages: list[Stage]) -> list[Stage]:
        """The stages with predict behind a `Batcher`: it receives a list of inputs and returns a list of results.

        When every stage is plain sync code (the usual Model class), the whole call is one batched stage: the
        batch's own thread runs each request's preprocess, then predict over the batch, then each request's
        postprocess, so that a request costs the event loop no thread hop of its own (its own stages would cost
        a hop each, and on 2 cores their GIL and loop turns took more than half of what batching saved; see
        docs/batching.md). Otherwise (an async or generator stage) predict alone is batched and the other
        stages run as in any API. Either way a sync predict runs on the API's `BatchThreads`, started at load.
        """
        batching = self.api.batching
        assert batching is not None
        index = next(i for i, stage in enumerate(stages) if stage.name == "predict")
        predict = stages[index]
        fold = not any(stage.is_async for stage in stages)
        options: dict[str, Any] = {
            "name": self.api.name,
            "max_batch_size": batching.max_batch_size,
            "max_wait_ms": batching.max_wait_ms,
            "max_concurrency": self.api.max_concurrency,
            "on_batch": self.api_metrics.batch,
        }
        if fold:
            run = _BatchRun(
                self.api.name, stages[:index], predict.call, stages[index + 1 :], self.api_metrics.stage_timer
            )
            self.batcher = Batcher(sync_call=run, threads=self.threads, **options)
        elif predict.is_async:
            call = predict.call

            async def call_batch(items: list[Any]) -> list[Any]:
                return cast("list[Any]", await call(items, None))

            self.batcher = Batcher(call_batch, **options)
        else:
            call = predict.call
            self.batcher = Batcher(sync_call=lambda items: call(items, None), threads=self.threads, **options)
        if self.batcher.threads is not None:
            self.batcher.threads.start()
        submit = self.batcher.submit

        if fold:
            # The request's place in a batch, with what its own stages need in the batch's thread (a `Failed`
            # result, its own stage's failure, is raised by submit): no coroutine of its own per request.
            get_context = current.get
            return [Stage("predict", lambda value, request: submit((value, request, get_context())), True, shared=True)]
        return [
            *stages[:index],
            Stage("predict", lambda value, request: submit(value), True, shared=True),
            *stages[index + 1 :],
        ]

    async def close(self) -> None:
        """Stop the API's threads and processes, and let go of the user's instance (`Backend.let_go`): a
        repository unload frees the model, which its routes' caches of this backend kept alive before."""
        batcher = getattr(self, "batcher", None)
        if batcher is not None:
            batcher.close()  # and the batch threads
        elif self.threads is not None:  # started, then load() failed before the batcher was made
            self.threads.close()
        await _threads.run_sync(self.children.stop)
        self.let_go("batcher", "threads")

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
            "batching": self._describe_batching(),
            "device": self.device.name,
            "worker": devices.worker_slot(),
        }

    def _describe_batching(self) -> dict[str, Any] | None:
        """Its settings and the requests waiting for a batch, as a model file's API shows them first; None
        without batching."""
        batching = self.api.batching
        if batching is None:
            return None
        batcher = getattr(self, "batcher", None)  # built at load
        return {
            "max_batch_size": batching.max_batch_size,
            "max_wait_ms": batching.max_wait_ms,
            "waiting": batcher.waiting if batcher is not None else 0,
        }


#: Raised by user code on purpose (an HTTP error, a cancellation): passed on as it is, as `Pipeline` does.
_PASS_THROUGH: tuple[type[BaseException], ...] = (HTTPError, HTTPException, RequestCancelled)


class _BatchRun:
    """One batch of a Model class whose stages are all sync, run in the batch's thread: each request's
    preprocess, predict over the batch, each request's postprocess.

    A request's items are ``(inputs, request, context)``; its result is its answer, or a `Failed` holding the
    exception its own stage raised (a failing preprocess or postprocess fails that request alone, a failing
    predict the batch). Each request's stages run with its context current (log lines carry its request id,
    `is_cancelled()` answers for it), and a request cancelled before its stages start skips them.
    """

    __slots__ = ("name", "before", "predict", "after", "timer")

    def __init__(
        self, name: str, before: list[Stage], predict: StageCall, after: list[Stage], timer: StageTimer | None
    ) -> None:
        self.name = name
        self.before = tuple(before)
        self.predict = predict
        self.after = tuple(after)
        self.timer = timer

    def __call__(self, items: list[tuple[Any, Any, RequestContext | None]]) -> list[Any]:
        results: list[Any] = [None] * len(items)
        values, running = [], []
        for index, (value, request, ctx) in enumerate(items):
            value = self._stages(self.before, value, request, ctx)
            if type(value) is Failed:
                results[index] = value
            else:
                values.append(value)
                running.append(index)
        if not running:
            return results
        current.set(None)
        predictions = self.predict(values, None)
        if not isinstance(predictions, (list, tuple)) or len(predictions) != len(values):
            got = type(predictions).__name__
            if isinstance(predictions, (list, tuple)):
                got = f"{len(predictions)} results"
            error = BatchSizeMismatch(
                f"api '{self.name}': the batched predict got a list of {len(values)} inputs and returned {got}; "
                "it must return a list of the same length"
            )
            logger.error("%s", error)
            raise error
        for index, prediction in zip(running, predictions, strict=True):
            _, request, ctx = items[index]
            results[index] = self._stages(self.after, prediction, request, ctx) if self.after else prediction
        current.set(None)
        return results

    def _stages(self, stages: tuple[Stage, ...], value: Any, request: Any, ctx: RequestContext | None) -> Any:
        if not stages:
            return value
        current.set(ctx)
        timer = self.timer
        for stage in stages:
            if ctx is not None and ctx.cancelled:
                return Failed(RequestCancelled())
            started = time.perf_counter()
            try:
                value = stage.call(value, request)
            except _PASS_THROUGH as exc:
                return Failed(exc)
            except BaseException as exc:  # noqa: B036 - user code's SystemExit fails its request, not the server
                return Failed(UserCodeError(stage.name, exc))
            if timer is not None:
                timer(stage.name, time.perf_counter() - started)
        return value


def _creating(call: StageCall) -> StageCall:
    """A generator preprocess/postprocess as an async stage that returns its generator (streamed by the
    endpoint, or consumed by predict)."""

    async def create(value: Any, request: Any) -> Any:
        return call(value, request)

    return create


def _validating(call: StageCall, typed: TypedValue, is_async: bool) -> StageCall:
    """The decoded body validated into the type the inputs are annotated with (a 400 naming each failing
    field if it does not fit), as Truss does for pydantic models. An async stage's large body is validated in
    a worker thread (a sync stage's runs in one already)."""
    if is_async:
        validate_async = typed.validate_async

        async def validated(value: Any, request: Any) -> Any:
            return await call(await validate_async(value), request)

        return validated
    validate = typed.validate
    return lambda value, request: call(validate(value), request)
