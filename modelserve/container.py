"""Container images: the Dockerfile (and .dockerignore) of a project folder, and building it.

``modelserve dockerfile PROJECT`` writes both into the project folder (the build context);
``modelserve build PROJECT -t TAG`` writes them when missing and runs ``docker build`` (or ``podman build``,
or ``buildah bud``: the first installed). The image:

* starts from a slim Python image (``--base-image``; a Truss's ``python_version`` picks the Python);
* installs the system packages a Truss names (``system_packages``), then modelserve with the extras the
  project's APIs need (`Recipe.extras`: ``onnx`` and ``tensorflow`` for model files and Cortex clients,
  ``redis`` for a Redis job store, ``schema`` for handler code that imports pydantic) and the project's own
  requirements (a ``requirements.txt``; a Truss's ``requirements`` and ``requirements_file``; a Cortex
  handler's ``dependencies: pip``, and its ``shell`` script, run as Cortex ran it), in one layer that changes
  only when they do;
* copies the project, owned by an unprivileged user the server runs as;
* exposes the port, checks ``/healthz`` (``HEALTHCHECK``), stops with SIGTERM (graceful, as on a terminal) and
  runs ``python -m modelserve /srv/project --host 0.0.0.0``; arguments given to ``docker run`` are added to
  that command line.

Nothing here imports user code: the recipe is read from the project's configuration files.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from modelserve import __version__
from modelserve.config import ProjectConfig, load_project_config
from modelserve.errors import ConfigError
from modelserve.jobs import store_kind

DEFAULT_BASE_IMAGE = "python:3.11-slim"
DEFAULT_PORT = 8888  # the CLI's
#: Where the project lives in the image, and the user that owns it and runs the server.
PROJECT_DIR = "/srv/project"
USER = "modelserve"
UID = 10001
#: The container tools `build` looks for, in order, and the build command of each.
TOOLS: dict[str, list[str]] = {
    "docker": ["docker", "build"],
    "podman": ["podman", "build"],
    "buildah": ["buildah", "bud"],
}
#: gitignore patterns never sent to the build: version control, caches, the jobs database of local runs, and
#: ``.env`` (secrets do not belong in an image layer: give the variables to the container instead).
ALWAYS_IGNORED = [".git/", "__pycache__/", "*.py[cod]", ".modelserve/", ".env", ".venv/", "Dockerfile", ".dockerignore"]
IGNORE_FILE = ".modelserveignore"  # the project's own, as --reload reads it
_PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.:=~-]*$")
_PYTHON_RE = re.compile(r"^py3(\d{1,2})$")
_CORTEX_DEFAULTS = {"pip": "requirements.txt", "shell": "dependencies.sh", "conda": "conda-packages.txt"}


@dataclass
class Recipe:
    """What an image of a project installs, read from its configuration files (`recipe`)."""

    #: modelserve's extras the project's APIs need, sorted.
    extras: list[str] = field(default_factory=list)
    #: pip requirements files, relative to the project folder.
    requirement_files: list[str] = field(default_factory=list)
    #: pip requirements written in the configuration itself (a Truss's ``requirements``).
    requirements: list[str] = field(default_factory=list)
    #: Debian packages (a Truss's ``system_packages``).
    system_packages: list[str] = field(default_factory=list)
    #: Scripts run as root once the project is copied (a Cortex handler's ``dependencies: shell``).
    scripts: list[str] = field(default_factory=list)
    #: The Python a Truss asks for (``py311``), as a base image tag (``3.11``); None: the default image's.
    python: str | None = None
    #: What the configuration asks that the image does not do, one line each (written in the Dockerfile).
    not_applied: list[str] = field(default_factory=list)


def recipe(project: ProjectConfig) -> Recipe:
    """The extras and requirements of a project (its APIs' model formats, job store, handler imports, and the
    dependency files of a Truss or a Cortex project)."""
    result = Recipe()
    extras: set[str] = set()
    for api in project.apis:
        formats = [api.model.format] if api.model is not None else []
        if api.cortex is not None:
            formats += [model.format for model in api.cortex.models.values()]
            formats.append(api.cortex.type)
        extras.update(fmt for fmt in formats if fmt in ("onnx", "tensorflow"))
        handler_path = api.handler.path if api.handler is not None else None
        if handler_path is not None and _imports_pydantic(project.root / handler_path):
            extras.add("schema")
        if api.truss is not None:
            _truss(project.root, api.truss, result, extras)
    if any(api.kind == "async" for api in project.apis) and store_kind(project.jobs.store) == "redis":
        extras.add("redis")
    _cortex(project.root, result)
    if (project.root / "requirements.txt").is_file() and "requirements.txt" not in result.requirement_files:
        result.requirement_files.insert(0, "requirements.txt")
    result.extras = sorted(extras)
    return result


def _imports_pydantic(path: Path) -> bool:
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return re.search(r"^\s*(from|import)\s+pydantic\b", source, re.MULTILINE) is not None


def _truss(root: Path, config_path: str, result: Recipe, extras: set[str]) -> None:
    path = root / config_path
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}  # load_project_config read it already
    folder = path.parent.relative_to(root)
    for requirement in data.get("requirements") or []:
        result.requirements.append(str(requirement))
    if data.get("requirements_file"):
        result.requirement_files.append((folder / str(data["requirements_file"])).as_posix())
    result.system_packages += [str(package) for package in data.get("system_packages") or []]
    if data.get("model_cache"):
        extras.add("truss-cache")
    version = _PYTHON_RE.match(str(data.get("python_version", "")))
    if version is not None and int(version.group(1)) >= 10:
        result.python = f"3.{version.group(1)}"
    elif data.get("python_version"):
        result.not_applied.append(f"python_version {data['python_version']} (modelserve needs Python 3.10 or later)")
    if data.get("build_commands"):
        result.not_applied.append("build_commands (they run in Truss's image layout; add them to the Dockerfile)")
    if data.get("base_image"):
        result.not_applied.append("base_image (give --base-image instead)")


def _cortex(root: Path, result: Recipe) -> None:
    """A Cortex project's dependencies: each API's ``dependencies`` (pip, shell, conda), or Cortex's defaults."""
    files = [root / name for name in ("cortex.yaml", "cortex.yml") if (root / name).is_file()]
    if not files or (root / "modelserve.yaml").is_file():
        return
    data = yaml.safe_load(files[0].read_text(encoding="utf-8"))
    entries = data if isinstance(data, list) else [data]
    asked: dict[str, set[str]] = {kind: set() for kind in _CORTEX_DEFAULTS}
    for entry in entries:
        section = (entry.get("handler") or entry.get("predictor") or {}) if isinstance(entry, dict) else {}
        dependencies = section.get("dependencies") if isinstance(section, dict) else None
        for kind, default in _CORTEX_DEFAULTS.items():
            named = dependencies.get(kind) if isinstance(dependencies, dict) else None
            asked[kind].add(str(named or default))
    for file in sorted(asked["pip"]):
        if (root / file).is_file() and file not in result.requirement_files:
            result.requirement_files.append(file)
    result.scripts += [file for file in sorted(asked["shell"]) if (root / file).is_file()]
    result.not_applied += [f"conda packages in {file}" for file in sorted(asked["conda"]) if (root / file).is_file()]


