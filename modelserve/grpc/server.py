"""The gRPC server of a `ModelServer`, started and stopped with it in the same process as the HTTP server.

`GrpcServer` is a companion of the model server (`ModelServer.companions`): the model server starts it on
its event loop when it starts loading, and stops it when it closes. It serves

* ``inference.GRPCInferenceService`` (`modelserve.grpc.servicer`), registered from the service's descriptor:
  the methods modelserve implements; the others (shared memory, trace and log settings) answer
  UNIMPLEMENTED;
* ``grpc.health.v1.Health`` for Kubernetes probes (`modelserve.grpc.health`): NOT_SERVING until every API is
  ready, then SERVING, for the server (``""``), for ``inference.GRPCInferenceService`` and for each API by name.

Messages larger than the largest ``max_body_size`` of the APIs are refused by gRPC itself
(RESOURCE_EXHAUSTED); each API's own limit is checked by the servicer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2

from modelserve import devices
from modelserve.errors import LoadError
from modelserve.grpc._proto import grpc_service_pb2 as pb
from modelserve.grpc.health import NOT_SERVING, SERVING, Health
from modelserve.grpc.servicer import MALFORMED, InferenceServicer
from modelserve.http.auth import ApiKeys
from modelserve.server import ModelServer

if TYPE_CHECKING:
    from modelserve.grpc.tracing import TracedCalls

logger = logging.getLogger("modelserve")

SERVICE = "inference.GRPCInferenceService"
#: How often, with ``--workers N``, a worker reads whether every worker has loaded (for the health service).
WORKERS_POLL_S = 0.5


#: The methods whose requests come with their size on the wire (`sized`).
SIZED = frozenset({"ModelInfer", "ModelStreamInfer"})


def sized(parse: Callable[[bytes], Any]) -> Callable[[bytes], tuple[Any, bytes]]:
    """A request deserializer that gives the message with its bytes on the wire: their length is the size the
    servicer checks against the API's ``max_body_size`` and admits (the message's own ``ByteSize()`` serializes
    it again to count it: 176 us for 1 MiB of raw contents, 18.6 ms for 16 MiB, where parsing it took 81 us and
    3.5 ms), and the usual request's inputs are read from them (`modelserve.grpc.codec.RawPlan`)."""

    def deserialize(data: bytes) -> tuple[Any, bytes]:
        try:
            return parse(data), data
        except DecodeError:  # not a message: the servicer's INVALID_ARGUMENT (gRPC's own is UNKNOWN and a traceback)
            return MALFORMED, data

    return deserialize


