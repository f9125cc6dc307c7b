"""gRPC inference: modelserve's ``--grpc-port`` against a bare ``grpc.aio`` servicer running the same ONNX model,
and against modelserve's own V2 REST binary route.

One model, ``iris`` (`onnx_overhead.iris_model`: x float32 [N, 4] -> probabilities float32 [N, 3]), and the
same onnxruntime options everywhere (CPU provider, one intra-op and one inter-op thread). Servers, each its
own process on the server's CPU:

* ``modelserve``: ``python -m modelserve DIR --grpc-port P``; the gRPC ``ModelInfer`` of one row sent in
  ``raw_input_contents`` (``grpc``), and the V2 REST route with the row as binary data
  (``Inference-Header-Content-Length``, the answer binary too): ``rest-binary``;
* ``bare``: a ``grpc.aio`` server whose one method reads the raw input with ``np.frombuffer``, calls
  ``session.run`` and answers the raw output, none of modelserve's checks, line, metrics or statistics;
* with ``--before DIR``, modelserve from another checkout (``git worktree add /tmp/grpc-before HEAD``) as
  ``grpc-before``: a change to the gRPC path measured against the code before it, in the same run.

The gRPC client is a process of its own on the other CPU: `concurrency` coroutines, each calling in a loop for
`duration` seconds over one channel. ``rest-binary`` is loaded by wrk (one thread, `concurrency` connections,
the same binary body), whose client costs far less per request than a Python one: each column is what the
server gives, and ``us/req`` beside it the server's CPU time per answered request (user + system of its
process), which a busy machine disturbs less than req/s. Every cell is the median of the rounds (the targets
take turns within a round, in an order that rotates from round to round); a ratio is the median of the ratios
within a round, and ``spread`` the lowest and highest of ``grpc``'s ratios to ``bare`` within a round (how far one
round moves by itself on the machine). The target of issue 33: ``grpc`` at least 0.9x ``bare`` at 1, 16 and 64
concurrent streams.

With ``--in-process``, no network: the servicer's ``ModelInfer`` called in a loop with a stand-in context (the
same message each time, handed over as the checkout's own request deserializer hands it), each answer
serialized as gRPC would (modelserve's may be its bytes already: `modelserve.grpc.codec.RawAnswer`),
alternating round by round with the bare servicer's handler and its answer's serialization in the same process,
each checkout (this one, and ``--before``'s) in a process of its own pinned to the server's CPU; ``us/call``
is the median of the rounds, ``above bare`` modelserve's median cost above the bare handler's and ``x bare``
the median of its ratios to it within a round (which moves less with the machine's speed). A shared
machine disturbs this far less than the network runs: decide with it, confirm over the network.

    python benchmarks/grpc_infer.py [--duration 2] [--repeats 3] [--concurrency 1,16,64] [--pin]
    python benchmarks/grpc_infer.py --before /tmp/grpc-before
    python benchmarks/grpc_infer.py --in-process [--before /tmp/grpc-before] [--repeats 15]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _harness import REPO, ServerProcess, cpus, free_port, measure, write_wrk_script
from onnx_overhead import iris_model

#: The bare servicer's one method and its session, the same text in the bare server and in-process: the
#: model's path is the script's first argument.
HANDLER = """
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
"""

BARE = (
    """
import asyncio, sys

import grpc
import numpy as np
import onnxruntime

from modelserve.grpc._proto import grpc_service_pb2 as pb

"""
    + HANDLER
    + """

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
)

CLIENT = """
import asyncio, sys, time

import grpc
import numpy as np

from modelserve.grpc._proto import grpc_service_pb2 as pb

target, concurrency, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
row = np.array([[5.1, 3.5, 1.4, 0.2]], np.float32)


async def loop(call, request, end, counts):
    while time.monotonic() < end:
        await call(request)
        counts[0] += 1


async def main():
    counts = [0]
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
        await asyncio.gather(*(loop(call, request, end, counts) for _ in range(concurrency)))
    print(counts[0] / (time.monotonic() - started), counts[0])


asyncio.run(main())
"""

