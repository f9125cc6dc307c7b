"""Write inferenceservice.schema.yaml: the part of KServe's InferenceService CRD that docs/containers.md's
manifest needs, from the full CRD (config/crd/full/serving.kserve.io_inferenceservices.yaml of kserve/kserve)::

    python tests/data/kserve_crd/prune.py CRD COMMIT

The v1beta1 version's openAPIV3Schema is kept along the fields the manifest uses; every other property keeps
its name with an empty schema (``{}``), so that a misspelt field is still found by name. Not run by the tests.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from tests.deploy.test_manifests import manifests  # noqa: E402

HERE = Path(__file__).resolve().parent
HEADER = """\
# The openAPIV3Schema of KServe's InferenceService (serving.kserve.io/v1beta1), pruned to what the manifest of
# docs/containers.md uses (tests/data/kserve_crd/prune.py): every property of an object on the manifest's paths
# is listed, those the manifest does not use with an empty schema.
# Source: https://github.com/kserve/kserve, commit {commit},
# config/crd/full/serving.kserve.io_inferenceservices.yaml. Copyright The KServe Authors, Apache License 2.0
# (LICENSE beside this file); changed: pruned as said above.
"""


def prune(schema: dict[str, Any], used: Any) -> dict[str, Any]:
    """`schema` along `used` (the manifest's value at that place): properties not used become ``{}``."""
    kept = {key: value for key, value in schema.items() if key not in ("properties", "items", "description")}
    if "properties" in schema:
        uses = used if isinstance(used, dict) else {}
        kept["properties"] = {
            name: prune(child, uses[name]) if name in uses else {} for name, child in schema["properties"].items()
        }
    if "items" in schema:
        rows = used if isinstance(used, list) else []
        merged: dict[str, Any] = {}
        for row in rows:  # one schema for every row: the union of what the rows use
            merged = {**merged, **row} if isinstance(row, dict) else row
        kept["items"] = prune(schema["items"], merged if rows else None)
    return kept


def main() -> None:
    crd, commit = Path(sys.argv[1]), sys.argv[2]
    (definition,) = [doc for doc in yaml.safe_load_all(crd.read_text()) if doc]
    (version,) = [v for v in definition["spec"]["versions"] if v["name"] == "v1beta1"]
    (service,) = [doc for doc in manifests("containers.md") if doc["kind"] == "InferenceService"]
    schema = prune(version["schema"]["openAPIV3Schema"], service)
    text = HEADER.format(commit=commit) + yaml.safe_dump(schema, sort_keys=True, width=120)
    (HERE / "inferenceservice.schema.yaml").write_text(text)


if __name__ == "__main__":
    main()
