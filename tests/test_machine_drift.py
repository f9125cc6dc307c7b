"""benchmarks/machine_drift.py runs as docs/performance.md shows it, and prints the spread it promises."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "machine_drift.py"


def test_the_drift_probe_times_its_loops_and_prints_their_spread() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "0.3", "--work", "20000", "--cpu", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    head, times, spread = done.stdout.strip().splitlines()
    loops = int(head.split()[0])
    assert loops > 1 and "20,000 additions" in head
    values = [float(value) for value in re.findall(r"(?:min|p10|median|p90|max) ([0-9.]+)", times)]
    assert len(values) == 5 and values == sorted(values) and values[0] > 0
    slowest = float(re.search(r"slowest / fastest: ([0-9.]+)x", spread).group(1))  # type: ignore[union-attr]
    assert slowest >= 1.0
