"""The guard in front of the route table: the Host check, CORS and API keys, as one small ASGI layer.

`ModelserveApp` hands every HTTP request to `Guard` instead of the table when any of the three is on (a
project without ``auth``, ``cors`` and a Host check pays nothing). In order:

1. **Host** (against DNS rebinding): a ``Host`` header that names no allowed host is a JSON 400. The check
   is on when the server is bound to a loopback address (the CLI's ``--host``, 127.0.0.1 by default: then
   only ``127.0.0.1``, ``localhost`` and ``[::1]``, any port, are answered) or when ``allowed_hosts`` is
   configured (Starlette's TrustedHostMiddleware rules: exact names, ``*.example.com``, ``*`` for any).
   Loopback names and the bind address itself are always allowed (a rebinding attack names the attacker's
   domain, never those; user code calls ``MODELSERVE_URL``). The probes are exempt: orchestrators address
   them by the pod's IP. An app created in-process (``create_app`` without ``host``) has no check unless
   ``allowed_hosts`` says so. A request with more than one ``Host`` header is a JSON 400 that closes the
   connection (RFC 9112, section 3.2: which one would the check read?), probes included; without a guard,
   modelserve's transport answers it (`more_than_one_host`, `modelserve.http._protocol`).
2. **CORS preflight** (`modelserve.http.cors`): answered here, before any key is asked for.
3. **API key** (`modelserve.http.auth`): 401 with ``WWW-Authenticate: Bearer``, counted in
   ``modelserve_auth_failures_total{reason="missing"|"invalid"}``. The open probes that name the APIs
   (``/readyz``, ``/v2/health/ready``) are told which names the request may read (`auth.SHOWN`).

Every answer, the guard's own errors included, goes out through the CORS wrapper, so that a page allowed
to call reads the 401 or the 503 it got. Measured cost (``benchmarks/asgi_overhead.py``): see
benchmarks/README.md.
"""

from __future__ import annotations

import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from modelserve.config import ProjectConfig
from modelserve.context import sane_request_id
from modelserve.errors import BadRequest
from modelserve.http._asgi import CLOSE, request_headers, without_body
from modelserve.http.access import answering
from modelserve.http.auth import NAMING_PROBES, SHOWN, Access, ApiKeys, Refusal, is_probe
from modelserve.http.cors import Cors
from modelserve.http.errors import send_error
from modelserve.http.routing import RouteTable, route_path
from modelserve.metrics import Metrics

