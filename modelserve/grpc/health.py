"""The standard ``grpc.health.v1.Health`` service (Kubernetes' gRPC probes, grpc_health_probe, Envoy).

`Health` holds a status per service name, which `modelserve.grpc.server` sets from the APIs' readiness, and
answers the protocol's two methods:

* ``Check``: the name's status, or NOT_FOUND naming it;
* ``Watch``: the name's status now and at each change, SERVICE_UNKNOWN for a name it does not hold (the
  protocol's answer: the name may appear later), for as long as the caller listens.

With API keys on, a name other than the server's own (``""``, the inference service's) needs the key its
model needs, and so does a name that is no model's: UNAUTHENTICATED without it, so that the health service
tells a caller without a key no guarded model's name (the inference service's ``ModelReady`` does the same).

grpcio-health-checking's own servicer is not used: when one of two callers watching the same name leaves, it
forgets the name's watchers, and the other is never told of a change again. Its messages are. A request
whose bytes are not a ``HealthCheckRequest`` reaches the methods as None (`modelserve.grpc.server.parsed`)
and is INVALID_ARGUMENT, not gRPC's UNKNOWN.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
#: The longest service name quoted in a message (the caller's text).
SHOWN = 80
NOT_A_REQUEST = "the request is not a grpc.health.v1.HealthCheckRequest"


class Health:
    """The health service's statuses by service name, and its methods."""

    def __init__(self, refusal: Callable[[Any, str], str | None] | None = None, open_names: Iterable[str] = ()) -> None:
        self._statuses: dict[str, int] = {}
        #: With API keys on, why a call may not ask for a name (`InferenceServicer.refusal`), except `open_names`
        #: (the server's own): a call without a key learns no guarded model's name.
        self._refusal = refusal
        self._open_names = frozenset(open_names)
        #: Set and replaced at each change, so that every watcher wakes (`Watch`).
        self._changed = asyncio.Event()
        self._shutting_down = False

    async def set(self, service: str, status: int) -> None:
        """Set `service`'s status (ignored once the server is shutting down: every name is NOT_SERVING)."""
        if not self._shutting_down and self._statuses.get(service) != status:
            self._statuses[service] = status
            self._notify()

    async def enter_graceful_shutdown(self) -> None:
        """Every name NOT_SERVING from now on, whatever is set later."""
        self._shutting_down = True
        for service in self._statuses:
            self._statuses[service] = NOT_SERVING
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _authorize(self, service: str, context: Any) -> None:
        if self._refusal is not None and service not in self._open_names:
            refused = self._refusal(context, service)
            if refused is not None:
                await context.abort(grpc.StatusCode.UNAUTHENTICATED, refused)

    async def Check(self, request: Any, context: Any) -> Any:  # noqa: N802 - the protocol's names
        if request is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, NOT_A_REQUEST)
        service = request.service
        await self._authorize(service, context)
        status = self._statuses.get(service)
        if status is None:
            shown = service if len(service) <= SHOWN else service[:SHOWN] + "..."
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service '{shown}'")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        if request is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, NOT_A_REQUEST)
        service = request.service
        await self._authorize(service, context)
        last = None
        while True:
            changed = self._changed
            status = self._statuses.get(service, SERVICE_UNKNOWN)
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await changed.wait()
