"""The OpenAPI 3.1 document of a server, derived from its route table and what each backend knows.

Every route of the table is described by the handler that answers it (`DESCRIBERS`, keyed by the endpoint's
method), so the document cannot list a path or a method the server does not answer; a path that is an alias
of another (``/`` for a lone API) is listed once. What each API's body and answer look like comes from its
backend (`BODIES`):

* a Model class: the body from the inputs' annotation (`modelserve.schema`; any JSON value, text or bytes
  when unannotated), the answer from the last stage's return annotation; a streaming API answers NDJSON,
  server-sent events, chunked text or bytes, or one collected JSON value (``Accept: application/json``);
* an ONNX file or a SavedModel without hooks: an object keyed by the model's input names, each a nested
  array of its dtype with the fixed dimensions as ``minItems``/``maxItems`` (a model with one input also
  takes the bare array); the answer keyed by output names. With hooks: the first parameter of
  ``pre_inference`` and the return annotation of ``post_inference`` when the hook file annotates them, else
  any JSON value;
* async APIs: the submit, poll and cancel routes and the job document;
* Cortex handlers: any JSON value.

Each operation lists the statuses its route can answer with the one error body (``Error``); the V2 routes
are left to the Open Inference Protocol's own specification. HEAD, which the server answers wherever it
answers GET, is left out, as FastAPI leaves it (Swagger UI would list every GET twice). Usage::

    document = openapi.document(server, table.routes)             # the whole server
    document = openapi.document(server, table.routes, api="iris")  # one API
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from modelserve.schema import MAX_ERRORS, TypedValue

if TYPE_CHECKING:
    from modelserve.api import Api
    from modelserve.http.routing import Route
    from modelserve.server import ModelServer

OPENAPI_VERSION = "3.1.0"
_REFS = "#/components/schemas/{model}"
_ERROR_REF = {"$ref": "#/components/schemas/Error"}

#: The schemas every document holds: the error body (with the fields of a 400 from a schema) and the job.
BASE_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "description": "Every error answer: what went wrong and the request id (also in X-Request-ID).",
        "properties": {
            "error": {"type": "string"},
            "request_id": {"type": "string"},
            "detail": {
                "type": "array",
                "items": {"$ref": "#/components/schemas/ValidationIssue"},
                "maxItems": MAX_ERRORS,
                "description": f"The first fields (at most {MAX_ERRORS}) of a body that does not fit the input type.",
            },
            "error_count": {
                "type": "integer",
                "minimum": 0,
                "description": "How many fields do not fit (a lower bound for a large body, as its error says).",
            },
        },
        "required": ["error", "request_id"],
    },
    "ValidationIssue": {
        "type": "object",
        "description": "One field of a body that does not fit the API's input type.",
        "properties": {
            "loc": {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "integer"}]}},
            "msg": {"type": "string"},
            "type": {"type": "string"},
        },
        "required": ["loc", "msg", "type"],
    },
    "Job": {
        "type": "object",
        "description": "An async job: its status, then its result or its error once it has ended.",
        "properties": {
            "id": {"type": "string"},
            "status": {"type": "string", "enum": ["in_queue", "in_progress", "completed", "failed", "cancelled"]},
            "result": {"description": "The handler's result (completed jobs)."},
            "error": {"type": "string"},
            "timestamp": {"type": ["string", "null"], "description": "When the job ended (ISO 8601, UTC)."},
        },
        "required": ["id", "status"],
    },
    "OpenAIError": {
        "type": "object",
        "description": "An error answer of OpenAI's paths, in OpenAI's form, with the request id.",
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                },
                "required": ["message", "type", "param", "code"],
            },
            "request_id": {"type": "string"},
        },
        "required": ["error", "request_id"],
    },
    "JobSubmitted": {
        "type": "object",
        "properties": {"id": {"type": "string", "description": "Poll GET /<api>/<id> with it."}},
        "required": ["id"],
    },
}

_STATUS_TEXT = {
    400: "The body cannot be decoded, or does not fit the API's input type (`detail` lists the fields).",
    401: "The route needs an API key (Authorization: Bearer <key> or X-API-Key).",
    404: "Not found.",
    409: "A job with this id exists, or the job has already ended.",
    413: "The body is larger than the API's max_body_size.",
    500: "User code failed; the server log has the traceback for this request id.",
    503: "The API is loading, failed to load, is shutting down, or its queue is full: retry after Retry-After.",
    504: "The call took longer than the API's timeout.",
}
_REQUEST_ID = {"description": "The request id (the client's X-Request-ID, or a new one).", "schema": {"type": "string"}}


def _error(status: int) -> dict[str, Any]:
    headers: dict[str, Any] = {"X-Request-ID": _REQUEST_ID}
    if status == 503:
        headers["Retry-After"] = {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}
    if status == 401:
        headers["WWW-Authenticate"] = {"schema": {"type": "string"}}
    return {"description": _STATUS_TEXT[status], "headers": headers, "content": _json(_ERROR_REF)}


def _ok(content: dict[str, Any], description: str = "Success.") -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description, "headers": {"X-Request-ID": _REQUEST_ID}}
    if content:
        answer["content"] = content
    return answer


def _json(schema: Any) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


class _Builder:
    """One document being built: its schemas (the typed values' models hoisted into components)."""

    def __init__(self, server: ModelServer) -> None:
        self.server = server
        self.schemas: dict[str, Any] = dict(BASE_SCHEMAS)

    def schema_of(self, typed: TypedValue | None, mode: str = "validation") -> Any:
        """The schema of a typed value, its models in components (``{}``: any JSON value)."""
        if typed is None:
            return {}
        try:
            schema = dict(typed.json_schema(mode, _REFS))
        except Exception:  # pydantic can validate a few types it cannot describe
            return {}
        for name, definition in schema.pop("$defs", {}).items():
            self.schemas.setdefault(name, definition)
        title = schema.get("title")
        if schema.get("type") == "object" and isinstance(title, str) and re.fullmatch(r"[A-Za-z0-9_.-]+", title):
            if self.schemas.setdefault(title, schema) == schema:
                return {"$ref": _REFS.format(model=title)}
        return schema

    def security(self, api: str | None) -> bool:
        """Whether the routes of `api` (None: the server's own, but the probes) need an API key."""
        auth = self.server.project.auth
        if auth is None or (auth.api_keys_env is None and auth.api_keys_file is None):
            return False
        return api is None or auth.apis is None or api in auth.apis


# ------------------------------------------------------------------------------------------------------------
# The bodies and answers of each kind of backend: (request body or None, 200 content).

Body = tuple[dict[str, Any] | None, dict[str, Any]]


def _any_body() -> dict[str, Any]:
    # Not required: an empty body is the value b"" (or "" as text), which an untyped stage receives.
    return {
        "required": False,
        "content": {
            "application/json": {"schema": {}},
            "text/plain": {"schema": {"type": "string"}},
            "application/octet-stream": {},
        },
    }


def _any_answer() -> dict[str, Any]:
    return {"application/json": {"schema": {}}, "application/octet-stream": {}}


def _events(data: str) -> dict[str, Any]:
    """A text/event-stream answer: its schema describes each event (its fields as an object, as OpenAPI 3.2's
    itemSchema does and as tools read a 3.1 document's schema of an event stream), not the text of the stream."""
    event = {
        "type": "object",
        "properties": {"data": {"type": "string", "description": data}, "event": {"type": "string"}},
        "required": ["data"],
    }
    return {"text/event-stream": {"schema": event}}


def _stream_answer(item: Any, item_type: Any) -> dict[str, Any]:
    """A stream's answer: framed by the type of its chunks, SSE on request, or collected into one JSON value."""
    content: dict[str, Any] = {}
    if item_type is str or item_type is Any:
        content["text/plain"] = {"schema": {"type": "string"}}
    if item_type is bytes or item_type is Any:
        content["application/octet-stream"] = {}
    if item_type not in (str, bytes):
        content["application/x-ndjson"] = {"schema": {"type": "string", "description": "One JSON value per line."}}
    content.update(_events("One chunk."))
    collected = {"type": "string"} if item_type in (str, bytes) else {"type": "array", "items": item}
    if item_type is Any:
        collected = {"anyOf": [{"type": "string"}, {"type": "array", "items": item}]}
    content["application/json"] = {"schema": collected}
    return content


def _model_class_body(builder: _Builder, api: Api) -> Body:
    spec = api.backend.spec  # type: ignore[attr-defined]
    # A batched predict is annotated with the batch (list[X]), not with one request's body or answer.
    batched = api.config.batching is not None
    body: dict[str, Any] | None = None
    if spec.needs_inputs:
        typed = None if batched and spec.stages[0].name == "predict" else spec.input_type
        if typed is None:
            body = _any_body()
        elif typed.annotation is str:
            text = {"schema": {"type": "string"}}
            body = {"required": False, "content": {"text/plain": text, "application/json": text}}
        elif typed.annotation is bytes:
            body = {"required": False, "content": {"application/octet-stream": {}}}
        else:
            body = {"required": True, "content": _json(builder.schema_of(typed))}
    elif spec.needs_request:
        body = {"required": False, "content": {"*/*": {}}}
    out = None if batched and spec.stages[-1].name == "predict" else spec.output_type
    if api.backend.streams:
        item = builder.schema_of(out, "serialization")
        return body, _stream_answer(item, out.annotation if out is not None else Any)
    if out is None:
        return body, _any_answer()
    if out.annotation is bytes:
        return body, {"application/octet-stream": {}}
    return body, _json(builder.schema_of(out, "serialization"))


_INT_RANGES = {name: np.iinfo(name) for name in ("int8", "int16", "int32", "int64")} | {
    name: np.iinfo(name) for name in ("uint8", "uint16", "uint32", "uint64")
}


#: The largest finite value of each float dtype: a larger number is out of its range (a 400).
_FLOAT_MAX = {name: float(np.finfo(name).max) for name in ("float16", "float32", "float64")} | {"bfloat16": 3.3895e38}

#: The smallest magnitude a float64 rounds to infinity in float16 and float32 (the largest finite value plus half
#: its ulp, exactly a float64): a number between the largest finite value and this one rounds to that value and
#: is served, as IEEE rounding makes every number between two floats the nearest of them.
_FLOAT_OVERFLOW = {"float16": 65520.0, "float32": 2.0**128 - 2.0**103}


def _leaf(dtype_name: str, output: bool) -> dict[str, Any]:
    if dtype_name in _INT_RANGES:
        info = _INT_RANGES[dtype_name]
        return {"type": "integer", "minimum": int(info.min), "maximum": int(info.max)}
    if dtype_name in _FLOAT_MAX:
        if output:  # JSON has no NaN nor infinity: an answer's are encoded as null
            return {"type": ["number", "null"]}
        if dtype_name in _FLOAT_OVERFLOW:
            bound = _FLOAT_OVERFLOW[dtype_name]
            return {"type": "number", "format": dtype_name, "exclusiveMinimum": -bound, "exclusiveMaximum": bound}
        largest = _FLOAT_MAX[dtype_name]
        return {"type": "number", "format": dtype_name, "minimum": -largest, "maximum": largest}
    if dtype_name == "bool":
        return {"type": "boolean"}
    if dtype_name == "string":
        return {"type": "string"}
    return {}


#: The most lower-rank forms of an input listed (`_lower_ranks`); past it, only the flat one and the scalar.
_MOST_FORMS = 16


def _divisors(total: int) -> list[int]:
    small = [n for n in range(1, math.isqrt(total) + 1) if total % n == 0]
    return sorted({*small, *(total // n for n in small)})


def _sizes(total: int, rank: int) -> Iterator[tuple[int, ...]]:
    """Each tuple of `rank` sizes (each at least 1) whose product is `total`."""
    if rank == 1:
        yield (total,)
        return
    for first in _divisors(total):
        for rest in _sizes(total // first, rank - 1):
            yield (first, *rest)


def _nested(leaf: dict[str, Any], sizes: Iterable[int]) -> dict[str, Any]:
    schema = leaf
    for size in reversed(tuple(sizes)):
        schema = {"type": "array", "items": schema, "minItems": size, "maxItems": size}
    return schema


def _lower_ranks(spec: Any, leaf: dict[str, Any]) -> list[dict[str, Any]]:
    """The values of a lower rank than the input's that the server reshapes to its shape, unknown dimensions as 1
    (modelserve.runtimes._tensors, Cortex's rule): those whose element count fills that shape. Four numbers fit
    ``[batch, 4]``, a scalar fits ``[batch]``."""
    total = math.prod(dim if isinstance(dim, int) and dim >= 0 else 1 for dim in spec.shape)
    if total < 1:
        return []
    forms = [leaf] if total == 1 else []
    for rank in range(1, len(spec.shape)):
        for sizes in _sizes(total, rank):
            forms.append(_nested(leaf, sizes))
            if len(forms) > _MOST_FORMS:
                return ([leaf] if total == 1 else []) + [_nested(leaf, (total,))]
    return forms


def _tensor(spec: Any, output: bool = False) -> dict[str, Any]:
    """A tensor as nested arrays: one level per dimension, fixed sizes as minItems/maxItems. An input also as
    the lower-rank values that fill its shape (`_lower_ranks`); its innermost unknown dimension may be empty (a
    value of the input's rank still: ``[[]]`` for ``[batch, n]``, ``[]`` for ``[batch]``), an outer one not."""
    leaf: dict[str, Any] = _leaf(spec.dtype_name, output)
    schema = leaf
    if spec.shape is None:
        return {} if output else {"description": f"{spec.dtype_name}, any shape"}
    for axis, dim in reversed(list(enumerate(spec.shape))):
        level: dict[str, Any] = {"type": "array", "items": schema}
        if isinstance(dim, int) and dim >= 0:
            level["minItems"] = level["maxItems"] = dim
        elif not output and axis < len(spec.shape) - 1:
            level["minItems"] = 1
        schema = level
    description = f"{spec.dtype_name} {list(spec.shape)}"
    lower = [] if output else _lower_ranks(spec, leaf)
    if lower:
        return {"anyOf": [schema, *lower], "description": f"{description}, or fewer dimensions that fill it"}
    schema["description"] = description
    return schema


def _model_file_body(builder: _Builder, api: Api) -> Body:
    backend: Any = api.backend
    model = backend.model
    pre, post = backend.hooks.get("pre_inference"), backend.hooks.get("post_inference")
    if pre is not None or model is None:
        typed = backend.input_type
        body = {"required": typed is not None, "content": _json(builder.schema_of(typed))}
    else:
        names = [spec.name for spec in model.inputs]
        keyed = {
            "type": "object",
            "properties": {spec.name: _tensor(spec) for spec in model.inputs},
            "required": names,
            "additionalProperties": False,
        }
        schema = {"anyOf": [keyed, _tensor(model.inputs[0])]} if len(names) == 1 else keyed
        body = {"required": True, "content": _json(schema)}
    if post is not None or model is None:
        return body, _json(builder.schema_of(backend.output_type, "serialization"))
    answer = {
        "type": "object",
        "properties": {spec.name: _tensor(spec, output=True) for spec in model.outputs},
        "required": [spec.name for spec in model.outputs],
    }
    return body, _json(answer)


def _any_json_body(builder: _Builder, api: Api) -> Body:
    return {"required": False, "content": {"application/json": {"schema": {}}}}, _any_answer()


#: What each kind of backend (`Backend.kind`) takes and answers.
BODIES: dict[str, Callable[[_Builder, Api], Body]] = {
    "model_class": _model_class_body,
    "model_file": _model_file_body,
    "handler_class": _any_json_body,
    "cortex_handler": _any_json_body,
}


# ------------------------------------------------------------------------------------------------------------
# The routes, described by the endpoint method that answers them.

Operation = dict[str, Any]
Describer = Callable[[_Builder, Any], dict[str, Operation]]


def _op_id(verb: str, name: str) -> str:
    return f"{verb}_{re.sub(r'[^A-Za-z0-9]+', '_', name)}"


def _statuses(builder: _Builder, api: Api, *codes: int) -> dict[str, Any]:
    codes_set = set(codes)
    if builder.security(api.name):
        codes_set.add(401)
    if 504 in codes_set and api.config.timeout is None:
        codes_set.discard(504)
    return {str(code): _error(code) for code in sorted(codes_set)}


def _describe_get(builder: _Builder, api: Api, verb: str) -> dict[str, Operation]:
    answer = _ok(_json({"type": "object", "description": "The API's configuration, state and backend."}))
    get = {
        "operationId": _op_id(verb, api.name),
        "summary": f"Describe the API {api.name}",
        "tags": [api.name],
        "responses": {"200": answer, **_statuses(builder, api)},
    }
    return {"get": get}


def _realtime(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    api: Api = endpoint.api
    body, answer = BODIES.get(api.backend.kind, _any_json_body)(builder, api)
    post: Operation = {
        "operationId": _op_id("call", api.name),
        "summary": f"Call the API {api.name}",
        "tags": [api.name],
        "responses": {"200": _ok(answer, "The answer."), **_statuses(builder, api, 400, 413, 500, 503, 504)},
    }
    description = _description(api)
    if description:
        post["description"] = description
    if body is not None:
        post["requestBody"] = body
    return {"post": post, **_describe_get(builder, api, "describe")}


def _versioned(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    """``/<api>/versions/{version}`` of an API with numbered versions (`modelserve.http.versions`): the API's
    operations on one version, described by the highest ready one, with the version as a path parameter."""
    numbers = [str(number) for number in sorted(endpoint.versions.apis)]
    parameter = {
        "name": "version",
        "in": "path",
        "required": True,
        "description": f"A version the API serves ({', '.join(numbers)} when this document was made).",
        "schema": {"type": "string", "pattern": "^[0-9]+$", "examples": numbers},
    }
    operations = _realtime(builder, endpoint)
    for verb, operation in operations.items():
        name = endpoint.name
        operation["operationId"] = _op_id(f"{'call' if verb == 'post' else 'describe'}_version", name)
        operation["summary"] = f"{operation['summary']}, in one of its versions"
        operation["parameters"] = [parameter]
        operation["responses"] = {**operation["responses"], "404": _error(404)}
        operation["responses"] = dict(sorted(operation["responses"].items()))
    return operations


def _jobs(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    api: Api = endpoint.api
    body, _ = BODIES.get(api.backend.kind, _any_json_body)(builder, api)
    post: Operation = {
        "operationId": _op_id("submit", api.name),
        "summary": f"Submit a job to the async API {api.name}",
        "description": (_description(api) + "\n\n" if _description(api) else "")
        + "Answers once the job is stored; poll GET /{api}/{id} for its result. The job id is the request's "
        "X-Request-ID when it sends one.",
        "tags": [api.name],
        "responses": {
            "200": _ok(_json({"$ref": _REFS.format(model="JobSubmitted")}), "The job is queued."),
            **_statuses(builder, api, 400, 409, 413, 500, 503),
        },
    }
    if body is not None:
        post["requestBody"] = body
    return {"post": post, **_describe_get(builder, api, "describe")}


def _job(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    api: Api = endpoint.api
    parameter = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
    job = _ok(_json({"$ref": _REFS.format(model="Job")}), "The job.")
    get: Operation = {
        "operationId": _op_id("get_job", api.name),
        "summary": f"Poll a job of {api.name}",
        "tags": [api.name],
        "parameters": [parameter],
        "responses": {"200": job, **_statuses(builder, api, 404, 500, 503)},
    }
    delete: Operation = {
        "operationId": _op_id("cancel_job", api.name),
        "summary": f"Cancel a job of {api.name}",
        "tags": [api.name],
        "parameters": [parameter],
        "responses": {"200": job, **_statuses(builder, api, 404, 409, 500, 503)},
    }
    return {"get": get, "delete": delete}


def _server(
    builder: _Builder, path: str, operation_id: str, summary: str, content: dict[str, Any], *codes: int
) -> dict[str, Operation]:
    statuses = set(codes)
    if path != "/healthz" and path != "/readyz" and builder.security(None):
        statuses.add(401)
    get: Operation = {
        "operationId": operation_id,
        "summary": summary,
        "tags": ["server"],
        "responses": {"200": _ok(content), **{str(code): _error(code) for code in sorted(statuses)}},
    }
    return {"get": get}


def _healthz(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    alive = {"type": "object", "properties": {"status": {"const": "ok"}}, "required": ["status"]}
    return _server(builder, "/healthz", "healthz", "Liveness: the process answers", _json(alive))


def _readyz(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    ready = {
        "type": "object",
        "properties": {
            "status": {"const": "ready"},
            "apis": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["status", "apis"],
    }
    return _server(builder, "/readyz", "readyz", "Readiness: every API has loaded", _json(ready), 503)


def _metrics(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    text = {"text/plain; version=0.0.4; charset=utf-8": {"schema": {"type": "string"}}}
    return _server(builder, "/metrics", "metrics", "Prometheus metrics", text)


def _openapi(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    return _server(builder, "/openapi.json", "openapi", "This document", _json({"type": "object"}))


def _openapi_of_api(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    summary = "The document of one API"
    operations = _server(builder, "/openapi/{api}.json", "openapi_of_api", summary, _json({"type": "object"}), 404)
    names = {"type": "string", "enum": sorted(builder.server.apis)}
    parameter = {"name": "api", "in": "path", "required": True, "schema": names}
    for operation in operations.values():
        operation["parameters"] = [parameter]
    return operations


def _docs(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    page = {"text/html": {"schema": {"type": "string"}}}
    return _server(builder, "/docs", "docs", "This document in Swagger UI", page, 404)


# OpenAI's paths and Truss's routes (modelserve.http.openai, modelserve.http.truss)

_OPENAI_STATUSES = (400, 404, 413, 500, 503, 504)


_OPENAI_ERROR_REF = {"$ref": "#/components/schemas/OpenAIError"}


def _openai_errors(responses: dict[str, Any]) -> dict[str, Any]:
    """`responses` with OpenAI's error body for every error but the 401, which the guard answers before the route
    (modelserve.http.openai.openai_body rewrites the route's own errors)."""
    for status, response in responses.items():
        if status not in ("200", "401"):
            response["content"] = _json(_OPENAI_ERROR_REF)
    return responses


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _texts(most: int | None = None, shortest: int = 0) -> dict[str, Any]:
    """A string, or a non-empty list of strings (at most `most`), as modelserve.http.openai checks them."""
    text = {"type": "string", "minLength": shortest}
    listed: dict[str, Any] = {"type": "array", "items": text, "minItems": 1}
    if most is not None:
        listed["maxItems"] = most
    return {"anyOf": [text, listed]}


def _openai_fields(kind: str) -> dict[str, Any]:
    """The fields modelserve.http.openai.check_request reads, with the types and ranges it accepts (each may be
    null or absent but the required ones)."""
    from modelserve.http.openai import MAX_EMBEDDING_INPUTS, ROLES

    if kind == "embeddings":
        return {
            "input": _texts(MAX_EMBEDDING_INPUTS, shortest=1),
            "encoding_format": _nullable({"enum": ["float", "base64"]}),
            "dimensions": _nullable({"type": "integer", "minimum": 1}),
        }
    fields: dict[str, Any] = {
        "stream": _nullable({"type": "boolean"}),
        "stream_options": _nullable(
            {"type": "object", "properties": {"include_usage": _nullable({"type": "boolean"})}}
        ),
        "n": _nullable({"const": 1}),
        "max_tokens": _nullable({"type": "integer", "minimum": 1}),
        "max_completion_tokens": _nullable({"type": "integer", "minimum": 1}),
        "temperature": _nullable({"type": "number", "minimum": 0, "maximum": 2}),
        "top_p": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
        "presence_penalty": _nullable({"type": "number", "minimum": -2, "maximum": 2}),
        "frequency_penalty": _nullable({"type": "number", "minimum": -2, "maximum": 2}),
    }
    if kind == "completions":
        return {
            "prompt": {
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
                ]
            },
            **fields,
        }
    part = {
        "type": "object",
        "properties": {"type": {"type": "string"}},
        "required": ["type"],
        "if": {"properties": {"type": {"const": "text"}}},
        "then": {"properties": {"text": {"type": "string"}}, "required": ["text"]},
    }
    content = {"anyOf": [{"type": "string"}, {"type": "array", "items": part, "minItems": 1}, {"type": "null"}]}
    message = {
        "type": "object",
        "properties": {"role": {"enum": sorted(ROLES)}, "content": content},
        "required": ["role"],
        # Only an assistant's (or a function's) message may leave its content out.
        "anyOf": [
            {"properties": {"content": {"not": {"type": "null"}}}, "required": ["content"]},
            {"properties": {"role": {"enum": ["assistant", "function"]}}},
        ],
    }
    return {"messages": {"type": "array", "items": message, "minItems": 1}, **fields}


def _openai_body(kind: str | None, names: list[str]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "additionalProperties": True}
    # Another name is a 404 (model_not_found): the path serves these APIs only.
    schema["properties"] = {"model": {"type": "string", "enum": names}}
    schema["required"] = ["model"]
    if kind is not None:
        fields = _openai_fields(kind)
        schema["properties"].update(fields)
        schema["required"] += [next(iter(fields))]
        schema["description"] = "OpenAI's request body; fields modelserve does not read are passed to the model."
    return {"required": True, "content": _json(schema)}


def _openai_answer(kind: str | None) -> dict[str, Any]:
    events = _events("One of OpenAI's chunks (a JSON object), then [DONE].")
    if kind == "embeddings":
        return _json({"type": "object", "description": "OpenAI's embeddings list."})
    return {**_json({"type": "object", "description": "OpenAI's completion object."}), **events}


def _openai_call(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    api: Api = endpoint.api
    post: Operation = {
        "operationId": _op_id(f"openai_{endpoint.kind}", api.name),
        "summary": f"OpenAI's {endpoint.kind} of the API {api.name}",
        "tags": [api.name],
        "requestBody": _openai_body(endpoint.kind, [api.name]),
        "responses": _openai_errors(
            {"200": _ok(_openai_answer(endpoint.kind)), **_statuses(builder, api, *_OPENAI_STATUSES)}
        ),
    }
    return {"post": post}


def _openai_shared(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    names = sorted(endpoint.apis)
    first: Api = endpoint.apis[names[0]]
    post: Operation = {
        "operationId": _op_id("openai", endpoint.path),
        "summary": f"The API the body's model names: {', '.join(names)}",
        "tags": names,
        "requestBody": _openai_body(None, names),
        "responses": _openai_errors(
            {"200": _ok({**_any_answer(), **_openai_answer(None)}), **_statuses(builder, first, *_OPENAI_STATUSES)}
        ),
    }
    return {"post": post}


def _openai_models(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    return _server(
        builder, "/v1/models", "openai_models", "OpenAI's list of the models served", _json({"type": "object"})
    )


def _openai_model(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    summary = "One model: 200 once loaded, else 503"
    operations = _server(builder, "/v1/models/{name}", "openai_model", summary, _json({"type": "object"}), 404, 503)
    names = {"type": "string", "enum": sorted(endpoint.apis)}
    for operation in operations.values():
        operation["parameters"] = [{"name": "name", "in": "path", "required": True, "schema": names}]
        _openai_errors(operation["responses"])
    return operations


def _truss_method(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    api: Api = endpoint.api
    post: Operation = {
        "operationId": _op_id(endpoint.method, api.name),
        "summary": f"The {endpoint.method} method of the API {api.name}",
        "tags": [api.name],
        "requestBody": {"required": False, "content": _json({})},
        "responses": {"200": _ok(_any_answer()), **_statuses(builder, api, 400, 413, 500, 503, 504)},
    }
    return {"post": post}


def _alias(verb: str, summary: str) -> Describer:
    def describe(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
        post = _realtime(builder, endpoint)["post"]
        return {"post": {**post, "operationId": _op_id(verb, endpoint.api.name), "summary": summary}}

    return describe


def _ping(builder: _Builder, endpoint: Any) -> dict[str, Operation]:
    return _server(builder, "/ping", "ping", "SageMaker's readiness: {} once loaded", _json({"type": "object"}), 503)


def _describers() -> dict[Any, tuple[str, Describer]]:
    """The endpoint methods the document knows, with the path template they are listed under."""
    from modelserve.http import app, docs, jobs, openai, realtime, truss, versions

    return {
        openai.OpenAIEndpoint.post: ("", _openai_call),
        openai.ByModel.post: ("", _openai_shared),
        openai.Models.list: ("", _openai_models),
        openai.Models.one: ("", _openai_model),
        truss.TrussMethod.post: ("", _truss_method),
        truss.TrussPredict.post: ("", _alias("truss_predict", "The API's predict, under Truss's path")),
        truss.Invocations.post: ("", _alias("invocations", "The API's predict, under SageMaker's path")),
        truss.SageMaker.ping: ("", _ping),
        realtime.RealtimeEndpoint.post: ("", _realtime),
        versions.VersionRoutes.post: ("", _versioned),
        jobs.JobsEndpoint.submit: ("", _jobs),
        jobs.JobsEndpoint.show: ("", _job),
        app.ServerRoutes.healthz: ("", _healthz),
        app.ServerRoutes.readyz: ("", _readyz),
        app.ServerRoutes.metrics: ("", _metrics),
        docs.DocsRoutes.openapi: ("", _openapi),
        docs.DocsRoutes.openapi_of_api: ("/openapi/{api}.json", _openapi_of_api),
        docs.DocsRoutes.docs: ("", _docs),
    }


def _description(api: Api) -> str:
    if api.config.description:
        return api.config.description
    cls = getattr(api.backend, "cls", None)
    doc = inspect.getdoc(cls) if cls is not None else None
    return doc or ""


def _api_of(route: Route) -> str | None:
    for handler in route.handlers.values():
        api = getattr(getattr(handler, "__self__", None), "api", None)
        if api is not None:
            return str(api.name)
    return None


def document(server: ModelServer, routes: Iterable[Route], api: str | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the routes of `server` (those of one API when `api` names it)."""
    builder = _Builder(server)
    describers = _describers()
    paths: dict[str, Any] = {}
    for route in routes:
        owner_api = _api_of(route)
        if (api is not None and owner_api != api) or (route.path == "/" and owner_api is not None):
            continue  # another API's, or the lone API's alias of /<api> (listed once, under /<api>)
        for handler in route.handlers.values():
            found = describers.get(getattr(handler, "__func__", None))
            if found is not None:
                path, describe = found
                operations = describe(builder, getattr(handler, "__self__", None))
                # only the methods the route answers (an alias of a route may answer fewer)
                served = {method: op for method, op in operations.items() if method.upper() in route.handlers}
                paths.setdefault(path or route.path, {}).update(served)
                break
    doc: dict[str, Any] = {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": f"modelserve: {api}" if api else "modelserve",
            "version": _version(),
            "description": _info(server, api),
        },
        "paths": paths,
        "components": {"schemas": builder.schemas},
    }
    tagged = _tags(paths)
    tags = [{"name": name, "description": _description(server.apis[name])} for name in server.apis if name in tagged]
    if tags:
        doc["tags"] = [{k: v for k, v in tag.items() if v} for tag in tags]
    if builder.security(None) or any(builder.security(name) for name in server.apis):
        doc["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
        }
        for item in paths.values():
            for operation in item.values():
                if "401" in operation["responses"]:
                    operation["security"] = [{"bearer": []}, {"apiKey": []}]
    return doc


def _version() -> str:
    import modelserve

    return str(modelserve.__version__)


def _tags(paths: dict[str, Any]) -> set[str]:
    return {tag for item in paths.values() for operation in item.values() for tag in operation.get("tags", ())}


def _info(server: ModelServer, api: str | None) -> str:
    lines = ["Generated by modelserve from the project's APIs."]
    if len(server.apis) == 1:
        lines.append(f"The lone API is also served at `/` (the same operations as `/{next(iter(server.apis))}`).")
    if "v2" in server.project.protocols and api is None:
        lines.append("The Open Inference Protocol routes (`/v2/...`) follow that protocol's own specification.")
    return " ".join(lines)
