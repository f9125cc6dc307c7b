"""Overhead of modelserve against a bare Starlette route doing the same work, under the same load.

Four servers, each its own uvicorn process with the same settings (httptools, uvloop when installed, access
log off, one worker) on a free loopback port:

* ``ms-async``: an echo Model whose ``predict`` is ``async``, served by ``python -m modelserve``;
* ``bare-async``: a Starlette route that reads the body, parses it with orjson and answers it with orjson;
* ``ms-sync``: the same echo Model with a sync ``predict`` (modelserve runs it in the thread pool);
* ``bare-sync``: the same route calling the echo through ``run_in_threadpool``;
* with ``--guard``, ``ms-guard``: ms-async with an API key, CORS and the Host check on (issue 20); then every
  server is sent the key (``X-API-Key``) and an allowed ``Origin``, and the bare routes ignore them;
* with ``--typed``, ``ms-typed``: ms-async whose ``predict`` takes and returns a pydantic model of the body
  (issue 17): the cost of validating the body and encoding the answer from the model.

wrk posts a small JSON body (a lua script) at each concurrency, a few seconds per run, the servers taking
turns; every cell is the median over the repeats. The ratio is modelserve's requests/s over the bare route's.
The server's CPU time per request is measured too: on a shared machine it is steadier than requests/s.

    python benchmarks/overhead.py [--duration 3] [--repeats 3] [--concurrency 1,16,64] [--pin] [--guard] [--typed]

``--pin`` (the default on machines with 2 or more cores) runs the servers on CPU 0 and wrk on CPU 1, so
that the load generator does not steal the server's core.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
from pathlib import Path

import httpx
from _harness import Run, ServerProcess, cpus, measure, median_run, write_wrk_script, wrk

BODY = '{"text": "hello world", "values": [1, 2, 3, 4], "flag": true}'
KEY = "overhead-key-" + "0" * 32
ORIGIN = "http://app.example"
GUARD_HEADERS = {"X-API-Key": KEY, "Origin": ORIGIN}

MS_ASYNC = """
class Model:
    async def predict(self, inputs):
        return inputs
"""

MS_TYPED = """
from pydantic import BaseModel


class Body(BaseModel):
    text: str
    values: list[int]
    flag: bool


class Model:
    async def predict(self, inputs: Body) -> Body:
        return inputs
"""

MS_SYNC = """
class Model:
    def predict(self, inputs):
        return inputs
"""

# max_concurrency above the highest load tested: the comparison is about per-request overhead, not about
# modelserve's backpressure (the thread pool, 40 threads, limits both sync servers alike).
MS_YAML = """
apis:
  - name: echo
    handler: {path: model.py}
    max_concurrency: 128
    max_queue_length: 1000
"""

GUARD_YAML = """
auth: {api_keys_env: OVERHEAD_API_KEYS}
cors: {allow_origins: ["http://app.example"]}
"""

BARE = """
import orjson
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


def echo(inputs):
    return inputs


async def echo_async(request: Request) -> Response:
    inputs = orjson.loads(await request.body())
    return Response(orjson.dumps(inputs), media_type="application/json")


async def echo_sync(request: Request) -> Response:
    inputs = orjson.loads(await request.body())
    result = await run_in_threadpool(echo, inputs)
    return Response(orjson.dumps(result), media_type="application/json")


