"""The HTTP edge: the app, its route table, its error map, and the endpoints that adapt HTTP to `Api.call`.

Layers run one way: this package → `server` → `jobs` → `api` → `backends` → runtimes, pipeline, threads.
Nothing below imports from here.
"""

from __future__ import annotations

from modelserve.http.app import ModelserveApp, create_app

__all__ = ["ModelserveApp", "create_app"]