def dockerfile(
    project_dir: str | Path,
    *,
    base_image: str | None = None,
    port: int = DEFAULT_PORT,
    modelserve: str | None = None,
) -> str:
    """The Dockerfile of a project folder (validated first: a `ConfigError` names what is wrong).

    `modelserve` is what pip installs modelserve from: a requirement (default ``modelserve==<this version>``)
    or a wheel file inside the project folder (copied into the image first), the extras added either way."""
    project = load_project_config(project_dir)
    needs = recipe(project)
    bad = [package for package in needs.system_packages if not _PACKAGE_RE.match(package)]
    if bad:
        raise ConfigError(f"system_packages: not Debian package names: {', '.join(map(repr, bad))}")
    base = base_image or (f"python:{needs.python}-slim" if needs.python else DEFAULT_BASE_IMAGE)
    source = modelserve or f"modelserve=={__version__}"
    wheel = (project.root / source).is_file()
    extras = f"[{','.join(needs.extras)}]" if needs.extras else ""
    package = f"/tmp/modelserve-install/{Path(source).name}{extras}" if wheel else _with_extras(source, extras)

    lines = [
        f"# The image of {project.root.name}, written by `modelserve dockerfile` (modelserve {__version__}).",
        f"# Extras from the project's APIs: {', '.join(needs.extras) or 'none'}.",
        *[f"# Not applied: {item}." for item in needs.not_applied],
        f"ARG BASE_IMAGE={base}",
        "FROM ${BASE_IMAGE}",
        "ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1",
    ]
    if needs.system_packages:
        packages = " ".join(needs.system_packages)
        lines.append(
            "RUN apt-get update && apt-get install -y --no-install-recommends "
            f"{packages} && rm -rf /var/lib/apt/lists/*"
        )
    lines.append(f"RUN groupadd --gid {UID} {USER} && useradd --create-home --uid {UID} --gid {UID} {USER}")
    install = ["python", "-m", "pip", "install", package]
    copies = []
    if wheel:
        copies.append(f"COPY {json.dumps([source, '/tmp/modelserve-install/'])}")
    for index, file in enumerate(needs.requirement_files):
        target = f"/tmp/requirements/{index}-{Path(file).name}"
        copies.append(f"COPY {json.dumps([file, target])}")
        install += ["-r", target]
    install += needs.requirements
    lines += [*copies, f"RUN {json.dumps(install)}"]
    lines += [f"COPY --chown={USER}:{USER} . {PROJECT_DIR}", f"WORKDIR {PROJECT_DIR}"]
    lines += [f"RUN {json.dumps(['bash', script])}" for script in needs.scripts]  # as root, in the project
    probe = f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/healthz', timeout=3)"
    command = ["python", "-m", "modelserve", PROJECT_DIR, "--host", "0.0.0.0", "--port", str(port)]
    lines += [
        f"USER {UID}:{UID}",  # numeric: Kubernetes' runAsNonRoot can check it
        f"EXPOSE {port}",
        "HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 "
        f"CMD {json.dumps(['python', '-c', probe])}",
        "STOPSIGNAL SIGTERM",
        f"ENTRYPOINT {json.dumps(command)}",
    ]
    return "\n".join(lines) + "\n"


