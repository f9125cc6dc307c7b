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

What is accepted matches the document: ``float`` and ``int`` (at any depth, but dict keys, which JSON writes
as strings) are validated strictly, so that ``true`` or ``"5.2"`` is not taken for a number the document
calls ``number``; ``Annotated[float, Strict(False)]`` asks for pydantic's lax conversion back.

Validation is bounded, whatever the body (measured in ``benchmarks/validation.py``):

* a 400 lists at most `MAX_ERRORS` fields and counts the rest (``error_count``): pydantic's ``errors()``
  builds one dict per failing field, 3.4 us each for a million of them, and the answer held them all;
* a large value (over `LARGE_ITEMS` items, counted through its lists and objects) is validated in a worker
  thread (`TypedValue.validate_async`), first by a twin of the validator that stops at the first error of
  each list and object (pydantic's ``fail_fast``): a valid value passes in that one call, an invalid one
  stops early. Only then are its errors counted (up to `COUNT_MAX`), by the strict validator over pieces of
  a top-level list of about a millisecond each, pausing between pieces so that the event loop takes the GIL
  (pydantic holds it for all of one call). A large value that is not a list is answered with the twin's
  errors, a lower bound of the count.

A pydantic model is the one exception to the rewriting: pydantic-core validates a model class with the
validator the class built for itself, its own config deciding. So the fields of a top-level model are
checked by the rewritten schema of its fields first, and the model is then built by its own validator; a
model nested in another type keeps its own config (``ConfigDict(strict=True)`` refuses ``true`` there).
"""

from __future__ import annotations

import asyncio
import collections.abc
import inspect
import logging
import sys
import time
import typing
from typing import Any

from modelserve import _threads
from modelserve.errors import BadRequest, MissingExtraError

logger = logging.getLogger(__name__)

#: A 400 lists this many failing fields at most; its ``error_count`` says how many there were.
MAX_ERRORS = 20
#: The most characters of a location's key or a message a 400 quotes: a key is the client's (a ``dict[str, int]``
#: body's), and so is a part of some messages (a discriminated union's tag); 20 keys of 400 KB answered 16 MB.
QUOTED_MAX = 256
#: A value with more items than this (its lists' and objects' lengths added up, a str or bytes body's length
#: over 8) is large: validated in a worker thread, by the fail-fast twin first. Under it, the ordinary
#: validator's errors() costs at most about a millisecond (about 1 us a field for a few thousand here).
LARGE_ITEMS = 1024
#: Items of the first piece of a large list whose errors are counted; the next pieces are sized to take about
#: `WORK` seconds each (pydantic holds the GIL for all of one call: 1024 invalid numbers are 0.3-3 ms here).
FIRST_PIECE = 4
#: A large list's errors are counted up to this many (about 2-5 ms of counting per thousand here); beyond,
#: the answer says "at least".
COUNT_MAX = 10_000
#: A large body's answer builds the details of this many errors at most (errors() makes a dict of each).
_PIECE_DETAIL_MAX = 256
#: Seconds of one piece of counting, and the pause after it (as in `modelserve._chunked_json`): time.sleep
#: releases the GIL long enough for the event loop's thread, waiting for it, to take it.
WORK = 0.001
PAUSE = 0.0001

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
        self._checks: Checks | None = None
        try:
            self._checks = _checks(self.adapter.core_schema)
        except Exception as exc:  # a schema pydantic-core does not take back: pydantic's own validator alone
            logger.warning("%s: validated without strict numbers (%s: %s)", self.name, type(exc).__name__, exc)

    def validate(self, value: Any) -> Any:
        """`value` (a decoded body) as the annotated type, or `BadRequest` naming the first failing fields
        (`MAX_ERRORS`) and counting them all."""
        if self._v1:
            model: Any = self.annotation
            try:
                return model.parse_raw(value) if isinstance(value, (str, bytes)) else model.parse_obj(value)
            except self._errors as exc:
                errors = exc.errors()  # type: ignore[attr-defined]
                raise invalid_body(self.name, _format(errors[:MAX_ERRORS]), len(errors)) from None
        json = isinstance(value, (str, bytes)) and not self._text
        checks = self._checks
        large = is_large(value)
        if checks is None:
            return self._build(value, json, large)
        try:
            checked = _run(checks.fast if large else checks.strict, value, json)
        except self._errors as exc:
            raise self._refusal(exc, value, large) from None
        return checked if checks.builds else self._build(value, json, large)

    async def validate_async(self, value: Any) -> Any:
        """`validate`, in a worker thread when `value` is large (for a stage that runs on the event loop)."""
        if self._v1 or not is_large(value):
            return self.validate(value)
        return await _threads.run_sync(self.validate, value)

    def _build(self, value: Any, json: bool, large: bool) -> Any:
        """The value, by the type's own validator (a pydantic model's, with its own config)."""
        try:
            return _run(self.adapter.validator, value, json)
        except self._errors as exc:
            raise self._refusal(exc, value, large) from None

    def _refusal(self, exc: Any, value: Any, large: bool) -> BadRequest:
        count: int = exc.error_count()
        if not large:  # a few thousand errors at most: errors() builds them in a millisecond or so
            return invalid_body(self.name, _details(exc)[:MAX_ERRORS], count)
        checks = self._checks
        if checks is not None and checks.pieces and type(value) is list:
            details, counted, complete = self._count(checks, value)
            return invalid_body(self.name, details, counted, complete)
        if count > _PIECE_DETAIL_MAX:  # a class's own validator does not stop early: too many to build
            return invalid_body(self.name, [], count)
        return invalid_body(self.name, _details(exc)[:MAX_ERRORS], count, complete=checks is None)

    def _count(self, checks: Checks, items: list[Any]) -> tuple[list[dict[str, Any]], int, bool]:
        """The first errors of a large invalid list, their count (up to `COUNT_MAX`) and whether that count
        is complete: the strict check over pieces of the list, each sized to take about `WORK` seconds (its
        items may be lists themselves), pausing between pieces."""
        details: list[dict[str, Any]] = []
        count = 0
        pause = not _on_event_loop()
        start, size = 0, FIRST_PIECE
        while start < len(items):
            if count >= COUNT_MAX:
                return details, count, False
            piece = items[start : start + size]
            began = time.perf_counter()
            try:
                checks.strict.validate_python(piece)
            except self._errors as exc:
                count += exc.error_count()  # type: ignore[attr-defined]
                if len(details) < MAX_ERRORS:
                    details += _offset(self._first_errors(checks, piece, MAX_ERRORS - len(details)), start)
            took = time.perf_counter() - began
            start += len(piece)
            size = max(1, min(4 * size, int(size * WORK / took) if took > 0 else 4 * size))
            if pause:
                time.sleep(PAUSE)
        return details, count, True

    def _first_errors(self, checks: Checks, piece: list[Any], wanted: int) -> list[dict[str, Any]]:
        """The first `wanted` errors of an invalid piece: the strict check's of the `wanted` items from the first
        that fails (found by the fail-fast check) when they hold a few, else the fail-fast check's."""
        try:
            checks.fast.validate_python(piece)
        except self._errors as exc:
            first = _details(exc)
        else:
            return []
        loc = first[0]["loc"] if first else []
        at = loc[0] if loc and isinstance(loc[0], int) else 0
        try:
            checks.strict.validate_python(piece[at : at + wanted])
        except self._errors as exc:
            if exc.error_count() <= _PIECE_DETAIL_MAX:  # type: ignore[attr-defined]
                return _offset(_details(exc)[:wanted], at)
        return first[:wanted]

    def json_schema(self, mode: str = "validation", ref_template: str = "#/$defs/{model}") -> dict[str, Any]:
        """The JSON Schema (2020-12) of the type, nested models under ``$defs`` (``{}``: any JSON value).
        `mode` is "validation" for a body, "serialization" for an answer."""
        if self._v1:
            return {}
        schema: dict[str, Any] = self.adapter.json_schema(mode=mode, ref_template=ref_template)
        return schema


