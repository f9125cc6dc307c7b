"""Fill a Truss's ``model_cache`` and ``external_data`` as Baseten's build and start-up do.

Truss code often reads what Baseten downloaded for it by absolute path: ``/app/model_cache/<volume_folder>``
(a ``model_cache`` entry with ``use_volume: true``), the Hugging Face cache (``use_volume: false``, baked
into the image) and ``/app/data/<local_data_path>`` (``external_data``). modelserve downloads nothing when it
serves; this command does it once, beforehand::

    python -m modelserve.compat.truss_cache path/to/truss                       # into /app/model_cache
    python -m modelserve.compat.truss_cache path/to/truss --cache-dir ~/cache --link

Each Hugging Face entry is ``huggingface_hub.snapshot_download(repo_id, revision=..., allow_patterns=...,
ignore_patterns=...)``: into ``<cache dir>/<volume_folder>`` for a volume (the cache dir is ``/app/model_cache``
unless ``--cache-dir`` or ``MODELSERVE_TRUSS_CACHE`` says otherwise), else into the Hugging Face cache
(``HF_HUB_CACHE``), where ``from_pretrained(repo_id)`` finds it. ``external_data`` files are downloaded into the
truss's data folder (the constructor's ``data_dir``; ``/app/data`` on Baseten). With a cache dir elsewhere,
``--link`` makes ``/app/model_cache/<volume_folder>`` (and ``/app/data``) symbolic links to what was filled, so
that code reading those paths runs unchanged; without it the links to make are printed.

huggingface_hub is an optional dependency: the ``truss-cache`` extra.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from modelserve.errors import CacheError, install_hint

#: Where Baseten puts model_cache volumes, and the truss's data folder (truss/base/constants.py).
MODEL_CACHE_PATH = Path("/app/model_cache")
APP_DATA_PATH = Path("/app/data")
CACHE_ENV = "MODELSERVE_TRUSS_CACHE"
COMMAND = "python -m modelserve.compat.truss_cache"
INSTALL_HINT = f"huggingface_hub is needed to fill a Truss model_cache: {install_hint('truss-cache')}"


@dataclass
class Entry:
    """One ``model_cache`` entry of config.yaml."""

    repo_id: str
    revision: str | None
    allow_patterns: list[str] | None
    ignore_patterns: list[str] | None
    volume_folder: str | None
    kind: str


def read_entries(config: dict[str, Any]) -> list[Entry]:
    """The ``model_cache`` (or older ``hf_cache``) entries of a Truss config, checked."""
    raw = config.get("model_cache")
    if raw is None:
        raw = config.get("hf_cache")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise CacheError(f"key 'model_cache': expected a list of repositories, got {raw!r}")
    entries = []
    for index, item in enumerate(raw):
        where = f"model_cache[{index}]"
        if not isinstance(item, dict) or not isinstance(item.get("repo_id"), str) or not item["repo_id"]:
            raise CacheError(f"{where}: expected a mapping with a repo_id, got {item!r}")
        patterns = {}
        for key in ("allow_patterns", "ignore_patterns"):
            value = item.get(key)
            if value is not None and (not isinstance(value, list) or not all(isinstance(p, str) for p in value)):
                raise CacheError(f"{where}: key '{key}': expected a list of patterns, got {value!r}")
            patterns[key] = value
        volume = item.get("volume_folder") if item.get("use_volume") else None
        if item.get("use_volume") and (not isinstance(volume, str) or not volume or "/" in volume or volume == ".."):
            raise CacheError(f"{where}: use_volume needs a volume_folder (one folder name), got {volume!r}")
        entries.append(
            Entry(
                repo_id=item["repo_id"],
                revision=str(item["revision"]) if item.get("revision") else None,
                allow_patterns=patterns["allow_patterns"],
                ignore_patterns=patterns["ignore_patterns"],
                volume_folder=volume,
                kind=str(item.get("kind") or "hf"),
            )
        )
    return entries


def snapshot_download() -> Any:
    try:
        from huggingface_hub import snapshot_download as download
    except ImportError:
        raise CacheError(INSTALL_HINT) from None
    return download


def fill_model_cache(entries: list[Entry], cache_dir: Path, token: str | None = None) -> list[Path]:
    """Download every entry, as Truss's build does; returns the folder each went to."""
    places = []
    for entry in entries:
        if entry.kind != "hf":
            raise CacheError(
                f"{entry.repo_id}: kind {entry.kind!r} (cloud storage) is not downloaded by this command; copy it "
                f"into {cache_dir / (entry.volume_folder or '')} yourself"
            )
        download = snapshot_download()
        options: dict[str, Any] = {
            "repo_id": entry.repo_id,
            "revision": entry.revision,
            "allow_patterns": entry.allow_patterns,
            "ignore_patterns": entry.ignore_patterns,
            "token": token,
        }
        if entry.volume_folder is not None:
            options["local_dir"] = str(cache_dir / entry.volume_folder)
        print(f"downloading {entry.repo_id}" + (f"@{entry.revision}" if entry.revision else ""), file=sys.stderr)
        places.append(Path(download(**options)))
    return places


