"""Per-request cost of modelserve against a bare Starlette route, without any network.

Calls each ASGI app directly in a loop with a fake scope, receive and send, so that the figures are the
framework's own work (routing, request id, limiter, pipeline, metrics, encoding) and nothing else::

    python benchmarks/asgi_overhead.py [--requests 50000] [--repeat 5]

Prints microseconds per request (the best of the repeats) for each app and the difference.
"""

from __future__ import annotations

import argparse
import asyncio
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


class Echo:
    async def predict(self, inputs: Any) -> Any:
        return inputs


async def bare_echo(request: Request) -> Response:
    body = orjson.loads(await request.body())
    return Response(orjson.dumps(body), media_type="application/json")


BODY = b'{"x": [1, 2, 3]}'
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
    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())],
    "client": ("127.0.0.1", 50000),
    "server": ("127.0.0.1", 8888),
}


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
    await served.server.wait_loaded()
    bare = Starlette(routes=[Route("/echo", bare_echo, methods=["POST"])])
    results: dict[str, list[float]] = {"bare starlette": [], "modelserve": []}
    for _ in range(repeat):
        results["bare starlette"].append(await per_request(bare, requests))
        results["modelserve"].append(await per_request(served, requests))
    best = {name: min(values) for name, values in results.items()}
    print(f"{'app':<16} {'us/request (best of ' + str(repeat) + ')':>26}")
    for name, value in best.items():
        print(f"{name:<16} {value:>26.2f}")
    print(f"{'difference':<16} {best['modelserve'] - best['bare starlette']:>26.2f}")
    await served.server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.requests, args.repeat))