def _run(validator: Any, value: Any, json: bool) -> Any:
    return validator.validate_json(value) if json else validator.validate_python(value)


def _offset(details: list[dict[str, Any]], start: int) -> list[dict[str, Any]]:
    """Errors of a piece of a list, located in the whole list."""
    for detail in details:
        loc = detail["loc"]
        if loc and isinstance(loc[0], int):
            loc[0] += start
    return details


def _details(exc: Any) -> list[dict[str, Any]]:
    """Every error of a pydantic `ValidationError`, without the inputs (a million of them were 182 MiB)."""
    return _format(exc.errors(include_url=False, include_input=False, include_context=False))


def _format(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"loc": [part if isinstance(part, int) else _quoted(str(part)) for part in error.get("loc", ())],
         "msg": _quoted(str(error.get("msg", ""))),
         "type": str(error.get("type", ""))}
        for error in errors
    ]  # fmt: skip


def _quoted(text: str) -> str:
    return text if len(text) <= QUOTED_MAX else text[: QUOTED_MAX - 3] + "..."


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def is_large(value: Any, limit: int = LARGE_ITEMS) -> bool:
    """Whether `value` holds more than `limit` items (lists' and objects' lengths added up, breadth first; a
    str or bytes counts its length over 8). Looks at no more than `limit` containers."""
    if isinstance(value, (str, bytes, bytearray)):
        return len(value) > 8 * limit
    pending = [value]
    total = 0
    while pending:
        container = pending.pop()
        if isinstance(container, dict):
            children: Any = container.values()
        elif isinstance(container, (list, tuple)):
            children = container
        else:
            continue
        total += len(container)
        if total > limit:
            return True
        pending.extend(child for child in children if isinstance(child, (list, tuple, dict)))
        if len(pending) > limit:
            return True
    return False