def fill_external_data(config: dict[str, Any], data_dir: Path) -> list[Path]:
    """Download ``external_data`` (``url`` -> ``local_data_path`` under the data folder)."""
    raw = config.get("external_data") or []
    if not isinstance(raw, list):
        raise CacheError(f"key 'external_data': expected a list, got {raw!r}")
    written = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("url"), str):
            raise CacheError(f"external_data[{index}]: expected a mapping with a url, got {item!r}")
        relative = Path(str(item.get("local_data_path") or Path(item["url"]).name))
        target = (data_dir / relative).resolve()
        if not target.is_relative_to(data_dir.resolve()):
            raise CacheError(f"external_data[{index}]: local_data_path {str(relative)!r} leaves the data folder")
        target.parent.mkdir(parents=True, exist_ok=True)
        print(f"downloading {item['url']} -> {target}", file=sys.stderr)
        partial = target.with_name(target.name + ".part")
        with urllib.request.urlopen(item["url"]) as answer, open(partial, "wb") as out:  # noqa: S310
            shutil.copyfileobj(answer, out)
        partial.replace(target)
        written.append(target)
    return written


def links(entries: list[Entry], cache_dir: Path, data_dir: Path, external: bool) -> list[tuple[Path, Path]]:
    """The links (Baseten's path, what was filled) that code reading Baseten's paths needs."""
    needed = []
    if cache_dir.resolve() != MODEL_CACHE_PATH:
        needed += [
            (MODEL_CACHE_PATH / e.volume_folder, cache_dir / e.volume_folder) for e in entries if e.volume_folder
        ]
    if external:
        needed.append((APP_DATA_PATH, data_dir))
    return [(link, target.resolve()) for link, target in needed]


def make_links(needed: list[tuple[Path, Path]]) -> list[str]:
    """Create the links that are missing; returns the shell commands for those that could not be made."""
    failed = []
    for link, target in needed:
        if link.is_symlink() and link.resolve() == target:
            continue
        try:
            link.parent.mkdir(parents=True, exist_ok=True)
            if link.is_symlink():
                link.unlink()
            link.symlink_to(target, target_is_directory=True)
            print(f"linked {link} -> {target}", file=sys.stderr)
        except OSError as exc:
            failed.append(f"sudo mkdir -p {link.parent} && sudo ln -sfn {target} {link}  # {exc.strerror}")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Fill a Truss's model_cache and external_data, as Baseten's build does."
    )
    parser.add_argument("truss", type=Path, help="the Truss folder (with config.yaml)")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get(CACHE_ENV) or MODEL_CACHE_PATH),
        help=f"where model_cache volumes go (default: ${CACHE_ENV} or {MODEL_CACHE_PATH})",
    )
    parser.add_argument(
        "--link", action="store_true", help=f"link {MODEL_CACHE_PATH}/<volume_folder> and {APP_DATA_PATH} to them"
    )
    args = parser.parse_args(argv)
    path = args.truss / "config.yaml"
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(config, dict):
            raise CacheError(f"{path}: expected a mapping")
        entries = read_entries(config)
        data_dir = args.truss / str(config.get("data_dir") or "data")
        token = os.environ.get("HF_TOKEN") or None
        places = fill_model_cache(entries, args.cache_dir, token)
        files = fill_external_data(config, data_dir)
    except (OSError, yaml.YAMLError, CacheError) as exc:
        print(f"{COMMAND}: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # huggingface_hub's errors (a missing repo, a revision, no network)
        print(f"{COMMAND}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    for place in places:
        print(place)
    if not entries and not files:
        print(f"{path}: no model_cache or external_data; nothing to download", file=sys.stderr)
    needed = links(entries, args.cache_dir, data_dir, bool(files))
    if needed and args.link:
        failed = make_links(needed)
        if failed:
            print("could not link; run:\n  " + "\n  ".join(failed), file=sys.stderr)
            return 1
    elif needed:
        print(
            "code that reads Baseten's paths needs these links (or run again with --link):\n  "
            + "\n  ".join(f"ln -sfn {target} {link}" for link, target in needed),
            file=sys.stderr,
        )
    return 0


def hint(root: Path, message: str) -> str | None:
    """What to say when user code failed on a path that Baseten fills (None when it did not)."""
    for path in (MODEL_CACHE_PATH, APP_DATA_PATH):
        if str(path) + "/" in message or message.rstrip("'\"").endswith(str(path)):
            return (
                f"{path} is filled by Baseten's build and start-up, not by modelserve: run `{COMMAND} {root}` "
                f"first (huggingface_hub: {install_hint('truss-cache')}); see docs/compatibility.md"
            )
    return None


if __name__ == "__main__":
    sys.exit(main())