def _with_extras(requirement: str, extras: str) -> str:
    """``modelserve==0.1.0`` with ``[onnx]``: the extras go right after the name."""
    match = re.match(r"^([A-Za-z0-9._-]+)(\[[^\]]*\])?(.*)$", requirement)
    if match is None or not extras:
        return requirement
    return f"{match.group(1)}{extras}{match.group(3)}"


def dockerignore(project_dir: str | Path) -> str:
    """A .dockerignore from the project's .modelserveignore (gitignore patterns) and `ALWAYS_IGNORED`.

    gitignore and .dockerignore differ: a gitignore pattern without a slash matches at any depth (written
    ``**/name`` here), one with a leading or inner slash is relative to the project (the leading slash
    dropped), and a trailing slash (folders only) has no .dockerignore form (dropped)."""
    root = Path(project_dir)
    patterns = list(ALWAYS_IGNORED)
    own = root / IGNORE_FILE
    if own.is_file():
        patterns += own.read_text(encoding="utf-8").splitlines()
    lines = [f"# Written by `modelserve dockerfile` from {IGNORE_FILE} and modelserve's own list."]
    for raw in patterns:
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if not pattern:
            continue
        if "/" in pattern:
            pattern = pattern.lstrip("/")
        elif not pattern.startswith("**"):
            pattern = f"**/{pattern}" if pattern not in ("Dockerfile", ".dockerignore") else pattern
        lines.append(("!" if negate else "") + pattern)
    return "\n".join(lines) + "\n"


def write(
    project_dir: str | Path,
    *,
    base_image: str | None = None,
    port: int = DEFAULT_PORT,
    modelserve: str | None = None,
    force: bool = False,
) -> list[Path]:
    """Write the Dockerfile and .dockerignore into the project folder; an existing one is kept unless `force`
    (a `ConfigError` says so). Returns the paths written."""
    root = Path(project_dir).resolve()
    text = dockerfile(root, base_image=base_image, port=port, modelserve=modelserve)
    targets = [root / "Dockerfile", root / ".dockerignore"]
    existing = [str(path) for path in targets if path.exists()]
    if existing and not force:
        raise ConfigError(f"{' and '.join(existing)} exist already; --force replaces them")
    targets[0].write_text(text, encoding="utf-8")
    targets[1].write_text(dockerignore(root), encoding="utf-8")
    return targets


