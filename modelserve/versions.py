"""Numbered model versions: a model folder laid out as Triton, TF Serving and Cortex lay theirs out
(``simple/1/model.onnx``, ``simple/2/model.onnx``; ``iris/3/saved_model.pb``), and the policy that says which
of its versions an API serves (Triton's ``version_policy``)::

    model: {path: models/simple}                                   # the highest version (latest: 1)
    model: {path: models/simple, version_policy: all}
    model: {path: models/simple, version_policy: {latest: 2}}      # the two highest
    model: {path: models/simple, version_policy: {specific: [1, 3]}}

A version folder's name is a positive integer in ASCII digits; it holds a SavedModel (``saved_model.pb``) or
one ``.onnx`` file (``model.onnx`` when there are several). No I/O but listing folders; no server here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The policies' names, as modelserve.yaml spells them.
POLICIES = ("all", "latest", "specific")
_EXPECTED = "all, {latest: N} (N >= 1) or {specific: [version, ...]} (positive integers)"


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions of a model folder are served: every one, the `count` highest, or those `numbers`."""

    kind: str = "latest"
    count: int = 1
    numbers: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        """The versions to serve among `available`, in ascending order."""
        ordered = sorted(available)
        if self.kind == "all":
            return ordered
        if self.kind == "latest":
            return ordered[-self.count :]
        return [number for number in ordered if number in self.numbers]

    def describe(self) -> Any:
        if self.kind == "all":
            return "all"
        if self.kind == "latest":
            return {"latest": self.count}
        return {"specific": list(self.numbers)}


def parse_policy(value: Any) -> VersionPolicy:
    """A ``version_policy`` of modelserve.yaml; `ValueError` says what is accepted."""
    if value == "all":
        return VersionPolicy("all")
    if isinstance(value, dict) and len(value) == 1:
        ((key, argument),) = value.items()
        if key == "latest" and type(argument) is int and argument >= 1:
            return VersionPolicy("latest", argument)
        if key == "specific" and isinstance(argument, list) and argument:
            if all(type(number) is int and number >= 1 for number in argument):
                return VersionPolicy("specific", numbers=tuple(sorted(set(argument))))
    raise ValueError(f"expected {_EXPECTED}, got {value!r}"[:200])


def version_folders(path: Path) -> dict[int, Path]:
    """The numbered version folders in `path` (a folder that is itself a SavedModel has none)."""
    if not path.is_dir() or (path / "saved_model.pb").exists():
        return {}
    found = {}
    for child in path.iterdir():
        name = child.name
        if child.is_dir() and name.isascii() and name.isdigit() and int(name) >= 1:
            found[int(name)] = child
    return found


def model_in(folder: Path) -> Path | None:
    """The model a version folder holds: the folder (a SavedModel), its ``model.onnx`` or its one ``.onnx``."""
    if (folder / "saved_model.pb").exists():
        return folder
    if (folder / "model.onnx").is_file():
        return folder / "model.onnx"
    files = sorted(folder.glob("*.onnx"))
    return files[0] if len(files) == 1 else None
