"""Typed inputs and outputs: a stage's annotations as pydantic validators and JSON Schemas.

A Model may annotate the inputs of its first stage that takes them (preprocess, or predict without one) with a
pydantic model, a dataclass, a ``TypedDict`` or any type pydantic's ``TypeAdapter`` accepts (``list[float]``,
``dict[str, int]``, ``Literal["a", "b"]``, ...). The decoded body is validated into that type before the stage
runs; a body that does not fit is a 400 whose ``error`` names each failing field and whose ``detail`` lists
them (``loc``, ``msg``, ``type``)::

    class IrisFeatures(pydantic.BaseModel):
        sepal_length: float
        ...

    class Model:
        def predict(self, features: IrisFeatures) -> IrisAnswer: ...

The return annotation of the last stage describes the answer in the OpenAPI document (a pydantic model result
is encoded with its own JSON by `modelserve.codecs`). Parameters annotated ``Any`` or ``object``, or not at
all, are not validated, and pydantic is imported only when some annotation needs it (``modelserve[schema]``).
"""

from __future__ import annotations

import collections.abc
import inspect
import sys
import typing
from typing import Any

from modelserve.errors import BadRequest, MissingExtraError

#: Annotations that say nothing about the value: the stage gets the decoded body as it is.
_UNTYPED: tuple[Any, ...] = (inspect.Parameter.empty, Any, object)
#: Return annotations of a generator function whose first argument is the type of each chunk.
_ITERATORS = (
    collections.abc.Iterator,
    collections.abc.Iterable,
    collections.abc.Generator,
    collections.abc.AsyncIterator,
    collections.abc.AsyncIterable,
    collections.abc.AsyncGenerator,
)


def is_typed(annotation: Any) -> bool:
    """Whether an annotation asks for validation (``Any``, ``object`` and no annotation do not)."""
    return not any(annotation is untyped for untyped in _UNTYPED)


def chunk_type(annotation: Any) -> Any:
    """The type of each chunk of a generator annotated ``Iterator[T]`` (or Generator, AsyncIterator, ...);
    ``Any`` for any other annotation (Truss models annotate generators loosely)."""
    origin = typing.get_origin(annotation)
    if origin in _ITERATORS:
        args = typing.get_args(annotation)
        return args[0] if args else Any
    return Any


def _pydantic() -> Any:
    try:
        import pydantic
    except ImportError:
        raise MissingExtraError("pydantic", "schema") from None
    return pydantic


def _name_of(annotation: Any) -> str:
    name = getattr(annotation, "__name__", None)
    if isinstance(annotation, type) and name:
        return str(name)
    return repr(annotation).replace("typing.", "")


class TypedValue:
    """One annotation, as pydantic validates and describes it. Raises `MissingExtraError` without pydantic and
    any exception of pydantic's for a type it cannot handle (the caller names the method)."""

    def __init__(self, annotation: Any) -> None:
        self.annotation = annotation
        self.name = _name_of(annotation)
        # A pydantic v1 model (pydantic.v1.BaseModel) validates itself; TypeAdapter refuses it.
        v1 = sys.modules.get("pydantic.v1")
        self._v1 = v1 is not None and isinstance(annotation, type) and issubclass(annotation, v1.BaseModel)
        if self._v1:
            self.adapter: Any = None
            self._errors: tuple[type[Exception], ...] = (v1.ValidationError,)  # type: ignore[union-attr]
            return
        pydantic = _pydantic()
        self.adapter = pydantic.TypeAdapter(annotation)
        self._errors = (pydantic.ValidationError,)
        # str and bytes bodies are parsed as JSON, unless the type is text (text/plain) or bytes itself.
        self._text = annotation in (str, bytes)

    def validate(self, value: Any) -> Any:
        """`value` (a decoded body) as the annotated type, or `BadRequest` naming every failing field."""
        try:
            if self._v1:
                model: Any = self.annotation
                return model.parse_raw(value) if isinstance(value, (str, bytes)) else model.parse_obj(value)
            if isinstance(value, (str, bytes)) and not self._text:
                return self.adapter.validate_json(value)
            return self.adapter.validate_python(value)
        except self._errors as exc:
            raise invalid_body(self.name, exc.errors()) from None  # type: ignore[attr-defined]

    def json_schema(self, mode: str = "validation", ref_template: str = "#/$defs/{model}") -> dict[str, Any]:
        """The JSON Schema (2020-12) of the type, nested models under ``$defs`` (``{}``: any JSON value).
        `mode` is "validation" for a body, "serialization" for an answer."""
        if self._v1:
            return {}
        schema: dict[str, Any] = self.adapter.json_schema(mode=mode, ref_template=ref_template)
        return schema


def invalid_body(name: str, errors: list[dict[str, Any]]) -> BadRequest:
    """The 400 of a body that does not fit its type: ``error`` names each field, ``detail`` lists them."""
    detail = [
        {"loc": [part if isinstance(part, int) else str(part) for part in error.get("loc", ())],
         "msg": str(error.get("msg", "")),
         "type": str(error.get("type", ""))}
        for error in errors
    ]  # fmt: skip
    listing = "; ".join(f"{'.'.join(str(part) for part in item['loc']) or 'body'}: {item['msg']}" for item in detail)
    error = BadRequest(f"the inputs do not match {name}: {listing}")
    error.extra = {"detail": detail}
    return error


def typed_value(annotation: Any, where: str, problems: list[str]) -> TypedValue | None:
    """The `TypedValue` of an annotation, None when it is untyped; a type pydantic cannot handle (or a string
    annotation that could not be resolved) is appended to `problems`, with `where` naming the method."""
    if not is_typed(annotation):
        return None
    if isinstance(annotation, (str, typing.ForwardRef)):
        text = annotation if isinstance(annotation, str) else annotation.__forward_arg__
        problems.append(f"{where}: the annotation {text!r} could not be resolved; import it in the module at top level")
        return None
    try:
        return TypedValue(annotation)
    except MissingExtraError:
        raise
    except Exception as exc:
        problems.append(
            f"{where}: pydantic cannot validate {_name_of(annotation)} ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); annotate with a pydantic model, a dataclass, a "
            "TypedDict or JSON types (list[float], dict[str, int]), or with Any to skip validation"
        )
        return None
