"""Cortex handlers: the classes of Cortex 0.19-0.35 and the predictor modules of Cortex 0.11.

A class (``Handler`` in 0.32-0.35; ``PythonPredictor``, ``TensorFlowPredictor`` or ``ONNXPredictor`` before)
is constructed once with the arguments its ``__init__`` names: ``config`` (the handler's ``config:``, a copy),
``metrics_client``, and the client of its type: ``tensorflow_client`` / ``onnx_client`` (``predict(model_input,
model_name=None, model_version="latest")`` on the API's models, with the input rules of a model API), or
``python_client`` / ``model_client`` (``get_model(model_name=None, model_version="latest")``, the result of
the class's ``load_model(model_path)``, loaded once at start).

Requests: ``POST /<api>`` calls ``handle_post`` (or ``predict``), passing ``payload``, ``query_params`` and
``headers`` to the parameters it names (with ``server_side_batching``, lists of them, one item per request, and
it returns a list); an AsyncAPI's job calls ``handle_async(payload, request_id)`` (``predict`` in 0.31). As in
Cortex 0.19-0.35, a ``str`` result is sent as text/plain, ``bytes`` as application/octet-stream, a starlette
Response as it is and anything else as JSON; a ``(result, callback)`` pair runs the callback once the answer is
ready, without delaying it. The backend builds no response: a text answer is a `modelserve.codecs.Answer`, which
the HTTP edge sends. ``handle_get``, ``handle_put``, ``handle_patch`` and ``handle_delete`` are not served: modelserve's
route answers GET with the API's description and other methods with 405 (see docs/compatibility.md).

A module (Cortex 0.11 ``predictor:``) has ``init(model_path, metadata)``, called once at start, and
``predict(sample, metadata)``, called on each ``POST``; its results are encoded as any modelserve result.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from modelserve import _threads, runtimes
from modelserve._threads import BatchThreads
from modelserve.backends import Backend
from modelserve.backends._children import Children
from modelserve.batching import Batcher
from modelserve.codecs import Answer, encode_json
from modelserve.compat.cortex_clients import ModelClient, PythonClient, load_model
from modelserve.config import CortexConfig
from modelserve.context import current_request_id
from modelserve.errors import LoadError
from modelserve.introspect import describe_callable, required_unknown_params, select_kwargs
from modelserve.pipeline import Pipeline, Stage
from modelserve.project import apply_api_environment, describe_error, import_file

if TYPE_CHECKING:
    from modelserve.api_metrics import ApiMetrics
    from modelserve.config import ApiConfig
    from modelserve.metrics import MetricsClient

#: The class names Cortex looked for, newest first, by handler type.
CLASS_NAMES = {
    "python": ("Handler", "PythonPredictor"),
    "tensorflow": ("Handler", "TensorFlowPredictor"),
    "onnx": ("Handler", "ONNXPredictor"),
}
#: The constructor parameter that receives the client, by handler type.
CLIENT_ARGS = {
    "python": ("python_client", "model_client"),
    "tensorflow": ("tensorflow_client",),
    "onnx": ("onnx_client",),
}
REQUEST_ARGS = ("payload", "query_params", "headers")
JOB_ARGS = ("payload", "request_id")
OTHER_VERBS = ("handle_get", "handle_put", "handle_patch", "handle_delete")


class CortexHandlerBackend(Backend):
    """Serves a Cortex handler class or predictor module (`api.cortex`)."""

    kind = "cortex_handler"

    def __init__(self, api: ApiConfig, root: Path | None, metrics_client: MetricsClient, api_metrics: ApiMetrics):
        if api.cortex is None and api.model is not None:
            # A model with a handler class in modelserve.yaml: a Cortex TensorFlow/ONNX handler whose client
            # serves that model.
            api = replace(api, model=None, cortex=CortexConfig(type=api.model.format, models={"": api.model}))
        assert api.cortex is not None and api.handler is not None
        self.api = api
        self.cortex: CortexConfig = api.cortex
        self.root = root or Path.cwd()
        self.metrics_client = metrics_client
        self.api_metrics = api_metrics
        self.config = api.handler.config
        self.children = Children(f"api '{api.name}'")
        #: With Cortex's server_side_batching (a python handler): concurrent requests' payloads in one call.
        self.batcher: Batcher | None = None
        for model in self.cortex.models.values():
            if model.format != "python":
                runtimes.check_installed(model.format)
        apply_api_environment(self.root, api.env, api.python_path)
        source = self._source()
        self.instance: Any = None
        self.client: Any = None
        if self.cortex.style == "module":
            self.cls = None
            self._check_module(source)
        else:
            self.cls = source if isinstance(source, type) else self._find_class(source)
            self._check_class(self.cls)

    # ------------------------------------------------------------------------------------------------
    # validation, when the app is created

    def _source(self) -> Any:
        handler = self.api.handler
        assert handler is not None
        if handler.obj is not None:
            self.label = getattr(handler.obj, "__qualname__", repr(handler.obj))
            return handler.obj
        assert handler.path is not None
        self.label = handler.path
        # Per API: Cortex ran each API in a process of its own, so two APIs naming one file (with two
        # models, say) never shared its module-level globals.
        return import_file(self.root, handler.path, instance=self.api.name)

    def _find_class(self, module: ModuleType) -> type:
        names = CLASS_NAMES[self.cortex.type]
        wanted = [self.api.handler.class_name] if self.api.handler and self.api.handler.class_name else list(names)
        for name in wanted:
            cls = getattr(module, name, None)
            if isinstance(cls, type):
                self.label = f"{self.label}:{name}"
                return cls
        client = "" if self.cortex.type == "python" else f", {CLIENT_ARGS[self.cortex.type][0]}"
        method = (
            "handle_async(self, payload) (or predict(self, payload) in Cortex 0.31)"
            if self.api.kind == "async"
            else "handle_post(self, payload) (or predict(self, payload) before Cortex 0.32)"
        )
        raise LoadError(
            f"api '{self.api.name}': {self.label} has no class {' or '.join(wanted)}; a Cortex "
            f"{self.cortex.type} handler is a class with __init__(self, config{client}) and {method}"
        )

    def _check_class(self, cls: type) -> None:
        where = f"api '{self.api.name}': {self.label}"
        problems: list[str] = []
        init = cls.__init__ if cls.__init__ is not object.__init__ else None  # type: ignore[misc]
        clients = CLIENT_ARGS[self.cortex.type]
        known = {"self", "config", "metrics_client", "job_spec", *clients}
        if init is not None:
            missing = required_unknown_params(init, known)
            if missing:
                problems.append(
                    f"{describe_callable(init, cls.__name__ + '.__init__')} requires {missing}; a Cortex "
                    f"{self.cortex.type} handler's constructor may take config, {', '.join(clients)} and "
                    "metrics_client"
                )
        names: tuple[str, ...]
        allowed: tuple[str, ...]
        if self.api.kind == "async":  # Cortex 0.31's AsyncAPI called predict(payload, request_id)
            names, allowed = ("handle_async", "predict"), JOB_ARGS
        else:
            names, allowed = ("handle_post", "predict"), REQUEST_ARGS
        method_name = next((name for name in names if callable(getattr(cls, name, None))), None)
        if method_name is None:
            others = [name for name in OTHER_VERBS if callable(getattr(cls, name, None))]
            also = f" ({', '.join(others)} are not served here: GET /<api> describes the API)" if others else ""
            expected = (
                "handle_async(self, payload, request_id) (or predict(self, payload, request_id) in Cortex 0.31)"
                if self.api.kind == "async"
                else (
                    "handle_post(self, payload, query_params, headers) (or predict(...) before Cortex 0.32), "
                    "each parameter optional"
                )
            )
            problems.append(f"class {cls.__name__} needs a method {expected}{also}")
        else:
            method = getattr(cls, method_name)
            missing = required_unknown_params(method, {"self", *allowed})
            if missing:
                problems.append(
                    f"{describe_callable(method, cls.__name__ + '.' + method_name)} requires {missing}; it may "
                    f"take only {', '.join(allowed)}"
                )
            if inspect.isasyncgenfunction(method) or inspect.isgeneratorfunction(method):
                problems.append(f"{cls.__name__}.{method_name} is a generator; Cortex handlers return one result")
            self.method_name = method_name
            self.wants = set(select_kwargs(method, dict.fromkeys(allowed)))
            self.is_async = inspect.iscoroutinefunction(method)
        if self.cortex.type == "python" and self.cortex.models and not callable(getattr(cls, "load_model", None)):
            problems.append(f"class {cls.__name__} has models configured but no method load_model(self, model_path)")
        if self.api.batching is not None and method_name is not None and self.is_generator(cls, method_name):
            problems.append(f"{cls.__name__}.{method_name} streams; with server_side_batching it returns a list")
        if problems:
            raise LoadError(f"{where}: " + "; ".join(problems))
        self.ignored = [name for name in OTHER_VERBS if callable(getattr(cls, name, None))]

    def _check_module(self, module: Any) -> None:
        where = f"api '{self.api.name}': {self.label}"
        predict = getattr(module, "predict", None)
        if not callable(predict):
            raise LoadError(f"{where}: a Cortex predictor file needs a function predict(sample, metadata)")
        for name, fn, args in (("predict", predict, 2), ("init", getattr(module, "init", None), 2)):
            if fn is None:
                continue
            try:
                inspect.signature(fn).bind(*([None] * args))
            except TypeError:
                expected = "predict(sample, metadata)" if name == "predict" else "init(model_path, metadata)"
                raise LoadError(f"{where}: {describe_callable(fn, name)} must accept {expected}") from None
            except ValueError:
                pass
        self.method_name, self.wants, self.ignored = "predict", {"payload"}, []
        self.is_async = inspect.iscoroutinefunction(predict)

    # ------------------------------------------------------------------------------------------------
    # loading

    @staticmethod
    def is_generator(cls: type, name: str) -> bool:
        method = getattr(cls, name)
        return inspect.isasyncgenfunction(method) or inspect.isgeneratorfunction(method)

    async def load(self) -> None:
        self.children.note()
        self.client = await _threads.run_sync(self._make_client)
        if self.cortex.style == "module":
            await _threads.run_sync(self._init_module)
        else:
            self.instance = await _threads.run_sync(self._construct)
            if isinstance(self.client, PythonClient) and self.cortex.models:
                await _threads.run_sync(self.client.load_all, self.instance.load_model, self.label)
        self.pipeline = self._build_pipeline()
        if self.batcher is not None and self.batcher.threads is not None:
            await _threads.run_sync(self.batcher.threads.start)

    def _make_client(self) -> Any:
        if self.cortex.type == "python":
            return PythonClient({name: str(self.root / model.path) for name, model in self.cortex.models.items()})
        models = {name: load_model(self.root, model, self.api.name) for name, model in self.cortex.models.items()}
        return ModelClient(models)

    def _construct(self) -> Any:
        assert self.cls is not None
        available: dict[str, Any] = {
            "config": copy.deepcopy(self.config),
            "metrics_client": self.metrics_client,
            "job_spec": None,
        }
        for name in CLIENT_ARGS[self.cortex.type]:
            available[name] = self.client
        cls = self.cls
        init = getattr(cls, "__init__")  # noqa: B009 - mypy refuses cls.__init__
        try:
            return cls(**select_kwargs(init, available)) if init is not object.__init__ else cls()
        except Exception as exc:
            raise LoadError(
                f"api '{self.api.name}': {self.label}: {cls.__name__}() raised {describe_error(exc)}"
            ) from exc

    def _init_module(self) -> None:
        handler = self.api.handler
        assert handler is not None
        module = handler.obj if handler.obj is not None else import_file(self.root, handler.path or "", self.api.name)
        init = getattr(module, "init", None)
        self.module_predict = module.predict
        if init is None:
            return
        model = self.cortex.models.get("")
        model_path = str(self.root / model.path) if model is not None else None
        try:
            init(model_path, self.config)
        except Exception as exc:
            raise LoadError(f"api '{self.api.name}': {self.label}: init() raised {describe_error(exc)}") from exc

    # ------------------------------------------------------------------------------------------------
    # requests

    def _build_pipeline(self) -> Pipeline:
        needs_inputs = "payload" in self.wants
        if self.cortex.style == "module":
            predict, metadata = self.module_predict, self.config
            call = _module_call(predict, metadata, self.is_async)
            needs_request = False
        else:
            method = getattr(self.instance, self.method_name)
            realtime = self.api.kind != "async"
            post = getattr(self.instance, "post_predict", None) if realtime else None
            post = post if callable(post) else None
            if self.api.batching is not None:
                self.batcher = self._batcher(method)
                call = _batched_call(self.batcher, self.wants, post)
                return Pipeline(
                    [Stage(self.method_name, call, True, shared=True)],
                    needs_inputs=True,
                    needs_request=bool(self.wants & {"query_params", "headers"}) or post is not None,
                    timer=self.api_metrics.stage_timer,
                )
            call = _class_call(method, self.wants, self.is_async, realtime, post)
            needs_request = bool(self.wants & {"query_params", "headers"}) or callable(post)
            needs_inputs = needs_inputs or callable(post)
        return Pipeline(
            [Stage(self.method_name, call, self.is_async)],
            needs_inputs=needs_inputs,
            needs_request=needs_request,
            timer=self.api_metrics.stage_timer,
        )

    def _batcher(self, method: Any) -> Batcher:
        """Cortex's server_side_batching for a python handler: the method gets lists (``payload``,
        ``query_params``, ``headers``: one item per request, in the same order) and returns a list of results
        in that order. One batch runs at a time, as in Cortex (its batcher had one thread)."""
        batching = self.api.batching
        assert batching is not None
        names = [name for name in REQUEST_ARGS if name in self.wants]

        def arguments(items: list[tuple[Any, Any]]) -> dict[str, list[Any]]:
            lists: dict[str, list[Any]] = {name: [] for name in names}
            for value, request in items:
                for name in names:
                    if name == "payload":
                        lists[name].append(value)
                    else:
                        lists[name].append(getattr(request, name) if request is not None else {})
            return lists

        options: dict[str, Any] = {
            "name": self.api.name,
            "max_batch_size": batching.max_batch_size,
            "max_wait_ms": batching.max_wait_ms,
            "max_concurrency": 1,
            "on_batch": self.api_metrics.batch,
        }
        if self.is_async:

            async def call_batch(items: list[tuple[Any, Any]]) -> list[Any]:
                return await method(**arguments(items))  # type: ignore[no-any-return]

            return Batcher(call_batch, **options)
        return Batcher(
            sync_call=lambda items: method(**arguments(items)), threads=BatchThreads(self.api.name, 1), **options
        )

    def describe(self) -> dict[str, Any]:
        models = {name or "(single)": model.path for name, model in self.cortex.models.items()}
        info: dict[str, Any] = {
            "handler": self.label,
            "type": self.cortex.type,
            "method": {"name": self.method_name, "async": self.is_async, "takes": sorted(self.wants)},
            "models": models,
        }
        if self.ignored:
            info["not_served"] = self.ignored
        if self.api.batching is not None:
            info["server_side_batching"] = {
                "max_batch_size": self.api.batching.max_batch_size,
                "batch_interval_ms": self.api.batching.max_wait_ms,
            }
        return info

    async def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
        if isinstance(self.client, ModelClient):
            self.client.close()
        await _threads.run_sync(self.children.stop)
        self.let_go("batcher", "client", "module_predict")  # a repository unload frees the handler's model


def _class_call(method: Any, wants: set[str], is_async: bool, realtime: bool, post: Any = None) -> Any:
    """A handler method as a pipeline stage. Realtime results are sent as Cortex sent them; `post` is the
    class's post_predict (Cortex 0.19-0.31), called with the response after it is sent."""
    finish = _finisher(post) if realtime else (lambda result, value, request: result)

    if is_async:

        async def call_async(value: Any, request: Any) -> Any:
            return finish(await method(**_arguments(wants, value, request)), value, request)

        return call_async
    return lambda value, request: finish(method(**_arguments(wants, value, request)), value, request)


