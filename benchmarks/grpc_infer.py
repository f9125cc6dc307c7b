"""gRPC inference: modelserve's ``--grpc-port`` against a bare ``grpc.aio`` servicer running the same ONNX model,
and against modelserve's own V2 REST binary route.

One model, ``iris`` (`onnx_overhead.iris_model`: x float32 [N, 4] -> probabilities float32 [N, 3]), and the
same onnxruntime options everywhere (CPU provider, one intra-op and one inter-op thread). Servers, each its
own process:

* ``modelserve``: ``python -m modelserve DIR --grpc-port P``; the gRPC ``ModelInfer`` of one row sent in
  ``raw_input_contents`` (``grpc``), and the V2 REST route with the row as binary data (``rest-binary``);
* ``bare``: a ``grpc.aio`` server whose one method reads the raw input with ``np.frombuffer``, calls
  ``session.run`` and answers the raw output, none of modelserve's checks, line, metrics or statistics.

The client is a process of its own: `concurrency` coroutines, each calling in a loop for `duration` seconds
over one channel (gRPC) or one connection pool (httpx, for REST: its client costs more per request than
grpc's, so ``rest-binary`` says what a REST client gets, not what the server spends). Every cell is the median
of the rounds (the targets take turns within a round); the ratio is the median of the ratios within a round.
The target of issue 33: ``grpc`` at least 0.9x ``bare`` at 1, 16 and 64 concurrent streams.

    python benchmarks/grpc_infer.py [--duration 2] [--repeats 3] [--concurrency 1,16,64] [--pin]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _harness import REPO, ServerProcess, cpus, free_port
from onnx_overhead import iris_model

BARE = """
import asyncio, sys

import grpc
import numpy as np
import onnxruntime

from modelserve.grpc._proto import grpc_service_pb2 as pb

options = onnxruntime.SessionOptions()
options.intra_op_num_threads = 1
options.inter_op_num_threads = 1
session = onnxruntime.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])


async def infer(request, context):
    tensor = request.inputs[0]
    x = np.frombuffer(request.raw_input_contents[0], np.float32).reshape(list(tensor.shape))
    (y,) = session.run(None, {"x": x})
    response = pb.ModelInferResponse(model_name=request.model_name, model_version="1")
    response.outputs.add(name="probabilities", datatype="FP32", shape=y.shape)
    response.raw_output_contents.append(y.tobytes())
    return response


async def main():
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(
        infer, request_deserializer=pb.ModelInferRequest.FromString,
        response_serializer=pb.ModelInferResponse.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService", {"ModelInfer": handler}),))
    server.add_insecure_port("127.0.0.1:" + sys.argv[2])
    await server.start()
    await server.wait_for_termination()


asyncio.run(main())
"""

CLIENT = """
import asyncio, sys, time

import numpy as np

kind, target, concurrency, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
row = np.array([[5.1, 3.5, 1.4, 0.2]], np.float32)


async def grpc_loop(call, request, end, counts):
    while time.monotonic() < end:
        await call(request)
        counts[0] += 1


async def rest_loop(client, url, body, headers, end, counts):
    while time.monotonic() < end:
        answer = await client.post(url, content=body, headers=headers)
        assert answer.status_code == 200, answer.text
        counts[0] += 1


async def main():
    counts = [0]
    if kind == "grpc":
        import grpc
        from modelserve.grpc._proto import grpc_service_pb2 as pb

        request = pb.ModelInferRequest(model_name="iris")
        request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
        request.raw_input_contents.append(row.tobytes())
        async with grpc.aio.insecure_channel(target) as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelInferResponse.FromString)
            await call(request)
            started = time.monotonic()
            end = started + seconds
            await asyncio.gather(*(grpc_loop(call, request, end, counts) for _ in range(concurrency)))
    else:
        import httpx

        header = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"parameters":{"binary_data_size":16}}],'
        header += b'"parameters":{"binary_data_output":true}}'
        body = header + row.tobytes()
        headers = {"Inference-Header-Content-Length": str(len(header))}
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(limits=limits) as client:
            url = target + "/v2/models/iris/infer"
            await client.post(url, content=body, headers=headers)
            started = time.monotonic()
            end = started + seconds
            await asyncio.gather(*(rest_loop(client, url, body, headers, end, counts) for _ in range(concurrency)))
    print(counts[0] / (time.monotonic() - started))


asyncio.run(main())
"""

PROJECT = """
apis:
  - name: iris
    model: {path: model.onnx, intra_op_threads: 1, inter_op_threads: 1}
"""


def grpc_ready(address: str) -> bool:
    import grpc

    with grpc.insecure_channel(address) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=1)
        except grpc.FutureTimeoutError:
            return False
    return True


def load(client: Path, kind: str, target: str, concurrency: int, seconds: float, pin: str | None) -> float:
    prefix = ["taskset", "-c", pin] if pin else []
    done = subprocess.run(
        [*prefix, sys.executable, str(client), kind, target, str(concurrency), str(seconds)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    return float(done.stdout.strip())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args()
    server_cpu, client_cpu = cpus(args.pin)
    levels = [int(level) for level in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        iris_model(root / "model.onnx")
        (root / "modelserve.yaml").write_text(textwrap.dedent(PROJECT))
        (root / "bare.py").write_text(BARE)
        client = root / "client.py"
        client.write_text(CLIENT)
        grpc_port, bare_port = free_port(), free_port()
        modelserve = ServerProcess(
            "modelserve",
            [
                sys.executable,
                "-m",
                "modelserve",
                str(root),
                "--port",
                "{port}",
                "--grpc-port",
                str(grpc_port),
                "--no-access-log",
                "--log-level",
                "warning",
            ],
            REPO,
            server_cpu,
        )
        bare = ServerProcess(
            "bare", [sys.executable, str(root / "bare.py"), str(root / "model.onnx"), str(bare_port)], REPO, server_cpu
        )
        try:
            for server, address in ((modelserve, f"127.0.0.1:{grpc_port}"), (bare, f"127.0.0.1:{bare_port}")):
                deadline = time.monotonic() + 120
                while not grpc_ready(address):
                    if server.process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{server.name} did not start:\n{server.output()}")
            targets = {
                "grpc": ("grpc", f"127.0.0.1:{grpc_port}"),
                "bare": ("grpc", f"127.0.0.1:{bare_port}"),
                "rest-binary": ("rest", modelserve.url),
            }
            print(f"iris, {args.duration:g} s x {args.repeats} rounds; req/s (median of rounds)\n")
            print(f"{'streams':>8} {'grpc':>9} {'bare':>9} {'grpc/bare':>10} {'rest-binary':>12}")
            for level in levels:
                rounds: dict[str, list[float]] = {name: [] for name in targets}
                for _ in range(args.repeats):
                    for name, (kind, target) in targets.items():
                        rounds[name].append(load(client, kind, target, level, args.duration, client_cpu))
                ratio = statistics.median(g / b for g, b in zip(rounds["grpc"], rounds["bare"], strict=True))
                cells = {name: statistics.median(values) for name, values in rounds.items()}
                print(
                    f"{level:>8} {cells['grpc']:>9.0f} {cells['bare']:>9.0f} {ratio:>9.2f}x "
                    f"{cells['rest-binary']:>12.0f}"
                )
        finally:
            modelserve.stop()
            bare.stop()


if __name__ == "__main__":
    main()
