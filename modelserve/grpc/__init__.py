"""The Open Inference Protocol over gRPC (KServe V2, Triton's ``inference.GRPCInferenceService``) and the
``grpc.health.v1`` health service, served beside HTTP in the same process (``modelserve --grpc-port PORT``).

Needs the ``grpc`` extra (grpcio, grpcio-health-checking, protobuf)::

    from modelserve.grpc import attach
    attach(app.server, "127.0.0.1", 8001)     # started and stopped with the app's server

`modelserve.grpc.server` holds the server, `modelserve.grpc.servicer` the service's methods,
`modelserve.grpc.codec` the tensors and `modelserve.grpc.health` the health service; the protocol's .proto
files and their generated modules are vendored in `modelserve.grpc._proto`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from modelserve.errors import MissingExtraError

if TYPE_CHECKING:
    from modelserve.grpc.server import GrpcServer
    from modelserve.server import ModelServer

__all__ = ["attach", "require"]


def require() -> None:
    """`MissingExtraError` with the pip command when the ``grpc`` extra is not installed."""
    try:
        import google.protobuf  # noqa: F401
        import grpc  # noqa: F401
        import grpc_health.v1  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError(exc.name or "grpcio", "grpc") from None


def attach(server: ModelServer, host: str, port: int, **tls: Any) -> GrpcServer:
    """Serve `server`'s APIs over gRPC on ``host:port`` too, from when it starts until it closes (TLS:
    ``certfile=``, ``keyfile=``); returns the `GrpcServer` (its ``port`` is the bound one once started)."""
    require()
    from modelserve.grpc.server import attach as attach_server

    return attach_server(server, host, port, **tls)
