"""Project loading: the environment user code runs in, and importing the user's Python files.

Before any user code is imported:

* ``.env`` in the project folder is loaded into ``os.environ``; variables already set in the environment
  win (deployment settings override the file, as with docker and twelve-factor apps);
* the project folder becomes the working directory, so ``open("values.json")`` finds the project's files,
  and it is put first on ``sys.path`` so user files can import each other (a relative project path given
  later is still relative to the folder the program was in: `caller_dir`);
* ``MODELSERVE_URL`` is set to the server's base URL when it is known;
* import paths that other servers' user code expects (``cortex_internal.lib.log``) are appended to
  ``sys.path``, last, so that a real package of that name, when installed, is found first.
"""

from __future__ import annotations

import hashlib
import importlib.util
import keyword
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from dotenv import dotenv_values

from modelserve.errors import LoadError, missing_module_hint

_modules: dict[tuple[Path, str | None], ModuleType] = {}
#: The working directory before `prepare_environment` first changed it, and the project folder it went to.
_moved: tuple[str, str] | None = None
_PACKAGE_DIR = Path(__file__).resolve().parent
_SHIMS_DIR = _PACKAGE_DIR / "compat" / "_shims"


def caller_dir() -> Path:
    """The folder a relative project path is relative to: the working directory, or, while it is a project
    folder that modelserve moved into, the one the program was in before."""
    cwd = os.getcwd()
    if _moved is not None and cwd == _moved[1]:
        return Path(_moved[0])
    return Path(cwd)


def prepare_environment(root: Path, base_url: str | None = None) -> None:
    global _moved
    env_file = root / ".env"
    if env_file.is_file():
        for key, value in dotenv_values(env_file).items():
            if value is not None and key not in os.environ:
                os.environ[key] = value
    before = str(caller_dir())
    os.chdir(root)
    _moved = (before, os.getcwd())
    from modelserve.logs import add_user_code_dir

    add_user_code_dir(str(root))
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    if base_url is not None:
        os.environ["MODELSERVE_URL"] = base_url.rstrip("/")
    if str(_SHIMS_DIR) not in sys.path:
        sys.path.append(str(_SHIMS_DIR))


def apply_api_environment(root: Path, env: dict[str, str], python_path: list[str]) -> None:
    """What an API asks of the process before its code is imported (a Truss folder's
    ``environment_variables`` and package folders): variables already set (or from ``.env``) win, and the
    folders come right after the project folder on ``sys.path``, before installed packages."""
    from modelserve.logs import add_user_code_dir

    for key, value in env.items():
        os.environ.setdefault(key, value)
    position = sys.path.index(str(root)) + 1 if str(root) in sys.path else 0
    for relative in python_path:
        folder = str((root / relative).resolve())
        if folder not in sys.path:
            sys.path.insert(position, folder)
            position += 1
        add_user_code_dir(folder)


def import_file(root: Path, relative_path: str, instance: str | None = None) -> ModuleType:
    """Import a project file once (several APIs naming one file share its module and its globals).

    The module gets the name that ``import`` would give it from the project folder (``model/model.py`` is
    ``model.model``, as Truss imports it), with its parent packages in ``sys.modules``: `pickle` finds the
    classes and functions it defines by that name, in this process and in the worker processes it starts (a
    ``ProcessPoolExecutor`` sends them by name), and ``import model.model`` elsewhere gets the same module.
    Where that name (or a parent's) is already another module's, the file gets a name of its own under a
    package registered for the project (`_project_package`).

    With `instance` (an API's name), once per instance: each gets a module and globals of its own, as each
    API of a Cortex project ran in a process of its own (``handler__<api>``, beside the file's own name).
    """
    path = (root / relative_path).resolve()
    module = _modules.get((path, instance))
    if module is not None:
        return module
    if not path.is_relative_to(root.resolve()):
        raise LoadError(f"{relative_path}: leads to {str(path)!r}, outside the project folder {str(root)!r}")
    if not path.is_file():
        raise LoadError(f"{relative_path}: file not found in {root}")
    base = root.resolve()
    parts = list(path.relative_to(base).with_suffix("").parts)
    existing = sys.modules.get(".".join(parts))
    if instance is None and existing is not None and _file_of(existing) == path:
        _modules[(path, instance)] = existing  # imported already, by user code's own `import`
        return existing
    if instance is not None:
        parts[-1] += "__" + "".join(char if char.isalnum() else "_" for char in instance)
    prefix = _free_prefix(base, parts)
    if prefix is None:
        prefix = _project_package(base)
    name = ".".join([*prefix, *parts])
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise LoadError(f"{relative_path}: not an importable Python file")
    try:
        parent = _parents(base, prefix, parts[:-1])
    except Exception as exc:
        raise LoadError(f"{relative_path}: importing its package raised {describe_error(exc)}") from exc
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise LoadError(
            f"{relative_path}: importing it raised {describe_error(exc)}{missing_module_hint(exc)}"
        ) from exc
    if parent is not None:
        setattr(parent, parts[-1], module)
    _modules[(path, instance)] = module
    return module