def _batched_call(batcher: Batcher, wants: set[str], post: Any) -> Any:
    """A request's place in a batch; its own result is sent as Cortex sent each (str as text, a
    ``(result, callback)`` pair's callback after the answer)."""
    finish = _finisher(post)

    async def call(value: Any, request: Any) -> Any:
        return finish(await batcher.submit((value, request)), value, request)

    return call


def _finisher(post: Any) -> Any:
    """A realtime result as Cortex sent it, with post_predict (Cortex 0.19-0.31) run once it is ready."""
    post_wants = set(select_kwargs(post, dict.fromkeys(("response", *REQUEST_ARGS)))) if post is not None else set()

    def finish(result: Any, value: Any, request: Any) -> Any:
        if post is None:
            return as_cortex_answer(result)
        answer = as_cortex_answer(result, always=True)
        kwargs = _arguments(post_wants, value, request)
        if "response" in post_wants:
            kwargs["response"] = answer
        return _then(answer, lambda: post(**kwargs))

    return finish


def _arguments(names: set[str], value: Any, request: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if "payload" in names:
        kwargs["payload"] = value
    if "query_params" in names:
        kwargs["query_params"] = request.query_params if request is not None else {}
    if "headers" in names:
        kwargs["headers"] = request.headers if request is not None else {}
    if "request_id" in names:
        kwargs["request_id"] = current_request_id()
    return kwargs


def _module_call(predict: Any, metadata: dict[str, Any], is_async: bool) -> Any:
    if is_async:

        async def call_async(value: Any, request: Any) -> Any:
            return await predict(value, metadata)

        return call_async
    return lambda value, request: predict(value, metadata)


def as_cortex_answer(result: Any, always: bool = False) -> Any:
    """A handler's result as Cortex 0.19-0.35 sent it: a str as text/plain, and a (result, callback) pair's
    callback run once the answer is ready. Other results are left to modelserve's encoding (JSON, bytes)
    unless `always` asks for an `Answer` (post_predict is given one)."""
    callback = None
    if isinstance(result, tuple) and len(result) == 2 and callable(result[1]):
        result, callback = result
    if isinstance(result, str):
        return _then(Answer(result.encode(), "text/plain; charset=utf-8"), callback)
    if callback is None and not always:
        return result
    if _is_response(result):
        return _then(result, callback)
    if isinstance(result, (bytes, bytearray)):
        return _then(Answer(bytes(result), "application/octet-stream"), callback)
    return _then(Answer(encode_json(result), "application/json"), callback)


def _is_response(value: Any) -> bool:
    """A Starlette Response that the handler built itself (sent as it is): told by its shape, since compat
    imports no HTTP module."""
    return callable(value) and hasattr(value, "background") and hasattr(value, "status_code")


def _then(answer: Any, callback: Any) -> Any:
    """`answer` with `callback` to run once it is ready: an `Answer`'s background, or after a handler's own
    Response's background (Starlette awaits ``response.background()`` once the response is sent)."""
    if callback is None:
        return answer
    if type(answer) is Answer:
        answer.background.append(callback)
    else:
        answer.background = _After(answer.background, callback)
    return answer


class _After:
    """A handler's Response's background (if any), then a Cortex callback, called in a worker thread."""

    def __init__(self, first: Any, callback: Any) -> None:
        self.first = first
        self.callback = callback

    async def __call__(self) -> None:
        if self.first is not None:
            await self.first()
        outcome = await _threads.run_sync(self.callback)
        if inspect.isawaitable(outcome):
            await outcome