def parsed(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """A request deserializer that gives None for bytes that are not a message (`refusing` answers them)."""

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError:
            return None

    return deserialize


def refusing(function: Callable[[Any, Any], Any], message: str) -> Callable[[Any, Any], Any]:
    """A method that answers INVALID_ARGUMENT for a request that `parsed` could not parse."""

    async def method(request: Any, context: Any) -> Any:
        if request is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not an inference.{message}")
        return await function(request, context)

    return method


#: The methods whose answers may come as their message's bytes already (`written`).
WRITTEN = frozenset({"ModelInfer"})


def written(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """A response serializer that passes an answer given as bytes through: ModelInfer writes the usual answer's
    bytes itself (`modelserve.grpc.codec.RawAnswer`), and answers a message otherwise."""

    def serialize_or_pass(answer: Any) -> bytes:
        return answer if type(answer) is bytes else serialize(answer)

    return serialize_or_pass


def inference_handler(servicer: InferenceServicer, traced: TracedCalls | None = None) -> grpc.GenericRpcHandler:
    """The service's methods that `servicer` implements, by the descriptor of the vendored proto; with `traced`
    (tracing on), those that run an API in their server spans."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    methods = {}
    for method in service.methods:
        function = getattr(servicer, method.name, None)
        if function is None:
            continue
        request, response = getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)
        if method.name in SIZED:
            deserialize = sized(request.FromString)
        else:
            deserialize, function = parsed(request.FromString), refusing(function, method.input_type.name)
        serialize = written(response.SerializeToString) if method.name in WRITTEN else response.SerializeToString
        if method.client_streaming:
            make = grpc.stream_stream_rpc_method_handler
        else:
            make = grpc.unary_unary_rpc_method_handler
        if traced is not None:
            function = traced.wrap(method.name, function, method.client_streaming)
        methods[method.name] = make(function, request_deserializer=deserialize, response_serializer=serialize)
    return grpc.method_handlers_generic_handler(service.full_name, methods)


def health_handler(health: Health) -> grpc.GenericRpcHandler:
    """``grpc.health.v1.Health``'s methods, whose requests `parsed` reads (`Health` refuses what is not one)."""
    request, response = health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
    options = {"request_deserializer": parsed(request.FromString), "response_serializer": response.SerializeToString}
    methods = {
        "Check": grpc.unary_unary_rpc_method_handler(health.Check, **options),
        "Watch": grpc.unary_stream_rpc_method_handler(health.Watch, **options),
    }
    return grpc.method_handlers_generic_handler("grpc.health.v1.Health", methods)


class GrpcServer:
    """Serves a model server's APIs over gRPC on ``host:port`` (TLS with a certificate and its key)."""

    def __init__(
        self,
        server: ModelServer,
        host: str,
        port: int,
        *,
        certfile: str | None = None,
        keyfile: str | None = None,
    ) -> None:
        self.server = server
        self.host = host
        self.port = port
        self.certfile, self.keyfile = certfile, keyfile
        auth = server.project.auth
        keys = ApiKeys.from_config(auth, server.project.root) if auth is not None else None
        self.servicer = InferenceServicer(server, keys)
        self.health = Health(self.servicer.refusal if self.servicer.keys is not None else None, ("", SERVICE))
        server.repository.on_change.append(self.refresh)
        self._grpc: grpc.aio.Server | None = None
        self._watching: asyncio.Task[None] | None = None
        #: What the health service last said of the server as a whole.
        self._serving = False

    async def start(self) -> None:
        """Bind and serve; `LoadError` when the port cannot be bound."""
        limit = self.servicer.max_message
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", -1),
            ]
        )
        traced = None
        if self.server.project.tracing:  # imported only when tracing is on, as `modelserve.tracing` is
            from modelserve.grpc.tracing import TracedCalls

            traced = TracedCalls(SERVICE, self.host, self.port)
        server.add_generic_rpc_handlers((inference_handler(self.servicer, traced), health_handler(self.health)))
        await self._set_health()
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        try:
            if self.certfile is not None:
                with open(self.certfile, "rb") as cert:
                    chain = cert.read()
                with open(self.keyfile or self.certfile, "rb") as key:
                    private = key.read()
                bound = server.add_secure_port(address, grpc.ssl_server_credentials([(private, chain)]))
            else:
                bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            raise LoadError(f"gRPC: cannot listen on {address}: {exc}") from None
        if not bound:
            raise LoadError(f"gRPC: cannot listen on {address}")
        self.port = bound
        if traced is not None:
            traced.port = bound
        await server.start()
        self._grpc = server
        self._watching = asyncio.get_running_loop().create_task(self._follow_loading())
        logger.info("gRPC: serving on %s%s", address.rsplit(":", 1)[0], f":{bound}")

    async def _follow_loading(self) -> None:
        await self.server.wait_loaded()
        await self._set_health()
        if devices.workers_loaded()[1] > 1:
            # With --workers N the server is ready once every worker has loaded (as /readyz and ServerReady say),
            # and not while a dead worker's replacement loads: followed for the process's life.
            while True:
                await asyncio.sleep(WORKERS_POLL_S)
                if self.server.workers_ready()[0] != self._serving:
                    await self._set_health()

    async def _set_health(self) -> None:
        """The health service's statuses, from the APIs' readiness now (the server's: in every worker)."""
        ready = self._serving = self.server.workers_ready()[0]
        for service in ("", SERVICE):
            await self.health.set(service, SERVING if ready else NOT_SERVING)
        for name in self.servicer.names():
            ready = self.servicer.model(name, "").api.ready
            await self.health.set(name, SERVING if ready else NOT_SERVING)

    async def stop(self, grace: float | None = None) -> None:
        """Stop taking calls; the running ones get `grace` seconds to finish."""
        if self._watching is not None:
            self._watching.cancel()
        if self._grpc is not None:
            await self.health.enter_graceful_shutdown()
            await self._grpc.stop(grace)
            self._grpc = None

    async def refresh(self) -> None:
        """Follow a change of the APIs' readiness (a model loaded or unloaded)."""
        await self._set_health()


def attach(server: ModelServer, host: str, port: int, **tls: Any) -> GrpcServer:
    """Serve `server`'s APIs over gRPC too, from when it starts until it closes."""
    grpc_server = GrpcServer(server, host, port, **tls)
    server.companions.append(grpc_server)
    return grpc_server