_OPEN = Access.OPEN  # bound once: an Enum member lookup costs about 0.15 us in Python 3.11
#: Host names that always reach a loopback server.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
# Verdicts on raw Host values already seen, so that the usual one or two cost a dict lookup; bounded, since a
# client chooses the values.
_HOST_CACHE_SIZE = 256


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.1``, ``::1``, ``[::1]``)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str | None:
    """The host of a Host header, lowercased, brackets kept, without the port; None when it is malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, bracket, rest = value.partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return name + bracket
    name, colon, port = value.partition(":")
    if not name or (colon and not port.isdigit()):
        return None
    return name


def host_count(headers: list[tuple[bytes, bytes]]) -> int:
    """How many ``Host`` headers a request has (header names are lowercase in a scope)."""
    return sum(1 for name, _ in headers if name == b"host")


def two_hosts() -> BadRequest:
    """The answer to a request with more than one ``Host`` header; the connection is closed after it."""
    message = "more than one Host header: a request names one host (RFC 9112, section 3.2)"
    return BadRequest(message, headers=dict(CLOSE))


async def more_than_one_host(scope: Scope, receive: Receive, send: Send) -> None:
    """An ASGI app that answers `two_hosts` (the transport hands such a request to it instead of the app)."""
    await send_error(send, two_hosts(), request_headers(scope)[0])


class HostCheck:
    """The Host values answered: exact names and ``*.example.com`` suffixes (Starlette's rules)."""

    def __init__(self, patterns: list[str]) -> None:
        lowered = [pattern.lower() for pattern in patterns]
        self.names = frozenset(pattern for pattern in lowered if not pattern.startswith("*."))
        self.suffixes = tuple(pattern[1:] for pattern in lowered if pattern.startswith("*."))
        self._seen: dict[bytes, bool] = {}

    @classmethod
    def for_bind(cls, allowed_hosts: list[str] | None, host: str | None) -> HostCheck | None:
        """The check of a server bound to `host` (None: unknown), or None when every Host is answered."""
        if allowed_hosts is not None and "*" in allowed_hosts:
            return None
        if allowed_hosts is None and (host is None or not is_loopback(host)):
            return None
        names = [*(allowed_hosts or ()), *LOOPBACK_NAMES]
        if host is not None:
            names.append(f"[{host}]" if ":" in host and not host.startswith("[") else host)
        return cls(names)

    def allows(self, value: bytes | None) -> bool:
        if value is None:
            return False
        verdict = self._seen.get(value)
        if verdict is None:
            name = host_name(value.decode("latin-1"))
            verdict = name is not None and (name in self.names or name.endswith(self.suffixes))
            if len(self._seen) < _HOST_CACHE_SIZE:
                self._seen[value] = verdict
        return verdict


class Guard:
    """Host check, CORS and API keys in front of `app` (the route table)."""

    def __init__(
        self,
        app: ASGIApp,
        table: RouteTable,
        hosts: HostCheck | None,
        cors: Cors | None,
        keys: ApiKeys | None,
        metrics: Metrics,
    ) -> None:
        self.app = app
        self.table = table
        self.hosts = hosts
        self.cors = cors
        self.keys = keys
        self._access: dict[str, Access] = {}
        if keys is not None:
            self._access = {route.path: keys.access_of(route, route.path) for route in table.routes}
            self._missing = metrics.auth_failures.labels("missing")
            self._invalid = metrics.auth_failures.labels("invalid")
        #: The send of an answer the guard makes itself (a refusal, a preflight), which writes its access line.
        self._answering = answering()

    @classmethod
    def of(cls, app: ASGIApp, table: RouteTable, project: ProjectConfig, host: str | None, metrics: Metrics) -> ASGIApp:
        """`app` behind the guard the project asks for, or `app` itself when it asks for none."""
        hosts = HostCheck.for_bind(project.allowed_hosts, host)
        cors = Cors(project.cors) if project.cors is not None else None
        keys = ApiKeys.from_config(project.auth, project.root) if project.auth is not None else None
        if hosts is None and cors is None and keys is None:
            return app
        return cls(app, table, hosts, cors, keys, metrics)

    def access(self, path: str) -> Access:
        """What a request to `path` must carry: its route's access (decided once), or an unknown path's."""
        access = self._access.get(path)
        if access is None:
            assert self.keys is not None
            found = self.table.match(path)
            access = self.keys.access_of(None, path) if found is None else self._access[found[0].path]
        return access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope["headers"])  # one pass in C; the guard reads up to six of them
        path = scope["path"] if not scope.get("root_path") else route_path(scope)
        if scope["method"] == "HEAD":
            send = without_body(send)
        answer, origin = send, None  # a preflight's answer carries its own CORS headers; every other the policy's
        if self.cors is not None:  # first, so that a refused Host or two Hosts vary by Origin too
            origin = headers.get(b"origin")
            send = self.cors.send_for(send, origin)
        if len(headers) < len(scope["headers"]) and host_count(scope["headers"]) > 1:  # a name came twice
            await send_error(self._answering(scope, send), two_hosts(), _request_id(headers))
            return
        if self.hosts is not None and not self.hosts.allows(headers.get(b"host")) and not is_probe(path):
            error = BadRequest("this server does not answer for the Host of this request (see allowed_hosts)")
            await send_error(self._answering(scope, send), error, _request_id(headers))
            return
        if origin is not None and scope["method"] == "OPTIONS":
            method = headers.get(b"access-control-request-method")
            if method is not None:
                await self._preflight(self._answering(scope, answer), headers, origin, method)
                return
        if self.keys is not None:
            access = self._access.get(path) or self.access(path)
            if access is not _OPEN:
                refused = self.keys.check(access, headers.get(b"authorization"), headers.get(b"x-api-key"))
                if refused is not None:
                    (self._missing if refused is Refusal.MISSING else self._invalid).inc()
                    await send_error(self._answering(scope, send), refused.error(access), _request_id(headers))
                    return
            elif path in NAMING_PROBES:  # open, and its answer names the APIs: only those this request may know
                scope[SHOWN] = self.keys.shown_to(headers.get(b"authorization"), headers.get(b"x-api-key"))
        await self.app(scope, receive, send)

    async def _preflight(self, send: Send, headers: dict[bytes, bytes], origin: bytes, method: bytes) -> None:
        assert self.cors is not None
        private = headers.get(b"access-control-request-private-network") is not None
        try:
            answer = self.cors.preflight(origin, method, headers.get(b"access-control-request-headers"), private)
        except BadRequest as exc:
            await send_error(send, exc, _request_id(headers))
            return
        answer.append((b"x-request-id", _request_id(headers).encode()))
        await send({"type": "http.response.start", "status": 204, "headers": answer})
        await send({"type": "http.response.body", "body": b""})


def _request_id(headers: dict[bytes, bytes]) -> str:
    value = headers.get(b"x-request-id")
    return sane_request_id(None if value is None else value.decode("latin-1"))
