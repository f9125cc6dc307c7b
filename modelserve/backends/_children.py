"""Worker processes that user code starts are stopped with the API that started them.

A model may start processes of its own (a ``ProcessPoolExecutor`` for CPU-bound preprocessing, a
``subprocess.Popen`` of a helper server); left alone they outlive the server. `Children` notes this
process's children when an API starts loading, and its `stop` ends those started since, when the API closes:
SIGTERM, then SIGKILL to any still running after a grace period. Only direct children of this process are
touched, and only:

* those started with `multiprocessing` (a pool's workers: `multiprocessing.active_children`), always;
* any other child (``subprocess``, ``os.fork``) only in a process that the modelserve command runs, where
  every process started after loading began is user code's; a program that embeds modelserve keeps its own.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

logger = logging.getLogger("modelserve")

#: Seconds the children get to exit after SIGTERM before SIGKILL.
GRACE = 5.0


def child_pids() -> set[int]:
    """The running (not yet exited) direct children of this process."""
    pids = {process.pid for process in multiprocessing.active_children() if process.pid is not None}
    if _served_by_cli():
        pids |= _proc_children()
    return {pid for pid in pids if _running(pid)}


def _proc_children() -> set[int]:
    """Every direct child, read from /proc (Linux); none elsewhere."""
    me = os.getpid()
    found: set[int] = set()
    tasks = Path(f"/proc/{me}/task")
    try:
        for task in tasks.iterdir():
            try:
                found.update(int(pid) for pid in (task / "children").read_text().split())
            except OSError:
                return found | _scan_proc(me)
    except OSError:
        return found
    return found


def _scan_proc(parent: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == parent:
                found.add(int(entry.name))
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (an exited child that its parent has not reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    return state not in ("Z", "X")


def _served_by_cli() -> bool:
    """This process runs the modelserve command (``modelserve``, ``python -m modelserve``, or one of their
    worker processes, which keep the parent's main module and argv)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(spec, "name", None) in ("modelserve.__main__", "modelserve.cli"):
        return True
    return bool(sys.argv) and Path(sys.argv[0]).name == "modelserve"


class Children:
    """The children an API's user code starts: `note` before it runs, `stop` when the API closes."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.before: set[int] | None = None

    def note(self) -> None:
        if self.before is None:
            self.before = child_pids()

    def stop(self) -> list[int]:
        """End the children started since `note`; returns their PIDs."""
        if self.before is None:
            return []
        started = sorted(child_pids() - self.before)
        if not started:
            return []
        logger.info("%s: stopping %d process(es) its code started: %s", self.label, len(started), started)
        for pid in started:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE
        while time.monotonic() < deadline and any(_running(pid) for pid in started):
            time.sleep(0.02)
        for pid in started:
            if _running(pid):
                logger.warning("%s: process %d did not exit on SIGTERM; killed", self.label, pid)
                _signal(pid, signal.SIGKILL)
        return started


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass  # exited meanwhile