IN_PROCESS = (
    """
import asyncio, statistics, sys, time

import numpy as np
import onnxruntime

from modelserve.config import load_project_config
from modelserve.grpc import server as server_module
from modelserve.grpc._proto import grpc_service_pb2 as pb
from modelserve.grpc.servicer import InferenceServicer
from modelserve.server import ModelServer

root, rounds, calls = sys.argv[1].rsplit("/", 1)[0], int(sys.argv[2]), int(sys.argv[3])
"""
    + HANDLER
    + """

class Context:
    def invocation_metadata(self):
        return (("user-agent", "grpc-python-asyncio/1"),)

    def add_done_callback(self, callback):
        pass


async def main():
    server = ModelServer(load_project_config(root))
    server.start()
    await server.wait_loaded()
    servicer = InferenceServicer(server, None)
    request = pb.ModelInferRequest(model_name="iris")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.array([[5.1, 3.5, 1.4, 0.2]], np.float32).tobytes())
    context = Context()
    # What the checkout's own request deserializer hands its servicer (`server.sized`).
    sized = server_module.sized(pb.ModelInferRequest.FromString)(request.SerializeToString())

    async def ours():
        answer = await servicer.ModelInfer(sized, context)
        return answer if type(answer) is bytes else answer.SerializeToString()

    async def bare():
        return (await infer(request, context)).SerializeToString()

    assert pb.ModelInferResponse.FromString(await ours()).raw_output_contents == (
        pb.ModelInferResponse.FromString(await bare()).raw_output_contents)
    times = {"modelserve": [], "bare": []}
    for _ in range(rounds):
        for name, handler in (("modelserve", ours), ("bare", bare)):
            started = time.perf_counter()
            for _ in range(calls):
                await handler()
            times[name].append((time.perf_counter() - started) / calls * 1e6)
    above = statistics.median(a - b for a, b in zip(times["modelserve"], times["bare"]))
    ratio = statistics.median(a / b for a, b in zip(times["modelserve"], times["bare"]))
    print(statistics.median(times["modelserve"]), statistics.median(times["bare"]), above, ratio)
    server.close()


asyncio.run(main())
"""
)

PROJECT = """
apis:
  - name: iris
    model: {path: model.onnx, intra_op_threads: 1, inter_op_threads: 1}
"""
#: The V2 binary request of one row (its JSON header, then the row's 16 bytes), answered in binary too.
HEADER = (
    b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,4],"parameters":{"binary_data_size":16}}],'
    b'"parameters":{"binary_data_output":true}}'
)
ROW = struct.pack("<4f", 5.1, 3.5, 1.4, 0.2)


def grpc_ready(address: str) -> bool:
    import grpc

    with grpc.insecure_channel(address) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=1)
        except grpc.FutureTimeoutError:
            return False
    return True


