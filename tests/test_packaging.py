"""What the source distribution holds, and the metadata it carries (issue #16, item 7)."""

from __future__ import annotations

import tarfile
from email.parser import Parser
from pathlib import Path

from tests.conftest import REPO


def test_the_sdist_holds_the_package_readme_license_and_pyproject_only(tmp_path: Path) -> None:
    from hatchling.builders.sdist import SdistBuilder

    archive = Path(next(SdistBuilder(str(REPO)).build(directory=str(tmp_path))))
    with tarfile.open(archive) as tar:
        names = sorted(name.split("/", 1)[1] for name in tar.getnames() if "/" in name)
        pkg_info = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("/PKG-INFO")))
        assert pkg_info is not None
        metadata = Parser().parsestr(pkg_info.read().decode())
    outside = [name for name in names if not name.startswith("modelserve/")]
    # hatchling always adds .gitignore; PKG-INFO is the metadata
    assert outside == [".gitignore", "LICENSE", "PKG-INFO", "README.md", "pyproject.toml"], outside
    assert "modelserve/__init__.py" in names and "modelserve/py.typed" in names
    assert not any(part in name for name in names for part in ("tests/", "benchmarks/", "examples/", "__pycache__"))

    classifiers = metadata.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers and "Programming Language :: Python :: 3" in classifiers
    assert metadata["Requires-Python"] == ">=3.10"
    dev = [req for req in metadata.get_all("Requires-Dist") or [] if "extra == 'dev'" in req]
    for needed in ("onnxruntime", "tensorflow", "redis", "fastapi", "tritonclient", "cryptography"):
        assert any(req.startswith(needed) for req in dev), (needed, dev)  # [dev] runs the whole suite
