"""An ONNX file or a TensorFlow SavedModel served directly, with optional pre/post_inference hooks.

The pipeline has up to three stages: ``pre_inference`` (the user's hook, when the handler file has one),
``run`` (convert the values to the model's inputs, then run the model) and ``post_inference`` (the hook).
Without pre_inference the request body is an object keyed by input names (or, for a model with a single
input, that input's value); without post_inference the answer is an object keyed by output names.

Where calls run: each sync stage is an `Adaptive` call, inline on the event loop while its measured run
time stays under ``inline_threshold_ms`` (1 ms by default), else in a worker thread, so that a small model
pays no thread hop and a slow one never blocks the server. Async hooks run on the event loop. The API's
concurrency slot is held until a call running in a thread returns, so with ``max_concurrency: 1`` the hooks
of one API are never called concurrently (module-level variables in the hook file need no lock).
"""

from __future__ import annotations

import inspect
import logging
import time
import typing
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from time import perf_counter
from types import ModuleType
from typing import TYPE_CHECKING, Any

from modelserve import _threads, devices, runtimes
from modelserve._threads import THREAD, Adaptive, BatchThreads
from modelserve.backends import Backend
from modelserve.backends._children import Children
from modelserve.context import RequestContext
from modelserve.errors import BadRequest, LoadError, RequestCancelled, UserCodeError
from modelserve.introspect import describe_callable
from modelserve.pipeline import PASS_THROUGH, Pipeline, Stage, Step
from modelserve.runtimes._model import LoadedModel
from modelserve.runtimes._tensors import InputConverter
from modelserve.schema import TypedValue, typed_value
from modelserve.stacking import BatchChoice, TensorBatcher

if TYPE_CHECKING:
    from modelserve.api_metrics import ApiMetrics
    from modelserve.config import ApiConfig, ModelFileConfig
    from modelserve.metrics import MetricsClient

logger = logging.getLogger("modelserve")

HOOKS = ("pre_inference", "post_inference")


def find_hooks(source: Any, label: str) -> dict[str, Any]:
    """The hooks a handler module (or object) defines, each checked to accept (x, signature, metadata)."""
    hooks: dict[str, Any] = {}
    problems = []
    for name in HOOKS:
        hook = getattr(source, name, None)
        if hook is None:
            continue
        if not callable(hook):
            problems.append(f"{name} is a {type(hook).__name__}, not a function")
            continue
        first = "sample" if name == "pre_inference" else "prediction"
        try:
            inspect.signature(hook).bind(None, None, None)
        except TypeError:
            problems.append(f"{describe_callable(hook, name)} must accept ({first}, signature, metadata)")
        except ValueError:
            pass  # no signature to read (a builtin): trust it
        hooks[name] = hook
    if problems:
        raise LoadError(f"{label}: " + "; ".join(problems))
    return hooks


def hook_types(hooks: dict[str, Any], label: str) -> tuple[TypedValue | None, TypedValue | None]:
    """The types of pre_inference's first parameter and of post_inference's result, when annotated."""
    problems: list[str] = []
    types: list[TypedValue | None] = []
    for name, which in (("pre_inference", 0), ("post_inference", "return")):
        hook = hooks.get(name)
        annotation: Any = None
        if hook is not None:
            try:
                hints = typing.get_type_hints(hook, include_extras=True)
                params = list(inspect.signature(hook).parameters)
            except Exception:
                hints, params = {}, []
            key = "return" if which == "return" else (params[0] if params else "")
            annotation = hints.get(key, inspect.Parameter.empty)
        where = describe_callable(hook, name) if hook is not None else name
        types.append(typed_value(annotation, where, problems) if hook is not None else None)
    if problems:
        raise LoadError(f"{label}: " + "; ".join(problems))
    return types[0], types[1]


def _validating_hook(hook: Any, typed: TypedValue) -> Any:
    """pre_inference receiving the body validated into the type its first parameter is annotated with (a large
    body in a worker thread for an async hook)."""
    if inspect.iscoroutinefunction(hook):

        async def validated_async(sample: Any, signature: Any, metadata: Any) -> Any:
            return await hook(await typed.validate_async(sample), signature, metadata)

        return validated_async
    validate = typed.validate
    return lambda sample, signature, metadata: hook(validate(sample), signature, metadata)