def _free_prefix(base: Path, parts: list[str]) -> list[str] | None:
    """``[]`` when the file can have its own dotted name (each part an identifier, each name free in
    ``sys.modules`` or already this project's module of that path), else None."""
    if not all(part.isidentifier() and not keyword.iskeyword(part) for part in parts):
        return None
    for index in range(1, len(parts) + 1):
        existing = sys.modules.get(".".join(parts[:index]))
        if existing is None:
            continue
        folder = base.joinpath(*parts[:index])
        if index == len(parts) or not _is_package_of(existing, folder):
            return None
    return []


def _file_of(module: ModuleType) -> Path | None:
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if isinstance(file, str) else None


def _is_package_of(module: ModuleType, folder: Path) -> bool:
    paths = getattr(module, "__path__", None) or []
    return any(Path(entry).resolve() == folder for entry in paths)


def _project_package(base: Path) -> list[str]:
    """A package for a project whose files cannot have their own names: ``modelserve_project_<hash>``,
    whose path is the project folder."""
    digest = hashlib.sha1(str(base).encode()).hexdigest()[:10]
    return [f"modelserve_project_{digest}"]


def _parents(base: Path, prefix: list[str], folders: list[str]) -> ModuleType | None:
    """Register the packages above a project file, as ``import`` would: a folder with ``__init__.py`` is
    that package (its ``__init__.py`` run), one without is a namespace package. Returns the innermost."""
    parent: ModuleType | None = None
    names: list[str] = []
    chain = [(part, base) for part in prefix] + [(part, None) for part in folders]
    folder = base
    for part, fixed in chain:
        names.append(part)
        if fixed is None:
            folder = folder / part
        name = ".".join(names)
        module = sys.modules.get(name)
        if module is None:
            init = folder / "__init__.py"
            if fixed is None and init.is_file():
                spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)])
            else:
                spec = importlib.util.spec_from_loader(name, None, is_package=True)
            assert spec is not None
            module = importlib.util.module_from_spec(spec)
            if spec.loader is None:
                module.__path__ = [str(folder)]
            sys.modules[name] = module
            if spec.loader is not None:
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[name]
                    raise
            if parent is not None:
                setattr(parent, part, module)
        parent = module
    return parent


def find_class(module: ModuleType, class_name: str, relative_path: str) -> type[Any]:
    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(
            name for name, value in vars(module).items() if isinstance(value, type) and not name.startswith("_")
        )
        hint = f" (classes found: {', '.join(found)})" if found else ""
        raise LoadError(f"{relative_path}: no class {class_name!r}{hint}; set handler.class in modelserve.yaml")
    if not isinstance(cls, type):
        raise LoadError(f"{relative_path}: {class_name!r} is not a class")
    return cls


def describe_error(exc: BaseException) -> str:
    """``ValueError: bad weights (model.py, line 12)``: the error and where in user code it happened."""
    if isinstance(exc, SyntaxError) and exc.filename:  # the user's file and line, not importlib's frame
        return f"{type(exc).__name__}: {exc.msg} ({Path(exc.filename).name}, line {exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    for frame in reversed(frames):
        if not Path(frame.filename).resolve().is_relative_to(_PACKAGE_DIR):
            where = f" ({Path(frame.filename).name}, line {frame.lineno})"
            break
    return f"{type(exc).__name__}: {exc}{where}"
