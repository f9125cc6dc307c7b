"""How far the machine's own speed moves while nothing here changes: the same pure-Python loop, timed again
and again on one CPU.

Every ratio the other benchmarks print compares servers that take turns on one core. When the core itself
runs the same instructions faster or slower from one second to the next (a shared host, frequency changes),
the turns see different machines, and a ratio moves by itself. This measures that drift directly: a loop of
fixed work (``--work`` additions, about 50 ms here) run back to back for ``--seconds``, pinned to ``--cpu``,
each run's time kept. Run it before and after a benchmark; the spread it prints is how much of a ratio one
round can owe to the machine:

    python benchmarks/machine_drift.py --seconds 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def chunk(work: int) -> float:
    """Seconds the loop of `work` additions took."""
    started = time.perf_counter()
    total = 0
    for i in range(work):
        total += i
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to keep timing (default 20)")
    parser.add_argument("--work", type=int, default=500_000, help="additions per timed loop (default 500000)")
    parser.add_argument("--cpu", type=int, default=0, help="the CPU to run on (default 0; -1: not pinned)")
    args = parser.parse_args()
    if args.cpu >= 0 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})
    chunk(args.work)  # warm
    times: list[float] = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        times.append(chunk(args.work) * 1000)
    times.sort()
    tenth = max(len(times) // 10, 1)
    print(f"{len(times)} loops of {args.work:,} additions on CPU {args.cpu}; load average {os.getloadavg()[0]:.2f}")
    print(
        f"ms a loop: min {times[0]:.1f}  p10 {times[tenth - 1]:.1f}  median {statistics.median(times):.1f}  "
        f"p90 {times[-tenth]:.1f}  max {times[-1]:.1f}"
    )
    print(f"slowest / fastest: {times[-1] / times[0]:.2f}x; p90 / p10: {times[-tenth] / times[tenth - 1]:.2f}x")


if __name__ == "__main__":
    main()