def refuse_class_without_hooks(source: Any, label: str) -> None:
    """A handler file that defines a class but no hook is a Cortex handler class given where hooks were
    expected: serving the model without it would silently ignore the user's code."""
    if not isinstance(source, ModuleType):
        return
    classes = sorted(
        name
        for name, value in vars(source).items()
        if isinstance(value, type) and value.__module__ == source.__name__ and not name.startswith("_")
    )
    if classes:
        raise LoadError(
            f"{label} defines class {', '.join(classes)} but no module-level pre_inference or post_inference; "
            "with `model:` the handler file holds the hooks pre_inference(sample, signature, metadata) and/or "
            "post_inference(prediction, signature, metadata). To serve the class as a Cortex handler (__init__("
            "self, config, onnx_client | tensorflow_client) and handle_post(payload) or predict(payload)), set "
            f"handler.class: {classes[0]}"
        )


class ModelFileBackend(Backend):
    """Serves `api.model` (an ONNX file or a SavedModel) with the hooks of `api.handler`."""

    kind = "model_file"
    #: With `batching` configured: concurrent requests' feeds share model calls, on threads of the API's own.
    batcher: TensorBatcher | None = None
    threads: BatchThreads | None = None
    #: With `batching` configured: the thread of the API's own that runs the requests served unbatched while the
    #: server is busy, at the event loop's priority (the batch threads run below it).
    unbatched_thread: BatchThreads | None = None
    #: Where the model runs in this process (`modelserve.devices`); the CPU until loaded.
    device: devices.Device = devices.CPU
    #: The types the hooks annotate (`modelserve.schema`): the body is validated into pre_inference's.
    input_type: TypedValue | None = None
    output_type: TypedValue | None = None
    #: The tensor entry, once loaded: the model alone (no hooks), from arrays by input name to arrays by output
    #: name, each input's dtype and shape already checked against the model's (only dimensions that inputs
    #: share by name are checked here). A protocol whose values are the model's own tensors (V2) asks
    #: `Api.call` to run it instead of `pipeline`.
    tensors: Pipeline | None = None
    #: With `batching`: whether each request is served batched, or unbatched while batching would not pay.
    choice: BatchChoice | None = None

    def __init__(
        self,
        api: ApiConfig,
        root: Path | None,
        metrics_client: MetricsClient,
        api_metrics: ApiMetrics,
    ) -> None:
        assert api.model is not None
        self.api = api
        self.config: ModelFileConfig = api.model
        self.path = (root or Path.cwd()) / self.config.path
        self.label = f"api '{api.name}'"
        self.api_metrics = api_metrics
        self.children = Children(self.label)
        runtimes.check_installed(self.config.format)
        self.hooks_label = ""
        self.hooks: dict[str, Any] = {}
        handler = api.handler
        self.metadata: dict[str, Any] = handler.config if handler is not None else {}
        if handler is not None:
            if handler.class_name is not None:
                raise LoadError(
                    f"{self.label}: handler.class is not used by a model API; its handler file holds "
                    "module-level functions pre_inference and/or post_inference"
                )
            source: ModuleType | Any
            if handler.obj is not None:
                source, self.hooks_label = handler.obj, getattr(handler.obj, "__name__", repr(handler.obj))
            else:
                from modelserve.project import import_file

                assert handler.path is not None and root is not None
                source, self.hooks_label = import_file(root, handler.path), handler.path
            self.hooks = find_hooks(source, f"{self.label}: {self.hooks_label}")
            if not self.hooks:
                refuse_class_without_hooks(source, f"{self.label}: {self.hooks_label}")
            self.input_type, self.output_type = hook_types(self.hooks, f"{self.label}: {self.hooks_label}")
        threshold = self.config.inline_threshold_ms / 1000
        self.adaptive = {
            name: Adaptive(name, threshold, self.label) for name in ("pre_inference", "run", "post_inference")
        }
        self.model: LoadedModel | None = None
        self.converter: InputConverter | None = None

    async def load(self) -> None:
        self.children.note()
        self.device = devices.assign(self.api.devices)
        devices.place(self.api.name, self.device)
        self.model = await _threads.run_sync(self._load_model)
        try:
            self.converter = InputConverter(self.model.inputs)
        except TypeError as exc:
            raise LoadError(f"{self.label}: {self.config.path}: {exc}") from None
        await _threads.run_sync(self._warm_up, self.model)
        self.pipeline = self._build_pipeline()
        run = Stage("run", self._run_stage(with_post=False, tensors=True), True, shared=True)
        timer = self.api_metrics.stage_timer
        if self.api.batching is None:
            self.tensors = self._fused_pipeline([run], True)
        else:
            self.tensors = self._choosing(Pipeline([run], needs_inputs=True, needs_request=False, timer=timer), True)
        if self.threads is not None:
            # The batch threads start off the loop, each warmed by a call with zeros: a GPU runtime builds
            # per-thread state on a thread's first call.
            zeros = {spec.name: spec.example() for spec in self.model.inputs}
            await _threads.run_sync(partial(self.threads.start, warm=partial(self.model.run, zeros)))
            if self.unbatched_thread is not None:
                await _threads.run_sync(partial(self.unbatched_thread.start, warm=partial(self.model.run, zeros)))

    def _load_model(self) -> LoadedModel:
        adapter = runtimes.adapter(self.config.format)
        try:
            model: LoadedModel = adapter.load(self.path, self.config, device=self.device)
        except LoadError as exc:
            raise LoadError(f"{self.label}: {exc}") from exc
        return model

    def _warm_up(self, model: LoadedModel) -> None:
        """Two calls with zeros: the first call of a model is slow (allocations, TensorFlow's tracing), so the
        second one seeds the estimate."""
        feeds = {spec.name: spec.example() for spec in model.inputs}
        try:
            model.run(feeds)
            started = time.perf_counter()
            model.run(feeds)
        except Exception as exc:  # a model may refuse zeros; then the first request is measured instead
            logger.debug("%s: warm-up call failed (%s); skipped", self.label, exc)
            return
        self.adaptive["run"].seed(time.perf_counter() - started, _size(feeds))

    # ------------------------------------------------------------------------------------------------
    # the stages

    def _build_pipeline(self) -> Pipeline:
        stages = []
        pre = self.hooks.get("pre_inference")
        if pre is not None:
            if self.input_type is not None:
                pre = _validating_hook(pre, self.input_type)
            stages.append(Stage("pre_inference", self._hook_stage(pre, "pre_inference", self._pre_signature()), True))
        stages.append(Stage("run", self._run_stage(with_post="post_inference" in self.hooks), True, shared=True))
        post = self.hooks.get("post_inference")
        if post is not None:
            stages.append(
                Stage("post_inference", self._hook_stage(post, "post_inference", self._post_signature()), True)
            )
        timer = self.api_metrics.stage_timer
        if self.api.batching is None:
            return self._fused_pipeline(stages, False)
        # Batched: the hooks limited to max_concurrency calls at once here (Api.load finds them so), and each
        # request served batched or not by the API's `BatchChoice`.
        stage_limit = self.api.max_concurrency
        pipeline = Pipeline(stages, needs_inputs=True, needs_request=False, timer=timer, stage_limit=stage_limit)
        return self._choosing(pipeline, tensors=False)

    def _choosing(self, pipeline: Pipeline, tensors: bool) -> Pipeline:
        """`pipeline` (batched) running each request as `choice` says: batched, or as one unbatched step."""
        fused = self._fused(tensors, in_batched_api=True)
        if fused is not None and self.choice is not None:
            assert self.threads is not None
            step, run_all = fused
            threads, single = self.threads, self.unbatched_thread
            assert single is not None
            pipeline.run = self.choice.step(
                step,
                pipeline.run,
                busy=partial(single.run_here, run_all),
                occupied=lambda: threads.busy() or single.busy(),
            )
        return pipeline

    def _fused_pipeline(self, stages: list[Stage], tensors: bool) -> Pipeline:
        """The unbatched pipeline of `stages`, run by the one step where the hooks allow it (`_fused`)."""
        fused = self._fused(tensors)
        timer = self.api_metrics.stage_timer
        if fused is None:
            return Pipeline(stages, needs_inputs=True, needs_request=False, timer=timer)
        step, run_all = fused
        return Pipeline(stages, needs_inputs=True, needs_request=False, timer=timer, run=step, busy_call=run_all)

    def _pre_signature(self) -> Any:
        assert self.model is not None
        return self.model.pre_signature

    def _post_signature(self) -> Any:
        assert self.model is not None
        return self.model.post_signature

    def _hook_stage(self, hook: Any, name: str, signature: Any) -> Any:
        metadata = self.metadata
        if inspect.iscoroutinefunction(hook):

            async def call_async(value: Any, request: Any) -> Any:
                return await hook(value, signature, metadata)

            return call_async
        adaptive = self.adaptive[name]

        async def call(value: Any, request: Any) -> Any:
            return await adaptive.call(hook, value, signature, metadata)

        return call

    def _model_ends(self, with_post: bool, tensors: bool) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
        """``feeds_of(value)`` and ``answer_of(prediction)``: the sync work around the model's run, of the payload's
        values (converted to the model's inputs) or, for the tensor entry (`tensors`), of arrays by input name,
        answered by output name."""
        model, converter = self.model, self.converter
        assert model is not None and converter is not None
        as_response = model.as_response
        # TensorFlow's post_inference gets flat lists (Cortex's form); ONNX's gets the runtime's list as it is.
        for_hook = model.for_hook if type(model).for_hook is not LoadedModel.for_hook else None
        has_pre = "pre_inference" in self.hooks
        names = tuple(spec.name for spec in model.outputs)  # ONNX's outputs come as a list in this order
        # The tensor entry's arrays were checked against the model's inputs (names, exact dtypes, shapes); the
        # converter has one more check to make for inputs that share a named dimension, and none otherwise
        # (2 us of a small model's 20).
        shared = [dim for spec in model.inputs for dim in spec.shape or () if isinstance(dim, str)]
        if tensors and len(shared) == len(set(shared)):
            feeds_of: Callable[[Any], Any] = _same
        elif tensors or has_pre:
            feeds_of = converter
        else:

            def feeds_of(value: Any) -> Any:
                if isinstance(value, (bytes, bytearray)):
                    raise BadRequest(
                        "expected a JSON body (Content-Type: application/json) keyed by the model's input names: "
                        + converter.expected()
                    )
                return converter(value)

        def by_name(prediction: Any) -> Any:
            return prediction if isinstance(prediction, dict) else dict(zip(names, prediction, strict=True))

        answer_of: Callable[[Any], Any] = _same
        if tensors:
            answer_of = by_name
        elif not with_post:
            answer_of = as_response
        elif for_hook is not None:
            answer_of = for_hook
        return feeds_of, answer_of

    def _run_stage(self, with_post: bool, tensors: bool = False) -> Any:
        """The model's run as a stage (of the staged pipeline: with batching or an async hook)."""
        assert self.model is not None
        feeds_of, answer_of = self._model_ends(with_post, tensors)
        adaptive = self.adaptive["run"]
        run = self.model.run
        several, first = len(self.model.inputs) > 1, self.model.inputs[0].name
        batched = None
        if self.api.batching is not None:  # one batcher for both entries: their requests share its calls
            batched = self.batcher.run if self.batcher is not None else self._batched_run()

        async def call(value: Any, request: Any) -> Any:
            feeds = feeds_of(value)
            if batched is not None:
                prediction = await batched(feeds)
            else:
                size = _size(feeds) if several else feeds[first].size
                prediction = adaptive.now(run, feeds, size=size)
                if prediction is THREAD:
                    prediction = await adaptive.in_thread(run, feeds, size=size)
            return answer_of(prediction)

        return call

    def _fused(self, tensors: bool = False, in_batched_api: bool = False) -> tuple[Step, Callable[..., Any]] | None:
        """The unbatched call with sync hooks as one step: pre_inference, the model and post_inference, each an
        `Adaptive` call (a plain call while inline, awaited only when it goes to a thread); and the same call as
        one function for a worker thread, ``run_all(value, request, ctx)``, its calls counted as thread calls,
        which runs the call while the server is busy (`Api.call`): the pipeline's `busy_work` through the line,
        or in a batched API's own threads.

        The staged pipeline costs a coroutine per stage and one more per hook call, with the same checks and
        timing between them: in one process, 9 coroutines of an iris request with both hooks where this has one
        (the staged pipeline stays the reference, and what batching and async hooks run). None where it does
        not apply. `in_batched_api`: the step a batched API serves a request with when batching would not pay
        (`stacking.BatchChoice`); its model calls are timed as the stage "run (unbatched)"."""
        if self.api.batching is not None and not in_batched_api:
            return None
        model = self.model
        assert model is not None
        pre = None if tensors else self.hooks.get("pre_inference")
        post = None if tensors else self.hooks.get("post_inference")
        if any(hook is not None and inspect.iscoroutinefunction(hook) for hook in (pre, post)):
            return None
        if pre is not None and self.input_type is not None:
            pre = _validating_hook(pre, self.input_type)
        feeds_of, answer_of = self._model_ends(post is not None, tensors)
        pre_args = (model.pre_signature, self.metadata)
        post_args = (model.post_signature, self.metadata)
        at_pre, at_run, at_post = (self.adaptive[name] for name in ("pre_inference", "run", "post_inference"))
        run, several, first = model.run, len(model.inputs) > 1, model.inputs[0].name
        timer = self.api_metrics.stage_timer
        run_stage = "run (unbatched)" if in_batched_api else "run"

        async def step(value: Any, request: Any, ctx: RequestContext | None) -> Any:
            if pre is not None:
                started = perf_counter()
                try:
                    result = at_pre.now(pre, value, *pre_args)
                    if result is THREAD:
                        result = await at_pre.in_thread(pre, value, *pre_args)
                except PASS_THROUGH:
                    raise
                except BaseException as exc:  # noqa: B036 - SystemExit in user code is a failed call
                    raise UserCodeError("pre_inference", exc) from exc
                timer("pre_inference", perf_counter() - started)
                if ctx is not None and ctx.cancelled:
                    raise RequestCancelled()
                value = result
            started = perf_counter()
            try:
                feeds = feeds_of(value)
                size = _size(feeds) if several else feeds[first].size
                prediction = at_run.now(run, feeds, size=size)
                if prediction is THREAD:
                    prediction = await at_run.in_thread(run, feeds, size=size)
                value = answer_of(prediction)
            except PASS_THROUGH:
                raise
            except BaseException as exc:  # noqa: B036
                raise UserCodeError("run", exc) from exc
            timer(run_stage, perf_counter() - started)
            if post is None:
                return value
            if ctx is not None and ctx.cancelled:
                raise RequestCancelled()
            started = perf_counter()
            try:
                result = at_post.now(post, value, *post_args)
                if result is THREAD:
                    result = await at_post.in_thread(post, value, *post_args)
            except PASS_THROUGH:
                raise
            except BaseException as exc:  # noqa: B036
                raise UserCodeError("post_inference", exc) from exc
            timer("post_inference", perf_counter() - started)
            return result

        def model_part(value: Any) -> Any:
            return answer_of(run(feeds_of(value)))

        def part(stage: str, timed_as: str, adaptive: Adaptive, fn: Callable[..., Any], *args: Any) -> Any:
            # In a worker thread: a plain call, timed for the metrics, not for `Adaptive`'s estimates (a call
            # waiting for the GIL behind the event loop's work would count that wait).
            adaptive.thread_calls += 1
            started = perf_counter()
            try:
                result = fn(*args)
            except PASS_THROUGH:
                raise
            except BaseException as exc:  # noqa: B036
                raise UserCodeError(stage, exc) from exc
            timer(timed_as, perf_counter() - started)
            return result

        def run_all(value: Any, request: Any, ctx: RequestContext | None) -> Any:
            if pre is not None:
                value = part("pre_inference", "pre_inference", at_pre, pre, value, *pre_args)
                if ctx is not None and ctx.cancelled:
                    raise RequestCancelled()
            value = part("run", run_stage, at_run, model_part, value)
            if post is None:
                return value
            if ctx is not None and ctx.cancelled:
                raise RequestCancelled()
            return part("post_inference", "post_inference", at_post, post, value, *post_args)

        return step, run_all

    def _batched_run(self) -> Callable[[dict[str, Any]], Awaitable[Any]]:
        """The model call behind a batcher: the feeds of concurrent requests are stacked into shared calls.

        Calls are `Adaptive` calls: inline while measured fast, else in a worker thread. A lone request is
        measured with the unbatched calls (``run``), stacked calls on their own estimate, so that the large
        calls of a busy server do not send the lone requests of a quiet one to a thread.
        """
        model, batching = self.model, self.api.batching
        assert model is not None and batching is not None
        alone, run = self.adaptive["run"], model.run
        stacked = Adaptive("run (stacked)", alone.threshold, self.label)
        # The model's calls in threads of the API's own, each warmed by a call at load (a GPU runtime builds
        # per-thread state on a thread's first call).
        self.threads = BatchThreads(self.api.name, self.api.max_concurrency)
        alone.threads = stacked.threads = self.threads
        # A request served unbatched while the server is busy runs in a thread of its own at the loop's nice
        # value: in a batch thread (nice +5, so that a heavy model's batches find every request the loop read
        # meanwhile) the loop preempted it at every request that came, once per request (the 3x256 MLP served
        # 0.69-0.82x the requests at 16 and 64 connections, docs/batching.md).
        self.unbatched_thread = BatchThreads(self.api.name, 1, nice=0, role="unbatched")
        sync_hooks = [self.adaptive[name] for name, hook in self.hooks.items() if not inspect.iscoroutinefunction(hook)]
        self.choice = BatchChoice(alone, sync_hooks)

        def run_alone(feeds: dict[str, Any]) -> Any:
            return alone.measured(run, feeds, size=_size(feeds))

        def run_stacked(feeds: dict[str, Any]) -> Any:
            return stacked.measured(run, feeds, size=_size(feeds))

        self.batcher = TensorBatcher(
            run_alone,
            model.inputs,
            model.outputs,
            batching,
            name=self.api.name,
            run_stacked=run_stacked,
            execution=stacked.describe,
            max_concurrency=self.api.max_concurrency,
            on_batch=self.api_metrics.batch,
            threads=self.threads,
        )
        return self.batcher.run

    def describe(self) -> dict[str, Any]:
        model: dict[str, Any] = {"path": self.config.path, "format": self.config.format}
        if self.config.format == "tensorflow":
            model["signature_key"] = self.config.signature_key
        if self.model is not None:
            model.update(self.model.describe())
        return {
            "model": model,
            "hooks": {name: (self.hooks_label if name in self.hooks else None) for name in HOOKS},
            "execution": {
                "inline_threshold_ms": self.config.inline_threshold_ms,
                "stages": {
                    name: adaptive.describe()
                    for name, adaptive in self.adaptive.items()
                    if name == "run" or name in self.hooks
                },
            },
            "batching": self._describe_batching(),
            "device": self.device.name,
            "worker": devices.worker_slot(),
        }

    def _describe_batching(self) -> dict[str, Any] | None:
        if self.batcher is None:
            return None
        return {**self.batcher.describe(), **(self.choice.describe() if self.choice is not None else {})}

    async def close(self) -> None:
        if self.threads is not None:
            self.threads.close()
        if self.unbatched_thread is not None:
            self.unbatched_thread.close()
        if self.model is not None:
            self.model.close()
        await _threads.run_sync(self.children.stop)


def _same(value: Any) -> Any:
    return value


def _size(feeds: dict[str, Any]) -> int:
    size = 0
    for array in feeds.values():
        size += array.size
    return size
