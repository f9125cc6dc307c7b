"""The V2 routes' cost per request in one process, against the bare route: v2.py's five targets without the
network, wrk or a second process.

Each app sits behind uvicorn's own httptools protocol (modelserve's behind the protocol its CLI uses), and
the protocol is fed the raw bytes of a keep-alive request, one at a time, through a transport that keeps
what is written: everything from the parser to the last write is the server's real code, and nothing else
runs. On a shared machine, two servers measured over the network seconds apart swing by a fifth between
runs (issue 18's v2-json target is 0.9x); here each round times every target in turn, 2,000 requests each,
and the figures are the best round and the median of the within-round ratios.

    python benchmarks/v2_inprocess.py [--rounds 9] [--requests 2000] [--models iris,mlp]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState
from v2 import BARE_APP, RATIOS, TARGETS, WIDTHS, model_folder, requests_of

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import modelserve  # noqa: E402
from modelserve.http._protocol import TransportConfig  # noqa: E402


class Transport(asyncio.Transport):
    """What the protocol writes is kept; nothing goes anywhere."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.written.append(bytes(data))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def raw_request(path: str, body: bytes, headers: dict[str, str]) -> bytes:
    """The request wrk sends for v2.py (as JSON unless `headers` say otherwise)."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1:8000", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in ({"Content-Type": "application/json"} | headers).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Target:
    """One app behind one protocol instance (one keep-alive connection), fed one request over and over."""

    def __init__(self, config: Config, protocol: type[HttpToolsProtocol], data: bytes) -> None:
        self.protocol = protocol(config, ServerState(), {}, asyncio.get_running_loop())
        self.transport = Transport()
        self.protocol.connection_made(self.transport)
        self.data = data

    async def answer(self) -> bytes:
        """Feed the request, run the loop until the answer's head and body are written (two writes)."""
        written = self.transport.written
        self.protocol.data_received(self.data)
        while len(written) < 2:
            await asyncio.sleep(0)
        answer = b"".join(written)
        written.clear()
        return answer

    async def timed(self, requests: int) -> float:
        """Microseconds per request of `requests` in a row."""
        started = time.perf_counter()
        for _ in range(requests):
            await self.answer()
        return (time.perf_counter() - started) / requests * 1e6


async def run_model(model: str, folder: Path, rounds: int, requests: int) -> dict[str, list[float]]:
    namespace: dict[str, Any] = {}
    exec(textwrap.dedent(BARE_APP), namespace)  # the same bare route as v2.py's server
    bare = namespace["make_app"](str(folder / "model.onnx"))
    served = modelserve.create_app(str(folder))
    await served.server.wait_loaded()
    configs = {
        "modelserve": TransportConfig(served, access_log=False, lifespan="off"),
        "bare": Config(bare, access_log=False, lifespan="off", http="httptools"),
    }
    for config in configs.values():
        config.load()
    protocols = {"modelserve": configs["modelserve"].http, "bare": HttpToolsProtocol}
    kinds = requests_of(WIDTHS[model])
    targets = {}
    for target, server, path, kind in TARGETS:
        body, headers = kinds[kind]
        targets[target] = Target(configs[server], protocols[server], raw_request(path, body, headers))
    answers = {name: await target.answer() for name, target in targets.items()}
    for name, answer in answers.items():
        head, _, body = answer.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200") or f"content-length: {len(body)}".encode() not in head.lower():
            raise SystemExit(f"{model} {name}: not one whole 200 answer in two writes: {answer[:300]!r}")
    for target in targets.values():  # warm up: the runtimes' estimates, the allocator, the caches
        await target.timed(requests // 4)
    results: dict[str, list[float]] = {name: [] for name in targets}
    for _ in range(rounds):
        for name, target in targets.items():
            results[name].append(await target.timed(requests))
    await served.server.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="rounds; every target is timed once a round")
    parser.add_argument("--requests", type=int, default=2000, help="requests per target per round")
    parser.add_argument("--models", default="iris,mlp", help="models, comma-separated (iris, mlp)")
    args = parser.parse_args()
    import onnxruntime

    print(
        f"V2 in one process: {args.rounds} rounds x {args.requests} requests per target, uvicorn's httptools "
        f"protocol fed raw requests, python {sys.version.split()[0]}, onnxruntime {onnxruntime.__version__}"
    )
    print(f"{'model':<6}  {'target':<12}{'best us':>9}{'median us':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            folder = model_folder(Path(tmp), model)
            results = asyncio.run(run_model(model, folder, args.rounds, args.requests))
            for i, (name, values) in enumerate(results.items()):
                print(f"{model if i == 0 else '':<6}  {name:<12}{min(values):>9.1f}{statistics.median(values):>11.1f}")
            cells = []
            for label, target, base in RATIOS:
                within = [b / t for t, b in zip(results[target], results[base], strict=True)]
                # a speed ratio: base time over target time (0.9x: the target takes 1/0.9 of the base's time)
                best = min(results[base]) / min(results[target])
                cells.append(f"{label}: {best:.2f}x best, {statistics.median(within):.2f}x median")
            print("\n".join("        " + cell for cell in cells))


if __name__ == "__main__":
    main()
