"""A large invalid typed body: the time to its 400, how late the event loop runs meanwhile, the answer's size
and the process's peak memory, before and after validation was bounded (modelserve/schema.py).

Each case runs in a fresh process: a ``list[float]`` body of N strings (1,000,000 by default, 3.8 MiB of
JSON), decoded, then validated in a worker thread while the event loop runs a 1 ms ticker whose worst
lateness is what a /healthz request would have waited. ``before`` is the path modelserve took until then
(pydantic's lax validator, every error built by ``errors()`` and listed in the answer); ``after`` is
`modelserve.schema.TypedValue.validate`. A valid body of N floats is measured too, to show what bounding
costs the requests that pass::

    python benchmarks/validation.py [--items 1000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CASE = r"""
import asyncio, json, resource, sys, threading, time
import orjson, pydantic
from modelserve.errors import BadRequest
from modelserve.schema import TypedValue

mode, items, valid = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "valid"
body = orjson.dumps([1.5] * items if valid else ["x"] * items)
typed = TypedValue(list[float])
adapter = pydantic.TypeAdapter(list[float])


def before(value):
    try:
        return adapter.validate_python(value)
    except pydantic.ValidationError as exc:
        detail = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        listing = "; ".join(f"{'.'.join(map(str, d['loc']))}: {d['msg']}" for d in detail)
        return orjson.dumps({"error": listing, "detail": detail})


def after(value):
    try:
        return typed.validate(value)
    except BadRequest as exc:
        return orjson.dumps({"error": exc.message, **exc.extra})


async def main():
    value = orjson.loads(body)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    work = loop.run_in_executor(None, before if mode == "before" else after, value)
    late = 0.0
    while not work.done():
        tick = time.perf_counter()
        await asyncio.sleep(0.001)
        late = max(late, time.perf_counter() - tick - 0.001)
    answer = await work
    took = time.perf_counter() - started
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    size = len(answer) if isinstance(answer, bytes) else 0
    print(json.dumps({"seconds": took, "late": late, "answer": size, "rss_mib": rss / 1024}))

asyncio.run(main())
"""


def run(mode: str, items: int, valid: bool) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CASE, mode, str(items), "valid" if valid else "invalid"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    print(f"list[float], {options.items:,} items; median of {options.rounds} rounds, each case in a fresh process")
    print(f"{'body':8} {'path':7} {'to answer':>10} {'loop late (max)':>16} {'answer':>12} {'peak RSS +':>11}")
    for valid in (False, True):
        for mode in ("before", "after"):
            rounds = [run(mode, options.items, valid) for _ in range(options.rounds)]

            def median(key: str, rounds: list[dict[str, float]] = rounds) -> float:
                return statistics.median(result[key] for result in rounds)

            kind = "valid" if valid else "invalid"
            print(
                f"{kind:8} {mode:7} {median('seconds'):9.3f}s {median('late') * 1000:14.1f}ms "
                f"{median('answer') / 1024:10.1f}KiB {median('rss_mib'):8.0f}MiB"
            )


if __name__ == "__main__":
    main()