#: The core schemas of containers that can stop at their first error (pydantic's ``fail_fast``).
_FAIL_FAST = frozenset({"list", "tuple", "set", "frozenset", "dict", "deque"})
#: The core schemas of JSON numbers: validated strictly unless the annotation says ``strict`` itself.
_NUMBERS = frozenset({"float", "int"})
#: An int or a whole float, as an int: neither a bool nor a string (a strict int, or a strict float made an int).
_WHOLE_NUMBER: dict[str, Any] = {
    "type": "union",
    "choices": [
        {"type": "int", "strict": True},
        {"type": "chain", "steps": [{"type": "float", "strict": True}, {"type": "int"}]},
    ],
    "custom_error_type": "int_type",
}
#: Keys of a core schema that hold values, not schemas.
_DATA_KEYS = frozenset({"default", "metadata", "config", "expected", "serialization", "cls", "ref"})


class Checks(typing.NamedTuple):
    """A type's schema rewritten: numbers strict (`strict`), and a twin that stops at the first error of each
    list and object (`fast`)."""

    strict: Any
    fast: Any
    #: Whether the checks' value is the type's value; else they only check it (a model's own validator,
    #: which pydantic-core uses for a model wherever it meets one, builds it).
    builds: bool
    #: Whether a large value's errors can be counted over pieces of it (a top-level list without bounds).
    pieces: bool


def _checks(schema: dict[str, Any]) -> Checks:
    """The `Checks` of a core schema. A model's fields are checked by its fields' schema, with its config (a
    model class met anywhere else is validated by its own validator, which pydantic-core prebuilds)."""
    from pydantic_core import SchemaValidator

    root, config, builds = schema, None, True
    inner = schema.get("schema")
    plain = schema.get("type") == "model" and not schema.get("custom_init") and not schema.get("root_model")
    if plain and isinstance(inner, dict) and inner.get("type") == "model-fields":
        root, config, builds = inner, schema.get("config"), False
    pieces = root.get("type") == "list" and "min_length" not in root and "max_length" not in root
    strict = SchemaValidator(_rewrite(root, fail_fast=False), config)
    fast = SchemaValidator(_rewrite(root, fail_fast=True), config)
    return Checks(strict, fast, builds, pieces)


def _rewrite(node: Any, fail_fast: bool, numbers: bool = True) -> Any:
    """A copy of a core schema: numbers strict (not in dict keys, which are strings in JSON), containers
    stopping at their first error when `fail_fast`."""
    if isinstance(node, list):
        return [_rewrite(item, fail_fast, numbers) for item in node]
    if not isinstance(node, dict):
        return node
    copy = {
        key: value if key in _DATA_KEYS else _rewrite(value, fail_fast, numbers and key != "keys_schema")
        for key, value in node.items()
    }
    kind = node.get("type")
    if numbers and kind in _NUMBERS and "strict" not in node:
        copy["strict"] = True
        if kind == "int":  # JSON Schema's integer is also 1.0: a whole float is taken, as pydantic's lax int does
            return {"type": "chain", "steps": [_WHOLE_NUMBER, copy]}
    if fail_fast and kind in _FAIL_FAST:
        copy["fail_fast"] = True
    return copy


def invalid_body(name: str, detail: list[dict[str, Any]], count: int, complete: bool = True) -> BadRequest:
    """The 400 of a body that does not fit its type: ``error`` names the first fields, ``detail`` lists them
    (``loc``, ``msg``, ``type``), ``error_count`` counts them all (a lower bound when not `complete`)."""
    listing = "; ".join(f"{'.'.join(str(part) for part in item['loc']) or 'body'}: {item['msg']}" for item in detail)
    if not detail:  # a large value a class's own validator refused in too many places to build them (`_refusal`)
        listing = f"{'' if complete else 'at least '}{count:,} fields fail, too many in this large body to list them"
    elif not complete:
        listing += f" (at least {count:,} fields fail; the count stopped there, in this large body)"
    elif count > len(detail):
        listing += f" (and {count - len(detail):,} more: {count:,} fields fail)"
    error = BadRequest(f"the inputs do not match {name}: {listing}")
    error.extra = {"detail": detail, "error_count": count}
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
