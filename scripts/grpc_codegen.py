"""Generate modelserve/grpc/_proto/*_pb2.py from the vendored .proto files, with grpcio-tools.

    python scripts/grpc_codegen.py            # rewrite the checked-in modules
    python scripts/grpc_codegen.py OUT_DIR    # write them elsewhere (tests/grpc/test_codegen.py compares)

protoc writes the messages into the process's default descriptor pool and imports a sibling .proto's module
by its bare name; two rewrites make the modules a package's own: the sibling is imported from the package,
and the descriptors go to the package's private pool (`modelserve.grpc._proto.POOL`), so that a process
that also imports tritonclient (whose modules define the same ``inference.*`` messages) holds both. The
service stubs are not generated: `modelserve.grpc.servicer` registers its methods from the descriptor.
"""

from __future__ import annotations

import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent.parent / "modelserve" / "grpc" / "_proto"
PROTOS = ("grpc_service.proto", "model_config.proto")
PACKAGE = "modelserve.grpc._proto"
REWRITES = (
    ("import model_config_pb2 as", f"from {PACKAGE} import model_config_pb2 as"),
    ("_descriptor_pool.Default().AddSerializedFile(", "_POOL.AddSerializedFile("),
    (
        "# @@protoc_insertion_point(imports)\n",
        f"# @@protoc_insertion_point(imports)\nfrom {PACKAGE} import POOL as _POOL\n",
    ),
)


def generate(out: Path) -> list[Path]:
    """Write the modules into `out`; returns their paths."""
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    code = protoc.main(["protoc", f"-I{PROTO_DIR}", f"--python_out={out}", *(str(PROTO_DIR / p) for p in PROTOS)])
    if code != 0:
        raise RuntimeError(f"protoc failed with exit code {code}")
    written = []
    for proto in PROTOS:
        path = out / proto.replace(".proto", "_pb2.py")
        text = path.read_text(encoding="utf-8")
        for old, new in REWRITES:
            if old in text:
                text = text.replace(old, new, 1)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    for written in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_DIR):
        print(written)
