"""Device placement: which GPU (or the CPU) each API uses in each worker process.

An API's ``devices`` (``[0, 1]``, or ``auto`` for every visible GPU, the default) is spread over the processes
of ``--workers N``: the worker in slot *i* uses ``devices[i mod n]``. uvicorn does not number its workers, so
each process takes its slot itself, when it first needs it (loading its first API): the lowest free one among
lock files in a folder the parent made for them (``MODELSERVE_SLOTS_DIR``). The lock is held for the process's
life, so a worker that dies frees its slot for the one that replaces it. A lone process is slot 0. A worker that
has loaded its project says so in the same folder (`mark_loaded`), so that every worker's ``/readyz`` can
answer for all of them (`workers_loaded`).

Without a GPU, ``auto`` is the CPU. GPU ids count the GPUs this process sees (``CUDA_VISIBLE_DEVICES``
renumbers them, as CUDA and every framework do).

User code reads its device with `modelserve.device()` (or the constructor argument ``device``)::

    class Model:
        def load(self):
            self.model = torch.jit.load("model.pt").to(modelserve.device())   # "cuda:1", or "cpu"
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("modelserve")

#: The folder of the slot lock files, set by the CLI's parent process for ``--workers`` > 1.
SLOTS_ENV = "MODELSERVE_SLOTS_DIR"
#: How many worker processes the CLI's parent starts (``--workers N``), set beside ``MODELSERVE_SLOTS_DIR``.
WORKERS_ENV = "MODELSERVE_WORKERS"
#: What ``devices`` means when an API does not say.
AUTO = "auto"


@dataclass(frozen=True)
class Device:
    """Where one API runs in this process: a GPU id, or None for the CPU."""

    gpu: int | None = None

    @property
    def name(self) -> str:
        """``cuda:<id>`` or ``cpu``: the string torch and most frameworks take."""
        return "cpu" if self.gpu is None else f"cuda:{self.gpu}"

    def __str__(self) -> str:
        return self.name


CPU = Device()

_lock = threading.Lock()
_slot: int | None = None
_slot_file: Any = None  # the open, locked file: kept for the process's life


def worker_slot() -> int:
    """This process's slot among the workers of ``--workers N`` (0 for a lone process), taken once."""
    global _slot, _slot_file
    if _slot is not None:
        return _slot
    with _lock:
        if _slot is None:
            folder = os.environ.get(SLOTS_ENV)
            _slot, _slot_file = (0, None) if not folder else _take_slot(Path(folder))
    return _slot


def _take_slot(folder: Path) -> tuple[int, Any]:
    import fcntl

    index = 0
    while True:
        handle = open(folder / f"slot-{index}.lock", "a+")  # noqa: SIM115 - held open for the process's life
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            index += 1
            continue
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        return index, handle


def mark_loaded() -> None:
    """Note, for the other workers of ``--workers N``, that this one has loaded its project (nothing in a lone
    process): ``loaded-<slot>`` holds the pid that its slot's lock file holds."""
    folder = os.environ.get(SLOTS_ENV)
    if not folder:
        return
    slot = worker_slot()
    note = Path(folder) / f"loaded-{slot}"
    partial = note.with_name(f"{note.name}.{os.getpid()}")
    partial.write_text(str(os.getpid()))
    partial.replace(note)  # a reader sees the whole note or the last one


def workers_loaded() -> tuple[int, int]:
    """(loaded, started) workers of ``--workers N``; (1, 1) in a lone process.

    A worker counts while it lives (its slot's lock is held) and once the process holding that slot now has
    noted it loaded: one that died and was replaced counts again only when its replacement has loaded.
    """
    folder = os.environ.get(SLOTS_ENV)
    if not folder:
        return 1, 1
    import fcntl

    started = int(os.environ.get(WORKERS_ENV) or 1)
    loaded = 0
    for slot in range(started):
        try:
            with open(Path(folder) / f"slot-{slot}.lock") as handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except OSError:  # held: its worker lives
                    holder = handle.read().strip()
                else:  # free: its worker died, or none has started yet (closing the file lets go of the lock)
                    continue
            if holder and (Path(folder) / f"loaded-{slot}").read_text() == holder:
                loaded += 1
        except FileNotFoundError:  # no worker has taken the slot, or none has loaded in it
            continue
    return loaded, started


def visible_gpus() -> int:
    """How many GPUs this process can use: ``CUDA_VISIBLE_DEVICES`` when set, else the NVIDIA driver's list
    (no framework is imported for this); 0 without a driver."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for part in visible.split(","):
            part = part.strip()
            if not part or part == "-1":
                break  # CUDA ignores everything from the first invalid entry on
            count += 1
        return count
    try:
        return sum(1 for _ in Path("/proc/driver/nvidia/gpus").iterdir())
    except OSError:
        return 0


def assign(devices: list[int] | str | None, slot: int | None = None, gpus: int | None = None) -> Device:
    """The device of an API whose ``devices`` is `devices`, in the worker of `slot` (default: this process's).

    ``auto`` (or None) spreads over every visible GPU, and is the CPU when there is none; a list is used as
    given (``[0, 1]``), whatever is visible: a wrong id fails where the framework uses it, with its message.
    """
    if slot is None:
        slot = worker_slot()
    if devices is None or devices == AUTO:
        count = visible_gpus() if gpus is None else gpus
        return CPU if count == 0 else Device(slot % count)
    if not devices:
        return CPU
    assert isinstance(devices, list)
    return Device(devices[slot % len(devices)])


# --------------------------------------------------------------------------------------------------
# What user code sees: the device of the API whose code is running.

#: The API whose code runs in this context (its constructor, load(), its batch threads); requests carry theirs.
_api: contextvars.ContextVar[str | None] = contextvars.ContextVar("modelserve_api", default=None)
#: The device of each API loaded in this process.
_placed: dict[str, Device] = {}


def place(api: str, device: Device) -> None:
    """Record the device of `api` in this process (at load)."""
    _placed[api] = device


def enter(api: str) -> contextvars.Token[str | None]:
    """Mark the code that runs from here on (in this context) as `api`'s: its constructor, load(), a thread."""
    return _api.set(api)


def leave(token: contextvars.Token[str | None]) -> None:
    _api.reset(token)


def device() -> str:
    """The device of the API whose code calls it: ``"cuda:<id>"`` or ``"cpu"``.

    Set by the API's ``devices`` (``auto`` by default: the GPUs this process sees, spread over the workers of
    ``--workers N``; the CPU without one). Call it from the constructor, ``load()``, or the stages::

        class Model:
            def load(self):
                self.model = build_model().to(modelserve.device())
    """
    name = _api.get()
    if name is None:
        from modelserve.context import current

        ctx = current.get()
        name = ctx.api if ctx is not None else None
    placed = _placed.get(name) if name is not None else None
    if placed is None:
        placed = next(iter(_placed.values())) if len(set(_placed.values())) == 1 else assign(AUTO)
    return placed.name
