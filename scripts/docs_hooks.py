"""MkDocs hooks for the documentation site (mkdocs.yml names this file).

The pages in docs/ are read on the repository's web view as well as on the site, so they link to files
outside docs/ (examples, benchmarks/README.md) by relative paths. On the site:

- benchmarks/README.md becomes the page benchmarks.md, and links to it from the pages (and from it to the
  pages) are rewritten to match;
- a link to any other file or folder of the repository must name one that exists (a warning otherwise, which
  fails `mkdocs build --strict`), and points at the repository's web view when `repo_url` is set.
"""

from __future__ import annotations

import logging
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.modelserve")

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = "benchmarks/README.md"
BENCHMARKS_PAGE = "benchmarks.md"
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
FENCE = re.compile(r"^```.*?^```", flags=re.DOTALL | re.MULTILINE)


def on_files(files: Files, config: Any) -> Files:
    files.append(File.generated(config, BENCHMARKS_PAGE, abs_src_path=str(REPO / BENCHMARKS)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    source = BENCHMARKS if page.file.src_uri == BENCHMARKS_PAGE else f"docs/{page.file.src_uri}"
    here = posixpath.dirname(page.file.src_uri)

    def rewrite(match: re.Match[str]) -> str:
        target = match.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:|#|/", target):  # a URL, an anchor of the page, a site path
            return match.group(0)
        path, _, anchor = target.partition("#")
        in_repo = posixpath.normpath(posixpath.join(posixpath.dirname(source), path))
        if in_repo == BENCHMARKS:
            site_path = BENCHMARKS_PAGE
        elif in_repo.startswith("docs/"):
            if not (REPO / in_repo).exists():
                log.warning("%s links to '%s', which is not a file of the documentation", source, target)
                return match.group(0)
            site_path = in_repo.removeprefix("docs/")
        else:
            if in_repo.startswith("../") or not (REPO / in_repo).exists():
                log.warning("%s links to '%s', which is not a file of the repository", source, target)
                return match.group(0)
            if not config.repo_url:
                return match.group(0)
            kind = "tree" if (REPO / in_repo).is_dir() else "blob"
            url = f"{config.repo_url.rstrip('/')}/{kind}/main/{in_repo}"
            return f"{match.group(1)}{url}{'#' + anchor if anchor else ''}{match.group(3)}"
        relative = posixpath.relpath(site_path, here or ".")
        return f"{match.group(1)}{relative}{'#' + anchor if anchor else ''}{match.group(3)}"

    # Links inside fenced code blocks are code, not links: rewrite only the text between the fences.
    pieces, last = [], 0
    for fence in FENCE.finditer(markdown):
        pieces.append(LINK.sub(rewrite, markdown[last : fence.start()]))
        pieces.append(fence.group(0))
        last = fence.end()
    pieces.append(LINK.sub(rewrite, markdown[last:]))
    return "".join(pieces)