def container_tool() -> str | None:
    """The first container tool of `TOOLS` on the PATH, or None."""
    return next((name for name in TOOLS if shutil.which(name) is not None), None)


def build_command(project_dir: str | Path, tag: str, tool: str, build_args: Sequence[str] = ()) -> list[str]:
    """The command that builds the project's image with `tool` (a `TOOLS` key)."""
    command = [*TOOLS[tool], "-t", tag, "-f", str(Path(project_dir) / "Dockerfile")]
    for item in build_args:
        command += ["--build-arg", item]
    return [*command, str(project_dir)]


def build(project_dir: str | Path, tag: str, *, build_args: Sequence[str] = (), **options: Any) -> int:
    """Build the project's image: write its Dockerfile when there is none, then run the first installed tool
    of `TOOLS`; returns its exit code. No tool installed: a `ConfigError` that says which to install."""
    tool = container_tool()
    if tool is None:
        raise ConfigError(
            "modelserve build needs docker, podman or buildah on the PATH, and none is installed; install one,"
            " or write the Dockerfile with `modelserve dockerfile` and build it elsewhere"
        )
    root = Path(project_dir).resolve()
    if not (root / "Dockerfile").exists():
        write(root, **options)
    return subprocess.run(build_command(root, tag, tool, build_args), check=False).returncode


#: The command line's subcommands that this module runs (`run_command`).
COMMANDS = ("dockerfile", "build")


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of ``modelserve dockerfile`` or ``modelserve build``."""
    about = {
        "dockerfile": "Write a Dockerfile and .dockerignore into a project folder.",
        "build": "Build a project's container image with docker, podman or buildah.",
    }
    parser = argparse.ArgumentParser(prog=f"modelserve {name}", description=about[name])
    parser.add_argument("project_dir", metavar="PROJECT", help="the project folder (the build context)")
    if name == "build":
        parser.add_argument("-t", "--tag", required=True, help="the image's name and tag (iris:1)")
        parser.add_argument(
            "--build-arg", action="append", default=[], metavar="NAME=VALUE", help="passed to the build; repeatable"
        )
    parser.add_argument("--base-image", default=None, help=f"the image to start from (default: {DEFAULT_BASE_IMAGE})")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the port served (default: {DEFAULT_PORT})")
    parser.add_argument(
        "--modelserve",
        default=None,
        metavar="REQUIREMENT_OR_WHEEL",
        help=f"what pip installs modelserve from (default: modelserve=={__version__}; a wheel in the project folder)",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing Dockerfile and .dockerignore")
    if name == "dockerfile":
        parser.add_argument("--stdout", action="store_true", help="print the Dockerfile instead of writing files")
    return parser


def run_command(argv: Sequence[str]) -> int:
    """``modelserve dockerfile ...`` or ``modelserve build ...`` (`argv` starts with the subcommand's name).

    Returns 0, or the container tool's exit code; a mistake raises `ConfigError` (the CLI's exit code 2) and
    bad usage argparse's ``SystemExit(2)``."""
    name, *rest = argv
    args = command_parser(name).parse_args(rest)
    if not 1 <= args.port <= 65535:
        raise ConfigError(f"--port: expected a port from 1 to 65535, got {args.port}")
    options: dict[str, Any] = {"base_image": args.base_image, "port": args.port, "modelserve": args.modelserve}
    if name == "dockerfile" and args.stdout:
        sys.stdout.write(dockerfile(args.project_dir, **options))
        return 0
    if name == "dockerfile":
        for path in write(args.project_dir, force=args.force, **options):
            print(f"wrote {path}")
        return 0
    if args.force:
        write(args.project_dir, force=True, **options)
    return build(args.project_dir, args.tag, build_args=args.build_arg, **options)