def load_grpc(
    client: Path, server: ServerProcess, target: str, concurrency: int, seconds: float, pin: str | None
) -> tuple[float, float]:
    """(req/s, the server's CPU microseconds per request) of one run of the gRPC client."""
    prefix = ["taskset", "-c", pin] if pin else []
    before = server.cpu_seconds()
    done = subprocess.run(
        [*prefix, sys.executable, str(client), target, str(concurrency), str(seconds)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    rate, count = done.stdout.split()
    return float(rate), (server.cpu_seconds() - before) / max(int(count), 1) * 1e6


def modelserve_server(name: str, checkout: Path, root: Path, grpc_port: int, pin: str | None) -> ServerProcess:
    """``python -m modelserve`` of `checkout` (its folder first on the path: ``-m`` puts the working directory
    before PYTHONPATH and the installed package)."""
    command = [sys.executable, "-m", "modelserve", str(root), "--port", "{port}", "--grpc-port", str(grpc_port)]
    command += ["--no-access-log", "--log-level", "warning"]
    return ServerProcess(name, command, checkout, pin)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--before", type=Path, help="a checkout of modelserve to measure as grpc-before")
    parser.add_argument("--in-process", action="store_true", help="the servicer called in a loop, no network")
    args = parser.parse_args()
    if args.in_process:
        in_process(args.before, args.repeats, args.pin)
        return
    server_cpu, client_cpu = cpus(args.pin)
    levels = [int(level) for level in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        iris_model(root / "model.onnx")
        (root / "modelserve.yaml").write_text(textwrap.dedent(PROJECT))
        (root / "bare.py").write_text(BARE)
        client = root / "client.py"
        client.write_text(CLIENT)
        script = write_wrk_script(
            root / "rest.lua",
            HEADER + ROW,
            {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(HEADER))},
        )
        ports = {"grpc": free_port(), "bare": free_port(), "grpc-before": free_port()}
        servers = {"grpc": modelserve_server("modelserve", REPO, root, ports["grpc"], server_cpu)}
        bare_command = [sys.executable, str(root / "bare.py"), str(root / "model.onnx"), str(ports["bare"])]
        servers["bare"] = ServerProcess("bare", bare_command, REPO, server_cpu)
        if args.before is not None:
            checkout = args.before.resolve()
            servers["grpc-before"] = modelserve_server("before", checkout, root, ports["grpc-before"], server_cpu)
        try:
            for name, server in servers.items():
                deadline = time.monotonic() + 120
                while not grpc_ready(f"127.0.0.1:{ports[name]}"):
                    if server.process.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{server.name} did not start:\n{server.output()}")
            rest_url = servers["grpc"].url + "/v2/models/iris/infer"
            measure(servers["grpc"], rest_url, script, 1, 1, client_cpu)  # warm-up, and a check that it answers
            names = [*servers, "rest-binary"]
            print(f"iris, {args.duration:g} s x {args.repeats} rounds; req/s and server CPU us per request")
            print("(median of rounds); ratios: median of the ratios within a round\n")
            header = f"{'streams':>8}" + "".join(f" {name:>12} {'us/req':>7}" for name in names)
            header += f" {'grpc/bare':>10} {'spread':>10}"
            header += f" {'grpc/before':>12}" if "grpc-before" in servers else ""
            print(header)
            for level in levels:
                rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
                for index in range(args.repeats):
                    # The targets take turns in a rotating order: none always runs right after the REST run on
                    # modelserve's server, or right after another target, so neither ordering biases a ratio.
                    order = [*servers.items()]
                    order = order[index % len(order) :] + order[: index % len(order)]
                    for name, server in order:
                        target = f"127.0.0.1:{ports[name]}"
                        rounds[name].append(load_grpc(client, server, target, level, args.duration, client_cpu))
                    run = measure(servers["grpc"], rest_url, script, level, args.duration, client_cpu)
                    rounds["rest-binary"].append((run.rps, run.cpu_us))
                line = f"{level:>8}"
                for name in names:
                    rps = statistics.median(rate for rate, _ in rounds[name])
                    cpu = statistics.median(cpu for _, cpu in rounds[name])
                    line += f" {rps:>12.0f} {cpu:>7.0f}"
                line += f" {ratio(rounds['grpc'], rounds['bare']):>9.2f}x"
                low, high = spread(rounds["grpc"], rounds["bare"])
                line += f" {low:>4.2f}-{high:.2f}"
                if "grpc-before" in servers:
                    line += f" {ratio(rounds['grpc'], rounds['grpc-before']):>11.2f}x"
                print(line, flush=True)
        finally:
            for server in servers.values():
                server.stop()


def in_process(before: Path | None, rounds: int, pin: bool | None) -> None:
    """The servicer's ModelInfer against the bare handler in one process, for this checkout and `before`'s."""
    checkouts = {"modelserve": REPO} | ({"before": before.resolve()} if before is not None else {})
    prefix = ["taskset", "-c", "0"] if pin is not False and shutil.which("taskset") else []
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        iris_model(root / "model.onnx")
        (root / "modelserve.yaml").write_text(textwrap.dedent(PROJECT))
        script = root / "in_process.py"
        script.write_text(IN_PROCESS)
        print(f"iris in one process, {max(rounds, 5)} rounds of 3,000 calls each; us a call, median of rounds\n")
        print(f"{'checkout':>12} {'us/call':>9} {'bare':>9} {'above bare':>11} {'x bare':>7}")
        for name, checkout in checkouts.items():
            done = subprocess.run(
                [*prefix, sys.executable, str(script), str(root / "model.onnx"), str(max(rounds, 5)), "3000"],
                capture_output=True,
                text=True,
                cwd=checkout,
                env={"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"},
                check=True,
            )
            ours, bare, above, ratio = (float(value) for value in done.stdout.split())
            print(f"{name:>12} {ours:>9.1f} {bare:>9.1f} {above:>11.1f} {ratio:>6.2f}x", flush=True)


def ratio(runs: list[tuple[float, float]], base: list[tuple[float, float]]) -> float:
    return statistics.median(run[0] / other[0] for run, other in zip(runs, base, strict=True))


def spread(runs: list[tuple[float, float]], base: list[tuple[float, float]]) -> tuple[float, float]:
    """The lowest and the highest of the req/s ratios within a round."""
    ratios = [run[0] / other[0] for run, other in zip(runs, base, strict=True)]
    return min(ratios), max(ratios)


if __name__ == "__main__":
    main()
