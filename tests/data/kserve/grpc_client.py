"""kserve's InferenceGRPCClient against a modelserve gRPC address (argv[1]): health, readiness, an inference of
Triton's ``simple`` model with raw (binary) and typed contents, and an unknown model. Prints what it got as
JSON. Run by tests/grpc/test_kserve_client.py with an interpreter that has ``kserve`` installed."""

from __future__ import annotations

import asyncio
import json
import sys

import grpc
import numpy as np
from kserve import InferenceGRPCClient, InferInput, InferRequest


def simple_request(model: str, binary: bool) -> InferRequest:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = []
    for name, data in (("INPUT0", a), ("INPUT1", b)):
        tensor = InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(data, binary_data=binary)
        inputs.append(tensor)
    return InferRequest(model_name=model, infer_inputs=inputs, request_id=f"kserve-{binary}")


async def main(address: str) -> dict[str, object]:
    got: dict[str, object] = {}
    async with InferenceGRPCClient(url=address, timeout=30) as client:
        got["live"] = await client.is_server_live()
        got["ready"] = await client.is_server_ready()
        got["model_ready"] = await client.is_model_ready("simple")
        for binary in (True, False):
            response = await client.infer(simple_request("simple", binary))
            got[f"binary={binary}"] = {
                "id": response.id,
                "model": response.model_name,
                "outputs": {output.name: output.as_numpy().tolist() for output in response.outputs},
            }
        try:
            await client.infer(simple_request("nothing", True))
        except grpc.RpcError as error:
            got["unknown"] = [error.code().name, error.details()]
    return got


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1]))))
