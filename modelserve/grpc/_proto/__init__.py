"""Triton's ``grpc_service.proto`` and ``model_config.proto`` (BSD-3-Clause, see LICENSE and SOURCES.md), and the
modules grpcio-tools generates from them (``scripts/grpc_codegen.py``; do not edit them).

Their descriptors live in `POOL`, a pool of this package's own rather than protobuf's default one, which
tritonclient fills with the same ``inference.*`` names from its own copy of the files.
"""

from google.protobuf.descriptor_pool import DescriptorPool

POOL = DescriptorPool()
