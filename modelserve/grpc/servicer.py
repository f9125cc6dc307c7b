"""The KServe V2 / Triton ``inference.GRPCInferenceService``: each method an adapter over the same APIs as the
HTTP routes, an inference through `Api.call` like any other.

::

    ServerLive, ServerReady                     the server's liveness and readiness (no API key needed)
    ServerMetadata                              name "modelserve", its version and the extensions
    ModelReady, ModelMetadata, ModelConfig      one model (a realtime API): ready, its tensors, its config
    ModelInfer                                  an inference: raw_input_contents or typed contents
    ModelStreamInfer                            a stream of inferences, answered in order (one response per
                                                chunk of a generating API)
    ModelStatistics                             the statistics extension, as over HTTP
    RepositoryIndex, RepositoryModelLoad/Unload the model repository (`modelserve.repository`)

An inference is admitted (the API's line, 503 as UNAVAILABLE), decoded and checked against the model's
signature (`modelserve.grpc.codec`, INVALID_ARGUMENT naming the input; the usual request in one pass by the
signature's `RawPlan`, made once), and called with a `cancelled` that
completes when the RPC ends early: the client cancels it, or its deadline passes. Every error goes through
the HTTP edge's one error map (`modelserve.http.errors.render`), whose status picks the gRPC code (`CODES`)
and whose message is the answer's details (Triton's wording for an unknown model). The metrics and the
statistics count a gRPC call like an HTTP request with the matching status.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator, Callable
from random import getrandbits
from time import perf_counter
from typing import Any

import grpc
import orjson
from google.protobuf import json_format
from starlette.exceptions import HTTPException

from modelserve.api import Stream
from modelserve.context import RequestContext, current, new_request_id, sane_request_id
from modelserve.errors import BadRequest, ClientDisconnected, HTTPError, LoadError, NotFound, PayloadTooLarge
from modelserve.grpc._proto import grpc_service_pb2 as pb
from modelserve.grpc.codec import RawAnswer, RawPlan, decode_infer, encode_infer
from modelserve.http.auth import Access, ApiKeys
from modelserve.http.errors import render
from modelserve.http.v2 import EXTENSIONS, V2Model, V2Versions, served_versions, statistics
from modelserve.server import ModelServer
from modelserve.v2 import InferRequest
from modelserve.v2_signature import Signature

logger = logging.getLogger("modelserve")

#: The gRPC status of each HTTP status the error map answers with (google.rpc.Code's HTTP mapping); any other
#: 4xx is INVALID_ARGUMENT (the caller's mistake) and any other status INTERNAL (`code_of`). User code's
#: starlette `HTTPException` may answer any status.
CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.ALREADY_EXISTS,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def code_of(status: int) -> grpc.StatusCode:
    """The gRPC status code of an HTTP status."""
    code = CODES.get(status)
    if code is None:
        code = grpc.StatusCode.INVALID_ARGUMENT if 400 <= status < 500 else grpc.StatusCode.INTERNAL
    return code


#: The longest status message sent: a client refuses trailers past 8-16 KiB (percent-encoded, up to 12 bytes a
#: character), and would see RESOURCE_EXHAUSTED instead of the status. A stream's ``error_message`` is held to
#: it too (user code's HTTPException may carry a detail of any size).
MAX_DETAILS = 512


def _shown(text: str, most: int) -> str:
    """`text` (a name the client sent) cut to `most` characters for a message."""
    return text if len(text) <= most else text[:most] + "..."


def details(body: bytes, status: int) -> str:
    """The message of an error body (`render`'s), as a status's details or a stream's ``error_message``: its
    ``error`` cut to `MAX_DETAILS` characters in all, and for a 500 its request id, kept whole, which the message
    tells the caller to look for in the server log (HTTP sends it in the body beside the message)."""
    answer = orjson.loads(body)
    told = f" (request id {answer['request_id']})" if status == 500 else ""
    return _shown(answer["error"], MAX_DETAILS - len("...") - len(told)) + told


def _passed_on(exc: HTTPException) -> HTTPError:
    """User code's starlette (or FastAPI) `HTTPException` as the error of its status and detail, as the HTTP
    error map answers it."""
    error = HTTPError(str(exc.detail))
    error.status_code = exc.status_code
    return error


#: The request that loads an unloaded API, as the answers to its calls name it (HTTP's names its V2 route).
LOAD = "RepositoryModelLoad"
#: The methods a client may call without an API key (the probes).
OPEN = frozenset({"ServerLive", "ServerReady"})
_UNPLANNED: Any = object()
#: The request ModelInfer and ModelStreamInfer are given for bytes that are not a ``ModelInferRequest``
#: (`modelserve.grpc.server.sized`): this very message, empty, whose name is no model's, so that the usual
#: request pays nothing to tell it apart (the refusal of its unknown model becomes INVALID_ARGUMENT).
MALFORMED = pb.ModelInferRequest()


def _parameter(value: Any) -> Any:
    """An InferParameter's value (a load's ``config`` is its string_param)."""
    choice = value.WhichOneof("parameter_choice")
    return getattr(value, choice) if choice is not None else None


def _metadata(context: Any) -> dict[str, str]:
    return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}


def _counted_ids() -> Callable[[], str]:
    """New request ids in the format of `modelserve.context.new_request_id` (a uuid4's 32 hex digits): the random
    bits of one uuid4, drawn when the servicer is made (in the process that serves), with a counter in their
    low 48 bits, unique for 2**48 calls. 0.4 us an id against 0.9 us for a random one (in-process): ids must
    be unique, not unpredictable, as that function says."""
    base = int(new_request_id(), 16) & ~_LOW_48
    count = itertools.count(getrandbits(48))
    return lambda: "%032x" % (base | (next(count) & _LOW_48))


_LOW_48 = (1 << 48) - 1


class RpcEnded:
    """`Api.call`'s `cancelled` for a gRPC call (a `modelserve.watch.Subscribable`): completes when the RPC
    ends before its answer, because the client cancelled it or its deadline passed."""

    __slots__ = ("context", "_ended")

    def __init__(self, context: Any) -> None:
        self.context = context
        self._ended: asyncio.Event | None = None

    def __call__(self) -> Any:
        ended = self._ended = asyncio.Event()
        self.context.add_done_callback(lambda _: ended.set())
        return self._wait(ended)

    @staticmethod
    async def _wait(ended: asyncio.Event) -> str:
        await ended.wait()
        return "disconnect"

    def subscribe(self, callback: Callable[[], None]) -> Callable[[], None] | None:
        live = [True]

        def done(_: Any) -> None:
            if live[0]:
                callback()

        self.context.add_done_callback(done)
        return lambda: live.__setitem__(0, False)


async def _next_chunk(stream: Stream) -> Any:
    # The request's context for the user code only: the stream's own generator may be closed from another task.
    token = current.set(stream.ctx)
    try:
        return await stream.next()
    finally:
        current.reset(token)


class _Chunks:
    """A generating API's call, streamed by ModelStreamInfer: the model, the request and the API's stream."""

    __slots__ = ("model", "decoded", "stream", "started")

    def __init__(self, model: V2Model, decoded: Any, stream: Stream, started: float) -> None:
        self.model = model
        self.decoded = decoded
        self.stream = stream
        self.started = started


class InferenceServicer:
    """The methods of ``inference.GRPCInferenceService`` over a `ModelServer`'s realtime APIs."""

    def __init__(self, server: ModelServer, keys: ApiKeys | None) -> None:
        self.server = server
        self.keys = keys if keys is not None and keys.api_keys else None
        realtime = {name: api for name, api in server.apis.items() if api.config.kind == "realtime"}
        #: The V2 model of each API, and of each version of the versioned ones (`modelserve.repository`).
        self.models = {name: V2Model(api) for name, api in realtime.items() if name not in server.versions}
        self.versioned = {name: V2Versions(server, name) for name in realtime if name in server.versions}
        #: The names of the models served.
        self.known = frozenset(realtime)
        #: The largest message any API takes (gRPC's own limit); each API's ``max_body_size`` is checked too.
        self.max_message = max((api.config.max_body_size for api in server.all_apis()), default=1 << 20)
        #: The fast path of each model signature's usual request (None: the model has none), made on first use.
        self._plans: dict[Signature, RawPlan | None] = {}
        #: The answer's bytes of each model (`ModelInfer`), made on first use.
        self._writers: dict[V2Model, RawAnswer] = {}
        self._new_id = _counted_ids()

    def names(self) -> list[str]:
        """The models served, by name."""
        return [*self.models, *self.versioned]

    # ------------------------------------------------------------------------------------------------
    # the shared steps

    def model(self, name: str, version: str) -> V2Model:
        """The model `name` in `version` ("": the highest ready one); NOT_FOUND in Triton's words."""
        versions = self.versioned.get(name)
        if versions is not None:
            if not version:
                return versions.current()
            if version.isascii() and version.isdigit() and int(version) in versions.versions.apis:
                return versions.model(int(version))
        else:
            model = self.models.get(name)
            if model is None:
                raise NotFound(f"Request for unknown model: '{_shown(name, 80)}' is not found")
            if version in ("", "1"):
                return model
        raise NotFound(f"Request for unknown model: '{_shown(name, 80)}' version {version[:40]} is not found")

    def _authorize(self, context: Any, method: str, api: str | None, metadata: dict[str, str] | None = None) -> None:
        keys = self.keys
        if keys is None or method in OPEN:
            return
        if api is not None and keys.protected_apis is not None and api not in keys.protected_apis and api in self.known:
            return  # one of the models that `auth.apis` leaves open (a name that is no model's needs a key)
        if metadata is None:
            metadata = _metadata(context)
        authorization, api_key = metadata.get("authorization"), metadata.get("x-api-key")
        refusal = keys.check(
            Access.API_KEY,
            authorization.encode("latin-1", "replace") if authorization is not None else None,
            api_key.encode("latin-1", "replace") if api_key is not None else None,
        )
        if refusal is not None:
            raise refusal.error(Access.API_KEY)

    def refusal(self, context: Any, name: str) -> str | None:
        """Why the health service may not answer for the model `name` on this call, else None: a model's name needs
        the key its model needs, and so does a name that is no model's, so that a call without one cannot tell a
        guarded model from no model (as `ModelReady` cannot)."""
        try:
            self._authorize(context, "Health", name)
        except HTTPError as exc:
            return exc.message
        return None

    async def _abort(self, context: Any, exc: BaseException, request_id: str) -> None:
        status, body, _ = render(exc, request_id)
        await context.abort(code_of(status), details(body, status))

    async def _answer(self, context: Any, method: str, api: str | None, make: Callable[[], Any]) -> Any:
        """The answer of a method other than an inference, or its error as a status."""
        try:
            self._authorize(context, method, api)
            return make()
        except HTTPError as exc:
            await self._abort(context, exc, sane_request_id(None))

    # ------------------------------------------------------------------------------------------------
    # health and metadata

    async def ServerLive(self, request: Any, context: Any) -> Any:  # noqa: N802 - the protocol's names
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.ServerReadyResponse(ready=self.server.workers_ready()[0])

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        from modelserve import __version__

        return await self._answer(
            context,
            "ServerMetadata",
            None,
            lambda: pb.ServerMetadataResponse(name="modelserve", version=__version__, extensions=EXTENSIONS),
        )

    async def ModelReady(self, request: Any, context: Any) -> Any:  # noqa: N802
        def make() -> Any:
            try:
                ready = self.model(request.name, request.version).api.ready
            except NotFound:
                ready = False
            return pb.ModelReadyResponse(ready=ready)

        return await self._answer(context, "ModelReady", request.name, make)

    def _ready_model(self, name: str, version: str) -> V2Model:
        model = self.model(name, version)
        if not model.api.ready:
            raise model.api.not_ready(LOAD)
        return model

    async def ModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        def make() -> Any:
            model = self._ready_model(request.name, request.version)
            return json_format.ParseDict(model.described(), pb.ModelMetadataResponse())

        return await self._answer(context, "ModelMetadata", request.name, make)

    async def ModelConfig(self, request: Any, context: Any) -> Any:  # noqa: N802
        def make() -> Any:
            config = self._ready_model(request.name, request.version).model_config()
            return json_format.ParseDict({"config": config}, pb.ModelConfigResponse())

        return await self._answer(context, "ModelConfig", request.name, make)

    async def ModelStatistics(self, request: Any, context: Any) -> Any:  # noqa: N802
        def make() -> Any:
            if request.name:
                model = self.model(request.name, request.version)
                served = [(model.api, model.version)]
            else:
                served = served_versions(self.server)
            answer = {"model_stats": [statistics(api, version) for api, version in served]}
            return json_format.ParseDict(answer, pb.ModelStatisticsResponse())

        return await self._answer(context, "ModelStatistics", request.name or None, make)

    # ------------------------------------------------------------------------------------------------
    # the repository (`modelserve.repository`)

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:  # noqa: N802
        def make() -> Any:
            entries = self.server.repository.index(request.ready)
            return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**e) for e in entries])

        return await self._answer(context, "RepositoryIndex", None, make)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._control(request, context, "load")
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:  # noqa: N802
        await self._control(request, context, "unload")
        return pb.RepositoryModelUnloadResponse()

    async def _control(self, request: Any, context: Any, action: str) -> None:
        name = request.model_name
        try:
            self._authorize(context, "RepositoryModel", None)
            parameters = {key: _parameter(value) for key, value in request.parameters.items()}
            config = self.server.repository.requested_config(action, name, parameters)
            if action == "load":
                await self.server.repository.load(name, config)
            else:
                await self.server.repository.unload(name)
        except LoadError as exc:
            await self._abort(context, BadRequest(str(exc)), sane_request_id(None))
        except HTTPError as exc:
            await self._abort(context, exc, sane_request_id(None))

    # ------------------------------------------------------------------------------------------------
    # inference

    async def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:  # noqa: N802
        """Each request of the stream answered in turn; a request that fails is answered with its error and the
        stream goes on, as Triton does. A generating API (its predict yields) answers one response per chunk,
        as a Triton decoupled model does."""
        async for message in requests:
            request = message[0] if type(message) is tuple else message
            request_id = sane_request_id(request.id or None)
            try:
                answer = await self.ModelInfer(message, context, request_id, streaming=True)
            except HTTPError as exc:
                yield self._stream_error(exc, request_id)
                continue
            if isinstance(answer, _Chunks):
                async for response in self._chunks(answer, request_id):
                    yield response
            else:
                yield pb.ModelStreamInferResponse(infer_response=answer)

    @staticmethod
    def _stream_error(exc: HTTPError, request_id: str) -> Any:
        status, body, _ = render(exc, request_id)
        return pb.ModelStreamInferResponse(error_message=details(body, status))

    async def _chunks(self, chunks: _Chunks, request_id: str) -> AsyncIterator[Any]:
        """One response per chunk of a generating API's stream; an error ends the stream with its message."""
        model, decoded, stream = chunks.model, chunks.decoded, chunks.stream
        status = 200
        try:
            while True:
                chunk = await _next_chunk(stream)
                if chunk is Stream.END:
                    break
                try:
                    outputs = model.outputs(chunk, decoded)
                    response = encode_infer(model.name, model.version, decoded, outputs)
                except TypeError as exc:
                    raise model.not_encoded(stream.ctx, exc) from None
                yield pb.ModelStreamInferResponse(infer_response=response)
        except HTTPError as exc:
            status = exc.status_code
            yield self._stream_error(exc, request_id)
        except asyncio.CancelledError:
            status = ClientDisconnected.status_code
            raise
        finally:
            await stream.aclose()
            model.api.metrics.answered(status, perf_counter() - chunks.started)

    async def ModelInfer(  # noqa: N802
        self, request: Any, context: Any, request_id: str | None = None, streaming: bool = False
    ) -> Any:
        """One inference. `request`: the message, or the message and its bytes on the wire
        (`modelserve.grpc.server.sized`; else its ``ByteSize()`` is counted, which serializes it).

        gRPC calls it with a request and its context: the answer is its message's bytes (`RawAnswer`) or the
        message, and an error ends the call with its status. `ModelStreamInfer` calls it with the request's id
        and `streaming`: the answer is the message, a generating API's call comes back as `_Chunks` (whose end
        the stream records in the metrics), and an error is raised (`HTTPError`). One coroutine for both, and
        none other between gRPC and `Api.call` (a coroutine more around it, with its own try, cost 0.15 us a
        call in a loop of its own, more in the servicer's, where the caches are cold)."""
        data = None
        if type(request) is tuple:
            request, data = request
        metadata = None
        if request_id is None:
            # With API keys on, the metadata is read once, for the key and the request id.
            metadata = _metadata(context) if self.keys is not None else None
            request_id = self._request_id(request, context, metadata)
        started = perf_counter()
        api = None
        token = None
        status = 200
        error: HTTPError
        try:
            keys = self.keys
            if keys is not None and (keys.protected_apis is None or request.model_name not in self.known):
                # Every API needs a key, or the name is no model's: a call without one learns nothing, not even
                # whether its model exists (as over HTTP, where an unknown path is a 401 too).
                self._authorize(context, "ModelInfer", None, metadata)
            model = self.model(request.model_name, request.model_version)
            if keys is not None and keys.protected_apis is not None:
                self._authorize(context, "ModelInfer", model.api.name, metadata)
            api = model.api
            ctx = RequestContext(api.name, request_id)
            token = current.set(ctx)
            size = request.ByteSize() if data is None else len(data)
            limit = api.config.max_body_size
            if size > limit:
                raise PayloadTooLarge(f"the request of {size} bytes is larger than the limit of {limit} bytes")
            if not api.ready:
                raise api.not_ready(LOAD)
            api.admit(size)
            try:
                decoded = self._decoded(model, request, size, data)
            except BaseException:
                api.unadmit(size)
                raise
            result = await model.call_model(decoded, ctx, cancelled=RpcEnded(context), admitted=size)
            if isinstance(result, Stream):
                if streaming:
                    status = 0  # answered when the stream ends (`_chunks`)
                    return _Chunks(model, decoded, result, started)
                await result.aclose()
                raise BadRequest(
                    f"the model '{model.name}' generates (its predict yields): call ModelStreamInfer, which answers "
                    "one response per chunk"
                )
            try:
                outputs = model.outputs(result, decoded)
                if not streaming:
                    answer = self._writer(model).encode(decoded, outputs)
                    if answer is not None:
                        return answer
                return encode_infer(model.name, model.version, decoded, outputs)
            except TypeError as exc:
                raise model.not_encoded(ctx, exc) from None
        except asyncio.CancelledError:
            status = ClientDisconnected.status_code
            raise
        except HTTPError as exc:
            error = exc
            if request is MALFORMED:
                error = BadRequest(f"the request's {len(data or b'')} bytes are not an inference.ModelInferRequest")
            status = error.status_code
        except HTTPException as exc:  # user code's: its status and detail, as over HTTP
            error = _passed_on(exc)
            status = error.status_code
        except Exception as exc:
            status = 500
            logger.exception("api '%s': gRPC request %s failed", api.name if api is not None else "", request_id)
            error = HTTPError()
            error.__cause__ = exc
        finally:
            if token is not None:
                current.reset(token)
            if status and api is not None:
                api.metrics.answered(status, perf_counter() - started)
        if streaming:
            raise error
        await self._abort(context, error, request_id)

    def _request_id(self, request: Any, context: Any, metadata: dict[str, str] | None) -> str:
        """The call's request id: the request's ``id``, else its ``x-request-id`` metadata (from `metadata` when
        the caller has read it, else looked up without copying the rest), else a new one (`_new_id`)."""
        given = request.id
        if not given:
            if metadata is not None:
                given = metadata.get("x-request-id")
            else:
                for key, value in context.invocation_metadata() or ():
                    if key == "x-request-id" and isinstance(value, str):
                        given = value
                        break
        return sane_request_id(given) if given else self._new_id()

    def _writer(self, model: V2Model) -> RawAnswer:
        """The writer of `model`'s answers as bytes (the serializer passes them through: `server.written`)."""
        writers = self._writers
        writer = writers.get(model)
        if writer is None:
            if len(writers) >= 64:  # models replaced by repository loads: keep the table small
                writers.clear()
            writer = writers[model] = RawAnswer(model.name, model.version)
        return writer

    def _decoded(self, model: V2Model, request: Any, size: int, data: bytes | None) -> InferRequest:
        """`request`'s inputs, checked against `model`'s signature: the usual request through the signature's
        `RawPlan`, from `data`, its bytes on the wire (serialized here when a caller other than gRPC gave none),
        anything else (or anything wrong) through `decode_infer` and the check, which name the problem."""
        signature = model.signature()
        plans = self._plans
        plan: RawPlan | None = plans.get(signature, _UNPLANNED)
        if plan is _UNPLANNED:
            if len(plans) >= 64:  # signatures replaced by repository loads: keep the table small
                plans.clear()
            plan = plans[signature] = RawPlan.of(signature)
        if plan is not None:
            decoded = plan.decode(request.SerializeToString() if data is None else data)
            if decoded is not None:
                return decoded
        decoded = decode_infer(request, signature.text, size)
        signature.check(decoded)
        return decoded
