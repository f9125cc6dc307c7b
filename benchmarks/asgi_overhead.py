"""Per-request cost of modelserve against a bare Starlette route, without any network.

Calls each ASGI app directly in a loop with a fake scope, receive and send, so that the figures are the
framework's own work (routing, request id, limiter, pipeline, metrics, encoding) and nothing else::

    python benchmarks/asgi_overhead.py [--requests 50000] [--repeat 5]

Prints microseconds per request (the best of the repeats) for each app and the difference. The row
``modelserve+guard`` is the same app with an API key, CORS and the Host check on (`modelserve.http.guard`),
every request carrying its key, an allowed Origin and a loopback Host: what they cost per request, against
the bare route. Every app gets the same headers. On a busy machine the difference of two ~10 us figures is
noisy, so the guard is also timed alone, in front of an app that only sends a fixed answer (``guard alone``
against ``no-op app``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import modelserve  # noqa: E402
from modelserve.http.guard import Guard  # noqa: E402


class Echo:
    async def predict(self, inputs: Any) -> Any:
        return inputs


async def bare_echo(request: Request) -> Response:
    body = orjson.loads(await request.body())
    return Response(orjson.dumps(body), media_type="application/json")


BODY = b'{"x": [1, 2, 3]}'
KEY = "benchmark-key-" + "0" * 32
ORIGIN = "http://app.example"
SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/echo",
    "raw_path": b"/echo",
    "root_path": "",
    "query_string": b"",
    "headers": [
        (b"host", b"127.0.0.1:8888"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(BODY)).encode()),
        (b"origin", ORIGIN.encode()),
        (b"x-api-key", KEY.encode()),
    ],
    "client": ("127.0.0.1", 50000),
    "server": ("127.0.0.1", 8888),
}


async def noop(scope: Any, receive: Any, send: Any) -> None:
    """An app that answers without reading anything: what is left is the caller's own cost."""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def receive() -> dict[str, Any]:
    return {"type": "http.request", "body": BODY, "more_body": False}


async def send(message: dict[str, Any]) -> None:
    return None


async def per_request(app: Any, requests: int) -> float:
    """Microseconds per request of `requests` sequential calls."""
    started = time.perf_counter()
    for _ in range(requests):
        await app(dict(SCOPE), receive, send)
    return (time.perf_counter() - started) / requests * 1e6


async def main(requests: int, repeat: int) -> None:
    served = modelserve.create_app(handler=Echo, name="echo")
    os.environ["BENCHMARK_API_KEYS"] = KEY
    guarded = modelserve.create_app(
        handler=Echo, name="echo", host="127.0.0.1", api_key_env="BENCHMARK_API_KEYS", cors_origins=[ORIGIN]
    )
    for app in (served, guarded):
        await app.server.wait_loaded()
    bare = Starlette(routes=[Route("/echo", bare_echo, methods=["POST"])])
    edge = guarded._edge
    assert isinstance(edge, Guard)
    alone = Guard(noop, guarded.table, edge.hosts, edge.cors, edge.keys, guarded.server.metrics)
    apps: dict[str, Any] = {
        "bare starlette": bare,
        "modelserve": served,
        "modelserve+guard": guarded,
        "no-op app": noop,
        "guard alone": alone,
    }
    results: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(repeat):
        for name, timed in apps.items():
            results[name].append(await per_request(timed, requests))
    best = {name: min(values) for name, values in results.items()}
    print(f"{'app':<18} {'us/request (best of ' + str(repeat) + ')':>26} {'vs bare':>8}")
    for name, value in best.items():
        print(f"{name:<18} {value:>26.2f} {value / best['bare starlette']:>7.2f}x")
    for name, guard in (
        ("modelserve+guard - modelserve", best["modelserve+guard"] - best["modelserve"]),
        ("guard alone - no-op app", best["guard alone"] - best["no-op app"]),
    ):
        print(f"{name:<30} {guard:>6.2f} us = {guard / best['bare starlette']:>6.1%} of the bare route")
    for app in (served, guarded):
        await app.server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.repeat))
