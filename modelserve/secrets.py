"""Secrets: the read-only mapping a Model's constructor receives as ``secrets`` (Truss's contract).

A project declares the names it needs (``secrets:`` in a Truss config.yaml, or an API's ``secrets:`` key in
modelserve.yaml); each value is looked up when it is read, in this order:

1. an environment variable of that name (``.env`` in the project folder counts: it is loaded first), then
   ``TRUSS_SECRET_<name>`` as Truss's own local runs set it;
2. a file of that name in the secrets folder: ``--secrets-dir`` (``MODELSERVE_SECRETS_DIR``), by default
   ``/secrets`` as on Truss's platform (one trailing newline is dropped, as ``echo value > file`` adds one);
3. the value written in the declaration, when it is not empty (Truss's fallback; ``null`` is the norm).

Reading a name that was not declared, or one that is declared but set nowhere, raises `SecretNotFound`, a
`KeyError` whose message says how to provide it. Values are never part of a message, a ``repr`` or a log
line::

    class Model:
        def __init__(self, secrets):
            self._token = secrets["hf_access_token"]
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path

from modelserve.errors import SecretNotFound

#: The environment variable the CLI's ``--secrets-dir`` sets, so that worker processes see it too.
SECRETS_DIR_ENV = "MODELSERVE_SECRETS_DIR"
DEFAULT_SECRETS_DIR = "/secrets"
TRUSS_PREFIX = "TRUSS_SECRET_"


def secrets_dir() -> Path:
    """The folder of secret files: ``--secrets-dir``, else ``/secrets``."""
    return Path(os.environ.get(SECRETS_DIR_ENV) or DEFAULT_SECRETS_DIR)


class Secrets(Mapping[str, str]):
    """The declared secrets of an API, each resolved when it is read (see the module's docstring).

    `declared` maps each name to the value written in the declaration (usually None).
    """

    def __init__(self, declared: Mapping[str, str | None], folder: Path | str | None = None) -> None:
        self._declared = dict(declared)
        self._folder = Path(folder) if folder is not None else None

    @property
    def folder(self) -> Path:
        return self._folder if self._folder is not None else secrets_dir()

    def __getitem__(self, name: str) -> str:
        if name not in self._declared:
            raise SecretNotFound(
                name,
                f"secret {name!r} is not declared; add it under 'secrets:' (in the Truss config.yaml, or the "
                f"API's 'secrets:' in modelserve.yaml) and {self._how(name)}",
            )
        value = self._resolve(name)
        if value is None:
            raise SecretNotFound(name, f"secret {name!r} is declared but not set; {self._how(name)}")
        return value

    def _resolve(self, name: str) -> str | None:
        for variable in (name, TRUSS_PREFIX + name):
            value = os.environ.get(variable)
            if value:
                return value
        path = self.folder / name
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, ValueError):
            text = ""
        if text.endswith("\n"):
            text = text[:-2] if text.endswith("\r\n") else text[:-1]
        if text:
            return text
        default = self._declared[name]
        return str(default) if default not in (None, "") else None

    def _how(self, name: str) -> str:
        return (
            f"set the environment variable {name} (or a line {name}=... in the project's .env), or write the "
            f"value to the file {self.folder / name} (the folder is --secrets-dir, default {DEFAULT_SECRETS_DIR})"
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self._declared)

    def __len__(self) -> int:
        return len(self._declared)

    def __repr__(self) -> str:
        return f"Secrets({sorted(self._declared)!r})"
