"""CORS: which web pages may call the server from a browser, with the rules of Starlette's CORSMiddleware.

A preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) is answered here without
running anything and without asking for a key (browsers never send one with a preflight): 204 with the
``Access-Control-*`` headers, or a JSON 400 naming what was refused (origin, method, headers, private
network). Every other answer to a request, error answers included, gets its headers from `Cors.send_for`, a
wrapper that adds them to ``http.response.start``.

The rules are Starlette's (``starlette/middleware/cors.py``): an origin is allowed when it is listed (exact
match) or the list holds ``*``; ``*`` answers ``Access-Control-Allow-Origin: *`` unless credentials are
allowed, when the origin is echoed; ``Content-Type``, ``Accept``, ``Accept-Language`` and
``Content-Language`` are always allowed request headers. The differences, on purpose: a successful
preflight is a 204 without a body (Starlette: 200 ``OK``) and a refused one the usual JSON error; a listed
origin that is refused gets no ``Access-Control-*`` header at all; with listed origins every answer says
``Vary: Origin``, with or without an ``Origin`` in the request, so that a cache never hands a page an answer
made for another origin (added as a header line of its own, which HTTP reads as one list with the others);
and modelserve's own answer headers, ``X-Request-ID`` (what error bodies and logs name) and
``Inference-Header-Content-Length`` (where a V2 binary answer's JSON ends), are always exposed, before the
``expose_headers`` of the policy (Starlette: none), so that a page can read them.
"""

from __future__ import annotations

from starlette.types import Message, Send

from modelserve.config import CORS_METHODS, CorsConfig
from modelserve.errors import BadRequest

#: Answer headers a page may always read: the request id, and the length of a V2 binary answer's JSON header.
EXPOSED_HEADERS = ("X-Request-ID", "Inference-Header-Content-Length")
#: Request headers a page may always send (the CORS safelist), lowercased.
SAFELISTED_HEADERS = frozenset({"accept", "accept-language", "content-language", "content-type"})
_PREFLIGHT_VARY = ", ".join(
    [
        "Origin",
        "Access-Control-Request-Method",
        "Access-Control-Request-Headers",
        "Access-Control-Request-Private-Network",
    ]
)
_VARY_ORIGIN = (b"vary", b"Origin")

Headers = list[tuple[bytes, bytes]]


class Cors:
    """The CORS policy of an app (``cors:`` in modelserve.yaml, ``--cors-origin``)."""

    def __init__(self, config: CorsConfig) -> None:
        self.allow_all_origins = "*" in config.allow_origins
        self.origins = frozenset(origin for origin in config.allow_origins if origin != "*")
        self.methods = CORS_METHODS if "*" in config.allow_methods else tuple(dict.fromkeys(config.allow_methods))
        self.allow_all_headers = "*" in config.allow_headers
        headers = sorted({name.lower() for name in config.allow_headers if name != "*"} | SAFELISTED_HEADERS)
        self.allow_headers = frozenset(headers)
        self.credentials = config.allow_credentials
        self.private_network = config.allow_private_network
        # Answers to a request whose Origin is allowed: what Starlette's simple_headers add, then the origin.
        common: Headers = []
        if self.credentials:
            common.append((b"access-control-allow-credentials", b"true"))
        exposed: dict[str, str] = {}
        for name in (*EXPOSED_HEADERS, *config.expose_headers):
            exposed.setdefault(name.lower(), name)
        common.append((b"access-control-expose-headers", ", ".join(exposed.values()).encode("latin-1")))
        self._common = common
        self._any_origin: Headers = [(b"access-control-allow-origin", b"*"), *common, _VARY_ORIGIN]
        self._by_origin = {origin.encode("latin-1"): self._allow(origin.encode("latin-1")) for origin in self.origins}
        self._refused: Headers = [_VARY_ORIGIN]
        # A fixed answer without Origin: "*" is the same for everyone; a list varies by origin.
        self._no_origin: Headers = [] if self.allow_all_origins else [_VARY_ORIGIN]
        self._preflight: dict[str, str] = {"Vary": _PREFLIGHT_VARY}
        if self.allow_all_origins and not self.credentials:
            self._preflight["Access-Control-Allow-Origin"] = "*"
        self._preflight["Access-Control-Allow-Methods"] = ", ".join(self.methods)
        self._preflight["Access-Control-Max-Age"] = str(config.max_age)
        if not self.allow_all_headers:
            names = {name for name in config.allow_headers if name != "*"}
            names |= {"Accept", "Accept-Language", "Content-Language", "Content-Type"}
            self._preflight["Access-Control-Allow-Headers"] = ", ".join(sorted(names, key=str.lower))
        if self.credentials:
            self._preflight["Access-Control-Allow-Credentials"] = "true"

    def _allow(self, origin: bytes) -> Headers:
        return [(b"access-control-allow-origin", origin), *self._common, _VARY_ORIGIN]

    def allows(self, origin: bytes) -> bool:
        return self.allow_all_origins or origin.decode("latin-1") in self.origins

    def headers_for(self, origin: bytes | None) -> Headers:
        """The ``Access-Control-*`` and ``Vary`` headers of an answer to a request from `origin`."""
        if origin is None:
            return self._no_origin
        if self.allow_all_origins:
            if self.credentials:  # the origin itself: a credentialed answer cannot say "*"
                return self._allow(origin)
            return self._any_origin
        return self._by_origin.get(origin, self._refused)

    def send_for(self, send: Send, origin: bytes | None) -> Send:
        """`send` with this policy's headers added to the answer's ``http.response.start``."""
        extra = self.headers_for(origin)
        if not extra:
            return send

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *extra]  # a new list: the sender may keep its own
            await send(message)

        return send_with_cors

    def preflight(self, origin: bytes, method: bytes, requested: bytes | None, private: bool) -> Headers:
        """The headers of a 204 that allows this preflight, or `BadRequest` naming what is refused."""
        headers = dict(self._preflight)
        failures = []
        if self.allows(origin):
            if not self.allow_all_origins or self.credentials:
                headers["Access-Control-Allow-Origin"] = origin.decode("latin-1")
        else:
            failures.append("origin")
        if method.decode("latin-1") not in self.methods:
            failures.append("method")
        if self.allow_all_headers and requested is not None:
            headers["Access-Control-Allow-Headers"] = requested.decode("latin-1")
        elif requested is not None:
            names = (name.strip() for name in requested.decode("latin-1").lower().split(","))
            if any(name and name not in self.allow_headers for name in names):
                failures.append("headers")
        if private:
            if self.private_network:
                headers["Access-Control-Allow-Private-Network"] = "true"
            else:
                failures.append("private network")
        if failures:
            raise BadRequest(f"CORS preflight refused: {', '.join(failures)} not allowed", headers=headers)
        return [(key.lower().encode("latin-1"), value.encode("latin-1")) for key, value in headers.items()]
