"""API keys: read once when the app is created, checked in constant time, required on every route but the probes.

Keys come from an environment variable (``auth: {api_keys_env: NAME}``, ``--api-key-env NAME``: keys
separated by commas or whitespace) or a file of the project (``auth: {api_keys_file: keys.txt}``: one key
per line, ``#`` starts a comment), never from modelserve.yaml itself. A request carries one as
``Authorization: Bearer <key>`` or ``X-API-Key: <key>`` (never in the URL: access logs write URLs).

Which routes need which key is decided once, from the route table, by `access_of`:

* the probes (``/healthz``, ``/readyz``, ``/v2/health/...``) are always open, for load balancers and
  orchestrators;
* ``/metrics`` takes an API key or a metrics key (``auth: {metrics_key_env: NAME}``), so that a Prometheus
  scraper need not hold an API key;
* every other route needs an API key, including the routes nobody listed here (V2, documentation, a
  route added later) and unknown paths (a 404 would tell a caller without a key which APIs exist). With
  ``auth: {apis: [...]}`` only the routes that belong to the other APIs alone are open: a route belongs to
  an API when its handlers are methods of an endpoint of that API (``handler.__self__.api``) and no path
  segment names a protected API, so a route of a protected API cannot be left open by a new kind of route.

A candidate key is hashed once (SHA-256) and its digest compared with every key's digest by
`hmac.compare_digest`, without stopping at the first match: the time taken says nothing about which key
was close, nor about the keys' lengths.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Callable, Iterable
from hashlib import sha256
from hmac import compare_digest
from pathlib import Path

from starlette.types import Scope

from modelserve.config import AuthConfig
from modelserve.errors import ConfigError, Unauthorized
from modelserve.http.routing import Route

#: Paths of the probes, open whatever the configuration.
PROBES = frozenset({"/healthz", "/readyz"})
PROBE_PREFIX = "/v2/health/"
METRICS_PATH = "/metrics"
# Visible ASCII but the separators of the environment variable and the comment sign of the file.
_KEY_RE = re.compile(r"^[\x21-\x7e]+$")
_ENV_SEPARATORS = re.compile(r"[\s,]+")


class Access(enum.Enum):
    """What a route asks of a request."""

    OPEN = "open"
    METRICS = "an API key or a metrics key"
    API_KEY = "an API key"


# Members bound once: looking one up on an Enum class costs about 0.15 us in Python 3.11, on every request.
_API_KEY = Access.API_KEY


class Refusal(enum.Enum):
    """Why a request was refused (the ``reason`` label of ``modelserve_auth_failures_total``)."""

    MISSING = "missing"
    INVALID = "invalid"

    def error(self, access: Access) -> Unauthorized:
        if self is Refusal.MISSING:
            return Unauthorized()
        return Unauthorized(f"the API key is not valid for this route (it needs {access.value})")


def is_probe(path: str) -> bool:
    return path in PROBES or path.startswith(PROBE_PREFIX)


#: The probes whose answers name the APIs (their states), and the scope key the guard tells them in which names
#: the request may read (`ApiKeys.shown_to`): the names of the APIs that need a key are a guarded API's secret.
NAMING_PROBES = frozenset({"/readyz", "/v2/health/ready"})
SHOWN = "modelserve.shown_apis"


def _every_name(name: str) -> bool:
    return True


def _no_name(name: str) -> bool:
    return False


def shown_states(scope: Scope, states: dict[str, str]) -> dict[str, str]:
    """The API states a probe's answer may show this request (`SHOWN`)."""
    shown = scope.get(SHOWN)
    return states if shown is None else {name: state for name, state in states.items() if shown(name)}


def named(names: list[str], hidden: int) -> str:
    """`names` for a probe's message, with the count of those it may not show: ``a, b and 2 APIs more``."""
    more = f"{hidden} API{'s' if hidden > 1 else ''}" + (" more" if names else "")
    return ", ".join(names) + (" and " if names and hidden else "") + (more if hidden else "")


