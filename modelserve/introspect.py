"""Handler introspection: read a user's class once, at load time, and decide how to call it.

Everything the request path needs to know (which stages exist, whether each takes the inputs and/or the
request, sync or async, generator or not) is decided here, so that serving a request does no
introspection. Invalid signatures are reported all together in one `LoadError`.
"""

from __future__ import annotations

import inspect
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from starlette.requests import Request

from modelserve.errors import LoadError
from modelserve.schema import TypedValue, chunk_type, typed_value

STAGES = ("preprocess", "predict", "postprocess")

_ACCEPTED = "accepted forms: (inputs), (inputs, request: Request) or (request: Request)"


@dataclass(frozen=True)
class StageSpec:
    """How one stage of a Model is called."""

    name: str
    takes_inputs: bool
    takes_request: bool
    is_async: bool
    #: "sync" or "async" for a generator function (streaming), else None.
    generator: str | None = None
    #: The annotations of the inputs and of the result, resolved (``inspect.Parameter.empty`` when absent).
    input_annotation: Any = inspect.Parameter.empty
    return_annotation: Any = inspect.Parameter.empty
    #: The type the decoded body is validated into (`modelserve.schema`): set on the first stage taking the
    #: inputs when its inputs are annotated.
    input_type: TypedValue | None = None
    #: The type of the answer (of each chunk, for a generator): set on the last stage when it is annotated.
    output_type: TypedValue | None = None

    def bind(self, instance: Any) -> Callable[..., Any]:
        method: Callable[..., Any] = getattr(instance, self.name)
        return method


@dataclass(frozen=True)
class ModelSpec:
    """What a Model class offers, validated."""

    cls: type
    stages: tuple[StageSpec, ...]
    has_load: bool
    load_is_async: bool

    @property
    def needs_inputs(self) -> bool:
        """False when no stage reads the body: then it is never parsed."""
        return any(stage.takes_inputs for stage in self.stages)

    @property
    def needs_request(self) -> bool:
        return any(stage.takes_request for stage in self.stages)

    @property
    def input_type(self) -> TypedValue | None:
        """The type the body is validated into, when the first stage taking the inputs annotates them."""
        first = next((stage for stage in self.stages if stage.takes_inputs), None)
        return first.input_type if first is not None else None

    @property
    def output_type(self) -> TypedValue | None:
        """The type of the answer (of each chunk of a stream), when the last stage annotates its result."""
        return self.stages[-1].output_type if self.stages else None

    def stage(self, name: str) -> StageSpec | None:
        for stage in self.stages:
            if stage.name == name:
                return stage
        return None


def vars_of(cls: type, name: str) -> Any:
    return getattr(cls, name, None)


def describe_callable(fn: Any, name: str | None = None) -> str:
    """``Model.predict(self, inputs, request)`` as the user wrote it."""
    label = str(name or getattr(fn, "__qualname__", repr(fn)))
    try:
        return f"{label}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        return label


def _positional_params(fn: Any, drop_self: bool) -> list[inspect.Parameter]:
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    return params[1:] if drop_self else params


def _resolve_annotation(fn: Any, param: inspect.Parameter, hints: dict[str, Any]) -> Any:
    return _resolve(fn, param.name, param.annotation, hints)


def _resolve(fn: Any, name: str, annotation: Any, hints: dict[str, Any]) -> Any:
    if name in hints:
        return hints[name]
    if isinstance(annotation, str):
        module = sys.modules.get(getattr(fn, "__module__", "") or "")
        namespace = dict(vars(module)) if module is not None else {}
        namespace.update(getattr(fn, "__globals__", {}))
        try:
            return eval(annotation, namespace)  # noqa: S307 - resolving the user's own annotation
        except Exception:
            return annotation
    return annotation


def is_request_annotation(annotation: Any) -> bool:
    """True for starlette.requests.Request, its subclasses (fastapi.Request) and Optional of them."""
    if isinstance(annotation, type):
        return issubclass(annotation, Request)
    origin = typing.get_origin(annotation)
    if origin is typing.Union or type(annotation).__name__ == "UnionType":
        return any(is_request_annotation(arg) for arg in typing.get_args(annotation) if arg is not type(None))
    return False


def _type_hints(fn: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=True)  # keep Annotated[int, Field(ge=0)]
    except Exception:
        # One unresolvable annotation makes get_type_hints give up; resolve parameter by parameter.
        return {}


