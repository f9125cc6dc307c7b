"""The Open Inference Protocol (KServe V2, Triton's HTTP API) over every realtime API: its routes, as adapters
over `Api.call`.

::

    GET  /v2/health/live                                  {"live": true}
    GET  /v2/health/ready                                 {"ready": true}, or 503 while an API loads or failed
    GET  /v2                                              the server's name, version and extensions
    GET  /v2/models/<api>[/versions/1]                    the model's metadata (platform, inputs, outputs)
    GET  /v2/models/<api>[/versions/1]/ready              {"name": ..., "ready": true}, or 503
    POST /v2/models/<api>[/versions/1]/infer              an inference, JSON or with binary tensors
    GET  /v2/models[/<api>[/versions/1]]/stats            the statistics extension (Triton's JSON)
    *    /v2/models/<anything else>                       Triton's "Request for unknown model: ..." (400)

The paths are exact routes of the one route table, one set per API (the names are known at startup). An
inference is a spec over the exchange (`modelserve.http.exchange`): admitted, read, decompressed
(Content-Encoding), decoded by `modelserve.v2` and checked against the model's metadata (400s that name the
tensor), then run through `Api.call` like a native request: the same line and 503s, timeout (504),
cancellation on disconnect, metrics, access line and request id (``X-Request-ID``, else the request's
``id``). Every error answer is the error map's ``{"error": ..., "request_id": ...}``, which is the protocol's
shape.

ONNX and TensorFlow APIs take the tensors straight to the model, through its tensor entry (the backend's
`tensors` pipeline; the hooks are not applied, see docs/v2.md); any other API's stages receive a
`modelserve.v2.V2Inputs` mapping and return a mapping of outputs (or one value, the output ``output``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
import zlib
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson
from starlette.types import Receive, Scope, Send

from modelserve._threads import freed_on_failure
from modelserve.api import Api, Stream, log_user_error
from modelserve.codecs import BYTES_TYPE, DECODE_INLINE_MAX, JSON_TYPE
from modelserve.context import RequestContext, sane_request_id
from modelserve.errors import (
    BadRequest,
    ConfigError,
    LoadError,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    UserCodeError,
    shorten,
)
from modelserve.http._asgi import read_body, send_json
from modelserve.http.auth import named, shown_states
from modelserve.http.errors import send_error
from modelserve.http.exchange import SHUTTING_DOWN, Exchange, Head, exchange_route, writes_access_line
from modelserve.http.routing import Route
from modelserve.pipeline import Pipeline
from modelserve.server import ModelServer
from modelserve.v2 import InferRequest, decode_request, encode_response, listed
from modelserve.v2 import outputs_of as class_outputs
from modelserve.v2_signature import Signature, declared, meta_of

if TYPE_CHECKING:
    from collections.abc import Awaitable

logger = logging.getLogger("modelserve")

#: The platform a model file's metadata names, by format.
PLATFORMS = {"onnx": "onnx_onnxv1", "tensorflow": "tensorflow_savedmodel"}
#: The protocol's extensions modelserve implements (``GET /v2``).
EXTENSIONS = ["binary_tensor_data", "statistics"]
#: The stages whose times Triton's statistics call compute_input and compute_output; any other stage of a call
#: (predict, run, a handler's method) is compute_infer.
_INPUT_STAGES = ("preprocess", "pre_inference")
_OUTPUT_STAGES = ("postprocess", "post_inference")


def _headers(scope: Scope) -> tuple[str | None, str | None, str | None, str | None]:
    """(X-Request-ID, Content-Length, Inference-Header-Content-Length, Content-Encoding) in one pass."""
    request_id = content_length = header_length = encoding = None
    for key, value in scope["headers"]:
        if key == b"content-length":
            content_length = value.decode("latin-1")
        elif key == b"inference-header-content-length":
            header_length = value.decode("latin-1")
        elif key == b"x-request-id":
            request_id = value.decode("latin-1")
        elif key == b"content-encoding":
            encoding = value.decode("latin-1").strip().lower()
    return request_id, content_length, header_length, encoding


#: zlib's window bits for the Content-Encodings tritonclient may send (request_compression_algorithm).
#: RFC 9110 (8.4.1.3): a recipient should read x-gzip as gzip.
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


#: Compressed bytes given to zlib at a time: what zlib copies of the input left at the end of a gzip member
#: (``unused_data``) is at most this, whatever the body's size and its number of members.
_INFLATE_PIECE = 64 * 1024
#: The most gzip members a body may hold (a member each 64 KiB, as bgzip writes them, is 640 for 40 MiB); an empty
#: member costs 20 bytes and a decompressor, and 500,000 of them took 1.2 s of CPU.
_MAX_MEMBERS = 4096


def _decompressed(body: bytes, encoding: str, limit: int) -> bytes:
    """A compressed request body, decompressed to at most `limit` bytes (a 413 beyond: no zip bombs), in a worker
    thread (`prepare`). A gzip body may be several members one after the other (RFC 1952), read as one, as
    ``gzip -d`` reads them; bytes after the end of the compressed data are a 400."""
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise BadRequest(f"Content-Encoding {encoding!r} is not supported (gzip, deflate or identity)")
    view = memoryview(body)
    parts: list[bytes] = []
    size = offset = members = 0
    while offset < len(body) or not members:
        if members and wbits == zlib.MAX_WBITS:
            raise BadRequest(f"the request body goes on after the end of its {encoding} data")
        members += 1
        if members > _MAX_MEMBERS:
            raise BadRequest(f"the request body holds more than {_MAX_MEMBERS} {encoding} members")
        inflate = zlib.decompressobj(wbits)
        while not inflate.eof:
            if offset >= len(body):
                raise BadRequest(f"the request body ends inside its {encoding} data")
            piece = view[offset : offset + _INFLATE_PIECE]
            try:
                data = inflate.decompress(piece, limit - size + 1)
            except zlib.error as exc:
                raise BadRequest(f"the request body is not valid {encoding} data: {exc}") from None
            size += len(data)
            if size > limit:
                raise PayloadTooLarge(f"the request body decompresses to more than the limit of {limit} bytes")
            offset += len(piece) - len(inflate.unused_data)
            parts.append(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _digits(text: str) -> bool:
    """ASCII digits only, at most 18 (``str.isdigit`` takes '²' and every script's digits, which `int` refuses
    or reads; 18 digits are beyond any body)."""
    return text.isascii() and text.isdigit() and len(text) <= 18


def _header_length(text: str) -> int:
    text = text.strip()
    if not _digits(text):
        raise BadRequest(
            f"Inference-Header-Content-Length must be a number of bytes in ASCII digits, got {text[:40]!r}"
        )
    return int(text)


#: The data_type of Triton's model configuration of each V2 datatype.
CONFIG_TYPES = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FP16": "TYPE_FP16",
    "FP32": "TYPE_FP32",
    "FP64": "TYPE_FP64",
    "BF16": "TYPE_BF16",
    "BYTES": "TYPE_STRING",
}


def _dims(shape: tuple[int, ...] | None, max_batch_size: int) -> list[int]:
    """A tensor's ``dims`` in Triton's model configuration: its shape (``[-1]``: any), less the first (batch)
    dimension when the model batches."""
    if shape is None:
        return [-1]
    return list(shape[1:] if max_batch_size > 0 else shape)


class V2Model(Exchange):
    """The V2 routes of one API: metadata, readiness, statistics, and inference over the exchange."""

    def __init__(self, api: Api, version: str = "1", versions: Callable[[], list[str]] | None = None) -> None:
        super().__init__(api)
        #: The version this model is (a folder of numbered versions, `modelserve.repository`), and what lists
        #: every served version of its API for the metadata.
        self.version = version
        self.versions = versions or (lambda: [version])
        self.call = self.call_model
        self._signature: Signature | None = None
        #: The backend the signature was read from (a repository load switches an API to a new one), held weakly:
        #: an unloaded API's model is freed though this route stays.
        self._backend: Callable[[], Any] = _gone
        #: A model file's tensor entry (`ModelFileBackend.tensors`), once loaded: its tensors go straight to
        #: the model, without the hooks, which were written for another payload than the model's tensors.
        self._tensors: Pipeline | None = None
        #: The same entry for a request decoded and answered in the call's worker thread (`decode`): None where
        #: the tensor entry has no sync call for a thread (a batched API).
        self._unread: Pipeline | None = None
        # A Model class's declared tensors are checked now, with the rest of the user's code (a LoadError).
        self._declared = _declared_by_class(api)

    def signature(self) -> Signature:
        """The API's metadata, once it has loaded (a model file's tensors are known only then)."""
        if self._signature is None or self._backend() is not self.api.backend:
            backend = self.api.backend
            self._backend = weakref.ref(backend)
            self._tensors = self._unread = None
            model = getattr(backend, "model", None)
            if model is not None and self.api.backend.kind == "model_file":
                inputs = tuple(meta for meta in map(meta_of, model.inputs) if meta is not None)
                outputs = tuple(meta for meta in map(meta_of, model.outputs) if meta is not None)
                platform = PLATFORMS.get(model.format, model.format)
                self._tensors = getattr(backend, "tensors", None)
                self._signature = Signature(platform, inputs, outputs, text=True)
                if self._tensors is not None and self._tensors.busy_call is not None:
                    self._unread = self._unread_entry(self._tensors, self._tensors.busy_call)
            else:
                inputs, outputs = self._declared
                self._signature = Signature("python", inputs, outputs)
        return self._signature

    async def metadata(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = sane_request_id(_headers(scope)[0])
        if not self.api.ready:
            await send_error(send, self.api.not_ready(), request_id)
            return
        await send_json(send, 200, self.described(), request_id)

    async def config(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = sane_request_id(_headers(scope)[0])
        if not self.api.ready:
            await send_error(send, self.api.not_ready(), request_id)
            return
        await send_json(send, 200, self.model_config(), request_id)

    def model_config(self) -> dict[str, Any]:
        """The model's configuration as Triton's model configuration states it (its JSON form): name, platform,
        max_batch_size (0: the API does not batch) and tensors. As in Triton's, a batching model's ``dims``
        leave out the first dimension, the batch's (the metadata's shapes keep it): a client that reads the
        configuration puts the batch size before them."""
        signature = self.signature()
        batching = self.api.config.batching
        batch = batching.max_batch_size if batching is not None else 0
        config: dict[str, Any] = {"name": self.name, "platform": signature.platform, "max_batch_size": batch}
        for key, tensors in (("input", signature.inputs), ("output", signature.outputs)):
            config[key] = [
                {"name": meta.name, "data_type": CONFIG_TYPES[meta.datatype], "dims": _dims(meta.shape, batch)}
                for meta in tensors or ()
            ]
        return config

    def described(self) -> dict[str, Any]:
        """The model's metadata, with every version its API serves."""
        described = self.signature().describe(self.name)
        described["versions"] = self.versions()
        return described

    async def ready(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = sane_request_id(_headers(scope)[0])
        if self.api.ready:
            await send_json(send, 200, {"name": self.name, "ready": True}, request_id)
            return
        not_ready = self.api.not_ready()
        not_ready.extra = {"name": self.name, "ready": False}
        await send_error(send, not_ready, request_id)

    async def stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = {"model_stats": [statistics(self.api, self.version)]}
        await send_json(send, 200, answer, sane_request_id(_headers(scope)[0]))

    infer = exchange_route()

    # the spec's part of an inference

    @staticmethod
    def read_head(scope: Scope) -> Head:
        """The request id, Content-Length, and (X-Request-ID, Inference-Header-Content-Length,
        Content-Encoding): the body is parsed by route, not by Content-Type (tritonclient's sync client sends
        none)."""
        header_id, content_length, header_length, encoding = _headers(scope)
        return sane_request_id(header_id), None, content_length, (header_id, header_length, encoding)

    def prepare(self, body: bytes, head: Head) -> bytes | Callable[[], bytes]:
        encoding = head[3][2]
        if encoding is None or encoding == "identity":
            return body
        return partial(_decompressed, body, encoding, self.api.config.max_body_size)

    def decode(self, body: bytes, head: Head, ctx: RequestContext) -> InferRequest | _Unread:
        """The request, checked against the model's metadata (400s that name the tensor); on a busy server, a
        model file's request is left `_Unread`, for the worker thread that runs its call. Busy as `Api.call` has
        it: other requests read after this one (``ctx.crowded``), or a call of the API running; the second is
        marked crowded too, so that the call goes to the thread even if that call ends before it begins."""
        signature = self._signature
        if signature is None or self._backend() is not self.api.backend:
            signature = self.signature()
        if self._unread is not None and (ctx.crowded or self.api.limiter.running):
            ctx.crowded = True
            return _Unread(body, head)
        return self._decoded(body, head, ctx, signature)

    def _decoded(self, body: bytes, head: Head, ctx: RequestContext, signature: Signature) -> InferRequest:
        header_id, header_length, _ = head[3]
        if header_length is None and len(body) <= DECODE_INLINE_MAX:
            fast = signature.fast_request(body)
            if fast is not None:
                return fast
        header_size = None if header_length is None else _header_length(header_length)
        request = decode_request(body, header_size, signature.raw_input, signature.text)
        if header_id is None and request.id is not None:
            ctx.request_id = sane_request_id(request.id)
        signature.check(request)
        return request

    def call_model(self, decoded: InferRequest | _Unread, ctx: RequestContext, **call: Any) -> Awaitable[Any]:
        """`Api.call` for a decoded request: a model file's tensor entry, or the API's pipeline (HTTP and gRPC);
        for an `_Unread` one, the tensor entry that decodes and encodes too."""
        if isinstance(decoded, _Unread):
            return self.api.call(decoded, ctx, pipeline=self._unread, **call)
        return self.api.call(decoded.inputs, ctx, pipeline=self._tensors, **call)

    def _unread_entry(self, tensors: Pipeline, tensors_call: Callable[[Any, Any, Any], Any]) -> Pipeline:
        """The tensor entry for an `_Unread` request: decode, the model's call, then encode, all in the worker
        thread that `Api.call` gives a crowded call (`busy_call`). The event loop, which decoded and encoded
        every request before, now only reads and writes them, while the thread runs the waiting calls one after
        the other (as the Model class's sync predict does); a 400 for the body comes out of the thread as it
        would have come out of `decode`, what was decoded before it freed there (`_threads.freed_on_failure`).
        `run`, on the loop, does the same with the entry's own step (for a call that `Api.call` takes on the
        loop after all)."""

        def whole(unread: _Unread, request: Any, ctx: Any) -> Any:
            # A refused decode's half-decoded tensors are freed here, not on the loop that answers the 400.
            decoded = freed_on_failure(self._decoded, unread.body, unread.head, ctx, self.signature())
            return self._encoded(tensors_call(decoded.inputs, request, ctx), decoded)

        async def step(unread: _Unread, request: Any, ctx: Any) -> Any:
            decoded = self._decoded(unread.body, unread.head, ctx, self.signature())
            return self._encoded(await tensors.run(decoded.inputs, request, ctx), decoded)

        return Pipeline(tensors.stages, timer=tensors.timer, run=step, busy_call=whole)

    def _encoded(self, result: Any, request: InferRequest) -> Any:
        """`encode`'s answer to a model file's `result`; a result V2 cannot carry is the user code's error,
        which `Api.call` logs."""
        try:
            body, json_length = encode_response(self.name, request, self.outputs(result, request), self.version)
        except TypeError as exc:
            raise UserCodeError("encoding the V2 answer", exc) from None
        if json_length is None:
            return body, JSON_TYPE, None
        return body, BYTES_TYPE, [(b"inference-header-content-length", str(json_length).encode())]

    def encode(self, result: Any, value: Any, head: Head, ctx: RequestContext) -> Any:
        """The answer's body; a result V2 cannot carry (a stream, an object) is the user code's 500."""
        if type(value) is _Unread:
            return result  # decoded, called and encoded in the call's thread (`_unread_entry`)
        if isinstance(result, Stream):
            return partial(_refuse_stream, result)
        try:
            return self._encoded(result, value)
        except UserCodeError as error:
            log_user_error(self.name, ctx, error)
            raise

    def outputs(self, result: Any, request: InferRequest) -> dict[str, Any]:
        """The outputs of a call's `result` to send: those `request` names (a 400 for one the model did not
        return), else the declared ones. `TypeError` for a result that holds no tensors (see `not_encoded`)."""
        outputs = result if self._tensors is not None else class_outputs(result)
        if request.outputs is None and self._signature is not None and self._signature.outputs is not None:
            # The declared outputs (a model file's tensors: not its ONNX sequences or maps), when named none.
            declared = self._signature.outputs
            if len(declared) != len(outputs):
                outputs = {meta.name: outputs[meta.name] for meta in declared if meta.name in outputs}
        if request.outputs is not None:
            missing = [name for name in request.outputs if name not in outputs]
            if missing:
                raise BadRequest(
                    f"unknown output {listed(missing)}; the model returned {listed(list(outputs)) or 'no outputs'}"
                )
        return outputs

    def not_encoded(self, ctx: RequestContext, exc: TypeError) -> UserCodeError:
        """A result V2 cannot carry is the user code's failure (a 500), logged once."""
        error = UserCodeError("encoding the V2 answer", exc)
        log_user_error(self.name, ctx, error)
        return error


async def _refuse_stream(stream: Stream, scope: Scope, receive: Receive, send: Send) -> int:
    await stream.aclose()
    refused = _NotATensor("predict returned a stream, which the V2 protocol cannot carry")
    error = UserCodeError("encoding the V2 answer", refused)
    log_user_error(stream.ctx.api, stream.ctx, error)
    raise error


class _Unread:
    """A request's body and head, to decode in the worker thread that runs its call (`V2Model.decode`)."""

    __slots__ = ("body", "head")

    def __init__(self, body: bytes, head: Head) -> None:
        self.body = body
        self.head = head


class _NotATensor(TypeError):
    """A result the V2 protocol cannot carry."""


def _duration(count: int, seconds: float) -> dict[str, int]:
    return {"count": count, "ns": max(0, round(seconds * 1e9))}


def statistics(api: Api, version: str = "1") -> dict[str, Any]:
    """One API's entry of the statistics extension, in Triton's shape, from what this process has counted.

    success and fail: the answers below 400 and from 400 up (native and V2 alike), with the seconds from each
    request's arrival to its answer; queue: the waits for a batch (batched APIs; the wait for a concurrency
    slot is not measured); compute_input, compute_infer, compute_output: the stages' times. Every request is
    one inference; an execution is one call of the model (one batch, when batched)."""
    totals = api.metrics.totals()
    succeeded = sum(count for code, count in totals.codes.items() if code < 400)
    failed = sum(count for code, count in totals.codes.items() if code >= 400)
    compute = {"compute_input": [0, 0.0], "compute_infer": [0, 0.0], "compute_output": [0, 0.0]}
    for stage, (count, seconds) in totals.stages.items():
        if stage != "job":
            key = "compute_infer"
            if stage in _INPUT_STAGES:
                key = "compute_input"
            elif stage in _OUTPUT_STAGES:
                key = "compute_output"
            compute[key][0] += count
            compute[key][1] += seconds
    queue = totals.batch_wait or (0, 0.0)
    return {
        "name": api.name,
        "version": version,
        "last_inference": round(totals.last_success * 1000),
        "inference_count": succeeded,
        "execution_count": totals.batches if totals.batches is not None else compute["compute_infer"][0],
        "inference_stats": {
            "success": _duration(succeeded, totals.seconds - totals.failed_seconds),
            "fail": _duration(failed, totals.failed_seconds),
            "queue": _duration(*queue),
            **{key: _duration(int(count), seconds) for key, (count, seconds) in compute.items()},
            "cache_hit": _duration(0, 0.0),
            "cache_miss": _duration(0, 0.0),
        },
        "batch_stats": [],
        "memory_usage": [],
    }


def _gone() -> None:
    """A weak reference's answer once its object is gone (`V2Model` before it first reads a backend)."""
    return None


def _declared_by_class(api: Api) -> tuple[Any, Any]:
    """A Model class's ``v2_inputs`` and ``v2_outputs`` (None when it declares none)."""
    cls = getattr(api.backend, "cls", None)
    if not isinstance(cls, type):
        return None, None
    label = getattr(api.backend, "label", cls.__name__)
    try:
        return declared(cls, "v2_inputs", label), declared(cls, "v2_outputs", label)
    except ValueError as exc:
        raise LoadError(f"api '{api.name}': {exc}") from None


def _no_route(scope: Scope, offered: str) -> NotFound:
    """The 404 for a path under /v2 that nothing serves, which quotes the path cut (`shorten`: it may be of any
    length), and says what is served there instead."""
    return NotFound(f"no V2 route at {shorten(scope['path'])}; {offered}")


class V2Server:
    """The server-wide V2 routes: liveness, readiness and the server's metadata."""

    def __init__(self, server: ModelServer) -> None:
        self.server = server
        #: The APIs V2 serves, by name.
        self.apis = {name: api for name, api in server.apis.items() if api.config.kind == "realtime"}

    async def stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = {"model_stats": [statistics(api, version) for api, version in served_versions(self.server)]}
        await send_json(send, 200, answer, sane_request_id(_headers(scope)[0]))

    async def unknown(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Any other path under ``/v2/models/``: Triton's words for a model it does not serve (a 400, as Triton's
        model repository answers INVALID_ARG), or for a version or route of one it does (404)."""
        name, _, tail = scope["path_params"]["rest"].partition("/")
        error: Exception
        if name not in self.apis:
            error = BadRequest(f"Request for unknown model: {shorten(name)} is not found")
        elif tail.startswith("versions/") and tail.split("/")[1] != "1" and name not in self.server.versions:
            version = tail.split("/")[1]
            error = NotFound(f"Request for unknown model: '{name}' version {version[:40]} is not found")
        else:
            error = _no_route(scope, f"the model '{name}' has metadata, ready, infer, stats and config")
        await send_error(send, error, sane_request_id(_headers(scope)[0]))

    async def live(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send_json(send, 200, {"live": True}, sane_request_id(_headers(scope)[0]))

    async def ready(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = sane_request_id(_headers(scope)[0])
        ready, workers = self.server.workers_ready()
        if ready:
            await send_json(send, 200, {"ready": True}, request_id)
            return
        every = {name: api.state for name, api in self.server.apis.items()}
        states = shown_states(scope, every)  # with API keys on, a request without one reads no guarded name
        failed = [name for name, state in states.items() if state == "failed"]
        hidden = sum(state == "failed" for state in every.values()) - len(failed)
        failing = failed or hidden
        not_ready = ServiceUnavailable(f"failed to load: {named(failed, hidden)}" if failing else workers or "loading")
        not_ready.extra = {"ready": False, "apis": states}
        await send_error(send, not_ready, request_id)

    async def metadata(self, scope: Scope, receive: Receive, send: Send) -> None:
        from modelserve import __version__  # the package imports this module while it is being imported

        answer = {"name": "modelserve", "version": __version__, "extensions": EXTENSIONS}
        await send_json(send, 200, answer, sane_request_id(_headers(scope)[0]))


class V2Versions:
    """The V2 routes of an API with numbered versions (`modelserve.repository.Versions`): one `V2Model` per
    version, ``/versions/<v>/...`` for each, and the unversioned routes answered by the highest ready one."""

    def __init__(self, server: ModelServer, name: str) -> None:
        self.versions = server.versions[name]
        self.name = name
        self._models: dict[int, V2Model] = {}

    def model(self, number: int) -> V2Model:
        """The V2 model of one served version (made once per loaded `Api`)."""
        api = self.versions.apis[number]
        model = self._models.get(number)
        if model is None or model.api is not api:
            model = self._models[number] = V2Model(api, str(number), self.versions.numbers)
        return model

    def current(self) -> V2Model:
        return self.model(self.versions.current_number())

    @property
    def api(self) -> Api:
        """The API the unversioned routes reach now (the route table's API keys read it)."""
        return self.current().api

    async def metadata(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.current().metadata(scope, receive, send)

    async def ready(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.current().ready(scope, receive, send)

    async def stats(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.current().stats(scope, receive, send)

    async def config(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.current().config(scope, receive, send)

    @writes_access_line
    async def infer(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.current().infer(scope, receive, send)

    def _versioned(self, scope: Scope) -> tuple[V2Model | None, str]:
        number, _, route = scope["path_params"]["tail"].partition("/")
        if number.isascii() and number.isdigit() and int(number) in self.versions.apis:
            return self.model(int(number)), route
        return None, number

    async def _unknown(self, scope: Scope, send: Send, version: str) -> None:
        error = NotFound(f"Request for unknown model: '{self.name}' version {version[:40]} is not found")
        await send_error(send, error, sane_request_id(_headers(scope)[0]))

    async def versioned_get(self, scope: Scope, receive: Receive, send: Send) -> None:
        model, route = self._versioned(scope)
        if model is None:
            await self._unknown(scope, send, route)
            return
        handler = {"": model.metadata, "ready": model.ready, "stats": model.stats, "config": model.config}.get(route)
        if handler is None:
            error = _no_route(scope, f"the model '{self.name}' has metadata, ready, infer, stats and config")
            await send_error(send, error, sane_request_id(_headers(scope)[0]))
            return
        await handler(scope, receive, send)

    @writes_access_line
    async def versioned_post(self, scope: Scope, receive: Receive, send: Send) -> None:
        model, route = self._versioned(scope)
        if model is None:
            await self._unknown(scope, send, route)
        elif route != "infer":
            error = _no_route(scope, "POST the model's /infer")
            await send_error(send, error, sane_request_id(_headers(scope)[0]))
        else:
            await model.infer(scope, receive, send)


def served_versions(server: ModelServer) -> list[tuple[Api, str]]:
    """Every served version of every realtime API, with its version (for the statistics of all of them)."""
    served = []
    for name, api in server.apis.items():
        if api.config.kind != "realtime":
            continue
        versions = server.versions.get(name)
        if versions is None:
            served.append((api, "1"))
        else:
            served += [(versions.apis[number], str(number)) for number in sorted(versions.apis)]
    return served


class V2Repository:
    """The repository extension: ``POST /v2/repository/index``, ``POST /v2/repository/models/<m>/load`` and
    ``/unload`` (`modelserve.repository.Repository`; refused unless ``--model-control explicit``)."""

    def __init__(self, server: ModelServer) -> None:
        self.repository = server.repository

    async def index(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = sane_request_id(_headers(scope)[0])
        try:
            body = await read_body(receive, _SMALL_BODY, None)
            ready = _json_object(body).get("ready")
            if ready is not None and type(ready) is not bool:  # bool("false") is true
                raise BadRequest(f"'ready' must be true or false, got {type(ready).__name__}")
        except Exception as exc:
            await send_error(send, exc, request_id)
            return
        await send_json(send, 200, self.repository.index(bool(ready)), request_id)

    async def control(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = sane_request_id(_headers(scope)[0])
        name, _, action = scope["path_params"]["tail"].rpartition("/")
        try:
            if action not in ("load", "unload") or not name:
                raise _no_route(scope, "POST /v2/repository/models/<model>/load or /unload")
            parameters = _json_object(await read_body(receive, _SMALL_BODY, None)).get("parameters") or {}
            if not isinstance(parameters, dict):
                raise BadRequest(f"failed to {action} {shorten(name)}: 'parameters' must be a JSON object")
            config = self.repository.requested_config(action, name, parameters)
            if action == "load":
                await self.repository.load(name, config)
            else:
                await self.repository.unload(name)
        except asyncio.CancelledError:  # the server's shutdown, past its grace period (else a plain-text 500)
            logger.warning("the %s of '%s' was stopped by the server's shutdown (503)", action, name[:60])
            with contextlib.suppress(Exception):  # the connection may be gone
                await send_error(send, ServiceUnavailable(SHUTTING_DOWN), request_id)
            return
        except LoadError as exc:
            await send_error(send, BadRequest(str(exc)), request_id)
            return
        except Exception as exc:
            await send_error(send, exc, request_id)
            return
        await send_json(send, 200, {}, request_id)


#: The largest body of a repository request (a JSON object of parameters).
_SMALL_BODY = 64 * 1024


def _json_object(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(value).__name__}")
    return value


def routes(server: ModelServer) -> list[Route]:
    """The V2 routes of a server: its own, then each realtime API's, with and without ``/versions/1``.

    Async APIs are not served over V2 (the protocol has no jobs)."""
    if "v2" in server.apis:
        raise ConfigError("an API named 'v2' would hide the V2 routes; rename it")
    own = V2Server(server)
    table = [
        Route("/v2", {"GET": own.metadata}),
        Route("/v2/health/live", {"GET": own.live}),
        Route("/v2/health/ready", {"GET": own.ready}),
    ]
    if "stats" in own.apis:
        logger.warning("an API named 'stats' hides V2's statistics of every model (GET /v2/models/stats)")
    else:
        table.append(Route("/v2/models/stats", {"GET": own.stats}))
    for api in own.apis.values():
        model: V2Model | V2Versions
        if api.name in server.versions:
            model = V2Versions(server, api.name)
            bases = [f"/v2/models/{api.name}"]
            versioned = f"/v2/models/{api.name}/versions/{{tail:path}}"
            table.append(Route(versioned, {"GET": model.versioned_get, "POST": model.versioned_post}))
        else:
            model = V2Model(api)
            bases = [f"/v2/models/{api.name}", f"/v2/models/{api.name}/versions/1"]
        for base in bases:
            table += [
                Route(base, {"GET": model.metadata}),
                Route(f"{base}/ready", {"GET": model.ready}),
                Route(f"{base}/config", {"GET": model.config}),
                Route(f"{base}/infer", {"POST": model.infer}),
                Route(f"{base}/stats", {"GET": model.stats}),
            ]
    repository = V2Repository(server)
    table.append(Route("/v2/repository/index", {"POST": repository.index}))
    table.append(Route("/v2/repository/models/{tail:path}", {"POST": repository.control}))
    table.append(Route("/v2/models/{rest:path}", {"GET": own.unknown, "POST": own.unknown}))
    return table