class KeySet:
    """Keys kept as SHA-256 digests; `matches` compares a candidate with each of them in constant time."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = tuple(sha256(key.encode("ascii")).digest() for key in dict.fromkeys(keys))

    def __len__(self) -> int:
        return len(self._digests)

    def __add__(self, other: KeySet) -> KeySet:
        joined = KeySet(())
        joined._digests = tuple(dict.fromkeys(self._digests + other._digests))
        return joined

    def matches(self, candidate: bytes) -> bool:
        digest = sha256(candidate).digest()
        found = False
        for key in self._digests:  # every key, no early exit
            found |= compare_digest(digest, key)
        return found


def _checked(keys: list[str], source: str) -> list[str]:
    for number, key in enumerate(keys, 1):
        if not _KEY_RE.match(key) or "," in key or "#" in key:
            raise ConfigError(
                f"auth: key #{number} of {source} is not valid: a key is printable ASCII without spaces, ',' or '#'"
            )
    return keys


def keys_from_env(name: str, what: str) -> list[str]:
    """The keys in environment variable `name`; `ConfigError` (never showing a value) when there are none."""
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(f"auth: the environment variable {name} ({what}) is not set")
    keys = [key for key in _ENV_SEPARATORS.split(value) if key]
    if not keys:
        raise ConfigError(f"auth: the environment variable {name} ({what}) holds no key")
    return _checked(keys, f"the environment variable {name}")


def keys_from_file(path: Path) -> list[str]:
    """The keys of a keys file: one per line, blank lines and ``#`` comments skipped."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"auth: cannot read the API keys file {str(path)!r}: {type(exc).__name__}") from None
    keys = [line.partition("#")[0].strip() for line in text.splitlines()]
    keys = [key for key in keys if key]
    if not keys:
        raise ConfigError(f"auth: the API keys file {str(path)!r} holds no key")
    return _checked(keys, f"the file {str(path)!r}")


class ApiKeys:
    """The keys of an app and the access each route asks for."""

    def __init__(self, api_keys: KeySet, metrics_keys: KeySet, protected_apis: Iterable[str] | None) -> None:
        self.api_keys = api_keys
        self.metrics_keys = metrics_keys + api_keys
        self.protected_apis = None if protected_apis is None else frozenset(protected_apis)

    @classmethod
    def from_config(cls, auth: AuthConfig, root: Path) -> ApiKeys:
        """Read the keys `auth` names (now: when the app is created, not when modelserve is imported)."""
        api_keys: list[str] = []
        if auth.api_keys_env is not None:
            api_keys += keys_from_env(auth.api_keys_env, "the API keys")
        if auth.api_keys_file is not None:
            api_keys += keys_from_file(root / auth.api_keys_file)
        metrics_keys = []
        if auth.metrics_key_env is not None:
            metrics_keys = keys_from_env(auth.metrics_key_env, "the metrics keys")
        return cls(KeySet(api_keys), KeySet(metrics_keys), auth.apis)

    def access_of(self, route: Route | None, path: str) -> Access:
        """What a request to `path` (answered by `route`, None when no route has that path) must carry."""
        if is_probe(path):
            return Access.OPEN
        if path == METRICS_PATH:
            return Access.METRICS
        if not self.api_keys:
            return Access.OPEN  # only /metrics has keys
        if self.protected_apis is None or route is None:
            return Access.API_KEY
        segments = set(route.path.split("/"))
        owners = {getattr(getattr(handler, "__self__", None), "api", None) for handler in route.handlers.values()}
        names = {getattr(owner, "name", None) for owner in owners}
        if None in names or names & self.protected_apis or segments & self.protected_apis:
            return Access.API_KEY
        return Access.OPEN

    def shown_to(self, authorization: bytes | None, api_key: bytes | None) -> Callable[[str], bool]:
        """Which API names a probe may show a request with these headers: every one to a request with an API key
        (or when no API key is configured), else only those of the APIs ``auth.apis`` leaves open."""
        if not self.api_keys or self.check(_API_KEY, authorization, api_key) is None:
            return _every_name
        protected = self.protected_apis
        if protected is None:
            return _no_name
        return lambda name: name not in protected

    def check(self, access: Access, authorization: bytes | None, api_key: bytes | None) -> Refusal | None:
        """None when a request with these headers may go on, else why not."""
        keys = self.api_keys if access is _API_KEY else self.metrics_keys
        if api_key is not None and keys.matches(api_key.strip()):
            return None
        if authorization is not None and authorization[:7].lower() == b"bearer ":
            return None if keys.matches(authorization[7:].strip()) else Refusal.INVALID
        return Refusal.MISSING if api_key is None else Refusal.INVALID