async_app = Starlette(routes=[Route("/echo", echo_async, methods=["POST"])])
sync_app = Starlette(routes=[Route("/echo", echo_sync, methods=["POST"])])
"""


def uvicorn_settings() -> list[str]:
    try:
        import uvloop  # noqa: F401

        loop = "uvloop"
    except ImportError:
        loop = "asyncio"
    return ["--http", "httptools", "--loop", loop, "--no-access-log", "--log-level", "warning"]


def write_servers(root: Path, guard: bool, typed: bool = False) -> Path:
    """The projects, the bare app and the wrk script (returned)."""
    projects = [("ms_async", MS_ASYNC, ""), ("ms_sync", MS_SYNC, "")]
    if guard:
        projects.append(("ms_guard", MS_ASYNC, GUARD_YAML))
    if typed:
        projects.append(("ms_typed", MS_TYPED, ""))
    for name, model, extra in projects:
        project = root / name
        project.mkdir()
        (project / "model.py").write_text(textwrap.dedent(model).lstrip())
        (project / "modelserve.yaml").write_text(textwrap.dedent(MS_YAML).lstrip() + textwrap.dedent(extra).lstrip())
    (root / "bare.py").write_text(textwrap.dedent(BARE).lstrip())
    script = write_wrk_script(root / "post.lua", BODY)
    if not guard:
        return script
    # The same request with the key and the Origin, for every server alike.
    lines = [f'dofile("{script}")'] + [f'wrk.headers["{key}"] = "{value}"' for key, value in GUARD_HEADERS.items()]
    guarded = root / "post-guard.lua"
    guarded.write_text("\n".join(lines) + "\n")
    return guarded


def commands(root: Path, guard: bool, typed: bool = False) -> dict[str, list[str]]:
    settings = uvicorn_settings()
    modelserve = [sys.executable, "-m", "modelserve"]
    # modelserve's CLI runs uvicorn with its defaults (httptools and uvloop when installed, one worker).
    ms = ["--no-access-log", "--log-level", "warning"]
    bare = [sys.executable, "-m", "uvicorn", "--app-dir", str(root), *settings]
    servers = {
        "ms-async": [*modelserve, str(root / "ms_async"), *ms],
        "bare-async": [*bare, "bare:async_app"],
        "ms-sync": [*modelserve, str(root / "ms_sync"), *ms],
        "bare-sync": [*bare, "bare:sync_app"],
    }
    if guard:
        servers["ms-guard"] = [*modelserve, str(root / "ms_guard"), *ms]
    if typed:
        servers["ms-typed"] = [*modelserve, str(root / "ms_typed"), *ms]
    return servers


def answers_echo(url: str) -> bool:
    headers = {"content-type": "application/json", **GUARD_HEADERS}
    answer = httpx.post(url + "/echo", content=BODY, headers=headers, timeout=5)
    return answer.status_code == 200


def row(run: Run) -> str:
    return f"{run.rps:>9.0f}{run.p50_ms:>9.2f}{run.p99_ms:>9.2f}{run.cpu_us:>11.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=int, default=3, help="seconds per wrk run (default 3)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell; the median is shown (default 3)")
    parser.add_argument("--concurrency", default="1,16,64", help="wrk connections, comma-separated")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None, help="servers on CPU 0, wrk on 1")
    parser.add_argument("--guard", action="store_true", help="add ms-guard: ms-async with API keys, CORS, Host check")
    parser.add_argument("--typed", action="store_true", help="add ms-typed: ms-async validating a pydantic model")
    args = parser.parse_args()
    server_cpu, wrk_cpu = cpus(args.pin)
    levels = [int(c) for c in args.concurrency.split(",")]

    results: dict[tuple[str, int], list[Run]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        script = write_servers(root, args.guard, args.typed)
        os.environ["OVERHEAD_API_KEYS"] = KEY
        servers = [
            ServerProcess(name, command, root, server_cpu)
            for name, command in commands(root, args.guard, args.typed).items()
        ]
        try:
            for server in servers:
                server.wait_ready(answers_echo)
                wrk(server.url + "/echo", script, 16, 1.0, wrk_cpu)  # warm up
            for _ in range(args.repeats):
                for connections in levels:
                    for server in servers:  # the servers take turns, so drift hits them alike
                        run = measure(server, server.url + "/echo", script, connections, args.duration, wrk_cpu)
                        results.setdefault((server.name, connections), []).append(run)
        finally:
            for server in servers:
                server.stop()

    print(
        f"modelserve overhead: echo over HTTP, wrk {args.duration:g} s x {args.repeats} (median), "
        f"cpu={os.cpu_count()}, pinned={'yes' if server_cpu else 'no'}, python {sys.version.split()[0]}"
    )
    columns = f"{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'cpu us/req':>11}{'ratio':>8}"
    header = f"{'pair':<7}{'conc':>5}  {'server':<11}{columns}"
    print(header)
    print("-" * len(header))
    for pair in ("async", "sync"):
        for connections in levels:
            ms = median_run(results[(f"ms-{pair}", connections)])
            bare = median_run(results[(f"bare-{pair}", connections)])
            ratio = ms.rps / bare.rps
            print(f"{pair:<7}{connections:>5}  {'modelserve':<11}{row(ms)}{ratio:>7.2f}x")
            if pair == "async" and args.guard:
                guarded = median_run(results[("ms-guard", connections)])
                print(f"{'':<7}{'':>5}  {'ms+guard':<11}{row(guarded)}{guarded.rps / bare.rps:>7.2f}x")
            if pair == "async" and args.typed:
                typed = median_run(results[("ms-typed", connections)])
                print(f"{'':<7}{'':>5}  {'ms+typed':<11}{row(typed)}{typed.rps / bare.rps:>7.2f}x")
            print(f"{'':<7}{'':>5}  {'bare':<11}{row(bare)}")


if __name__ == "__main__":
    main()