def inspect_stage(cls: type, name: str, problems: list[str]) -> StageSpec | None:
    """Validate one of preprocess/predict/postprocess and describe how to call it."""
    fn = getattr(cls, name)
    raw = inspect.getattr_static(cls, name)
    drop_self = not isinstance(raw, (staticmethod, classmethod))
    shown = describe_callable(fn, f"{cls.__name__}.{name}")
    if not callable(fn):
        problems.append(f"{shown}: is not a method")
        return None
    params = _positional_params(fn, drop_self)
    hints = _type_hints(fn)
    is_request = [is_request_annotation(_resolve_annotation(fn, p, hints)) for p in params]
    for param, flag in zip(params, is_request, strict=True):
        annotation = param.annotation
        if not flag and isinstance(annotation, str) and annotation.rsplit(".", 1)[-1] == "Request":
            problems.append(
                f"{shown}: the annotation {annotation!r} of '{param.name}' could not be resolved; "
                "import Request (from starlette.requests or fastapi) in the module at top level"
            )
            return None

    if not params:
        problems.append(f"{shown}: takes no argument; {_ACCEPTED}")
        return None
    if len(params) > 2:
        problems.append(f"{shown}: takes {len(params)} arguments, at most 2; {_ACCEPTED}")
        return None
    if len(params) == 2:
        if is_request[0]:
            problems.append(f"{shown}: the request must come second; {_ACCEPTED}")
            return None
        if not is_request[1]:
            problems.append(
                f"{shown}: the second argument '{params[1].name}' must be annotated as a Request "
                f"(starlette.requests.Request or fastapi.Request); {_ACCEPTED}"
            )
            return None
    takes_request = is_request[-1]
    takes_inputs = not is_request[0]
    generator = "async" if inspect.isasyncgenfunction(fn) else "sync" if inspect.isgeneratorfunction(fn) else None
    returns = _resolve(fn, "return", inspect.signature(fn).return_annotation, hints)
    return StageSpec(
        name=name,
        takes_inputs=takes_inputs,
        takes_request=takes_request,
        is_async=inspect.iscoroutinefunction(fn),
        generator=generator,
        input_annotation=_resolve_annotation(fn, params[0], hints) if takes_inputs else inspect.Parameter.empty,
        return_annotation=returns,
    )


def _with_types(cls: type, stages: list[StageSpec], problems: list[str]) -> list[StageSpec]:
    """The stages with the types of the body (first stage taking the inputs) and of the answer (last stage)."""
    typed = list(stages)
    first = next((i for i, stage in enumerate(typed) if stage.takes_inputs), None)
    if first is not None:
        stage = typed[first]
        where = describe_callable(getattr(cls, stage.name), f"{cls.__name__}.{stage.name}")
        typed[first] = replace(stage, input_type=typed_value(stage.input_annotation, where, problems))
    if typed:
        stage = typed[-1]
        returns = stage.return_annotation
        if stage.generator is not None:
            returns = chunk_type(returns)
        if _is_response(returns):
            returns = Any  # a Starlette Response answers for itself
        where = describe_callable(getattr(cls, stage.name), f"{cls.__name__}.{stage.name}") + " (its result)"
        typed[-1] = replace(stage, output_type=typed_value(returns, where, problems))
    return typed


def _is_response(annotation: Any) -> bool:
    from starlette.responses import Response

    return isinstance(annotation, type) and issubclass(annotation, Response)


def inspect_model_class(cls: type, source: str = "") -> ModelSpec:
    """Validate a Truss-style Model class; raise one `LoadError` listing every problem."""
    where = f"{source}: " if source else ""
    if not isinstance(cls, type):
        raise LoadError(f"{where}{cls!r} is not a class")
    problems: list[str] = []
    if not callable(getattr(cls, "predict", None)):
        problems.append(f"{cls.__name__} has no predict method; define predict(self, inputs)")
    stages = []
    for name in STAGES:
        if callable(getattr(cls, name, None)):
            stage = inspect_stage(cls, name, problems)
            if stage is not None:
                stages.append(stage)

    by_name = {stage.name: stage for stage in stages}
    post = by_name.get("postprocess")
    if post is not None and not post.takes_inputs:
        problems.append(
            f"{describe_callable(vars_of(cls, 'postprocess'), cls.__name__ + '.postprocess')}: takes only the "
            "request, so predict's output would be lost; take (outputs) or (outputs, request)"
        )
    predict = by_name.get("predict")
    if predict is not None and not predict.takes_inputs and "preprocess" in by_name:
        problems.append(
            f"{describe_callable(vars_of(cls, 'predict'), cls.__name__ + '.predict')}: takes only the request "
            "while preprocess is defined, so preprocess's output would be lost; take (inputs) or (inputs, request)"
        )
    # A generator preprocess hands its generator to predict; a generator postprocess streams the answer
    # from predict's whole result (Truss allows both).
    if predict is not None and predict.generator is not None and post is not None:
        problems.append(
            f"{cls.__name__}.predict streams (it is a generator) and {cls.__name__}.postprocess would need its "
            "whole output; remove postprocess or make predict return a value"
        )

    load = getattr(cls, "load", None)
    if load is not None and not callable(load):
        problems.append(f"{cls.__name__}.load is not a method")
    if not problems:
        stages = _with_types(cls, stages, problems)
    if problems:
        listing = "\n  - ".join(problems)
        raise LoadError(f"{where}class {cls.__name__} cannot be served:\n  - {listing}")
    return ModelSpec(
        cls=cls,
        stages=tuple(stages),
        has_load=callable(load),
        load_is_async=inspect.iscoroutinefunction(load),
    )


def select_kwargs(fn: Callable[..., Any], available: dict[str, Any]) -> dict[str, Any]:
    """The subset of `available` that `fn` names (all of it when `fn` takes ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(available)
    return {name: value for name, value in available.items() if name in params}


def required_unknown_params(fn: Callable[..., Any], known: set[str]) -> list[str]:
    """Parameters without a default that we cannot supply (they would make the call fail)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in params.values()
        if p.name not in known
        and p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
