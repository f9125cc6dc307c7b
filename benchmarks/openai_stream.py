"""OpenAI streaming through modelserve against a bare Starlette SSE route yielding the same tokens.

Two servers, each its own process on CPU 0 (the client on CPU 1 with ``--pin``, the default on 2 or more cores):

- **modelserve**: an API with ``openai: chat`` whose predict is an async generator of `--tokens` tokens; modelserve
  builds each ``chat.completion.chunk`` event, the final chunk and ``data: [DONE]``;
- **bare**: a Starlette app under uvicorn, one POST route returning a ``StreamingResponse`` of the same events
  (the same JSON envelope per token, encoded with orjson), as a hand-written OpenAI endpoint would.

A client (httpx, keep-alive) posts the same chat request `--requests` times to each, in turns, and reads the
stream: **first token** is the time from sending the request to the first event that carries content,
**tokens/s** the tokens over the time from that event to ``[DONE]``. The table gives the p50 and p90 of the first
token and the median tokens/s, and modelserve's tokens/s as a fraction of the bare route's::

    python benchmarks/openai_stream.py
    python benchmarks/openai_stream.py --tokens 1000 --requests 50
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._harness import ServerProcess  # noqa: E402

MODEL = """
class Tokens:
    async def predict(self, inputs):
        return self.tokens(int(inputs.get("max_tokens") or 16))

    async def tokens(self, count):
        for _ in range(count):
            yield "tok "
"""

CONFIG = """
apis:
  - name: chat
    handler: {path: model.py, class: Tokens}
    openai: chat
"""

BARE = """
import time

import orjson
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route


def event(text, finish, created):
    delta = {"content": text} if text else {}
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": created, "model": "chat",
             "choices": [choice]}
    return b"data: " + orjson.dumps(chunk) + b"\\n\\n"


async def chat(request):
    body = orjson.loads(await request.body())
    count = int(body.get("max_tokens") or 16)
    created = int(time.time())

    async def events():
        yield event(None, None, created)
        for _ in range(count):
            yield event("tok ", None, created)
        yield event(None, "stop", created) + b"data: [DONE]\\n\\n"

    return StreamingResponse(events(), media_type="text/event-stream")


app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
"""


def one_stream(client: httpx.Client, url: str, tokens: int) -> tuple[float, float]:
    """(seconds to the first content event, tokens per second after it) of one streamed request."""
    body = {"model": "chat", "messages": [{"role": "user", "content": "go"}], "stream": True, "max_tokens": tokens}
    started = time.perf_counter()
    first = None
    seen = 0
    with client.stream("POST", url + "/v1/chat/completions", json=body) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if '"content":"tok ' in line:
                seen += 1
                if first is None:
                    first = time.perf_counter()
            elif line == "data: [DONE]":
                break
    ended = time.perf_counter()
    assert first is not None and seen == tokens, f"{url}: {seen} tokens of {tokens}"
    return first - started, (seen - 1) / max(ended - first, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None)
    args = parser.parse_args()
    pin = args.pin if args.pin is not None else (os.cpu_count() or 1) >= 2
    server_cpu = "0" if pin else None
    if pin:
        os.sched_setaffinity(0, {1})
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        (root / "project").mkdir()
        (root / "project" / "modelserve.yaml").write_text(textwrap.dedent(CONFIG))
        (root / "project" / "model.py").write_text(textwrap.dedent(MODEL))
        (root / "bare.py").write_text(textwrap.dedent(BARE))
        python = sys.executable
        servers = {
            "modelserve": ServerProcess(
                "modelserve", [python, "-m", "modelserve", str(root / "project"), "--no-access-log"], root, server_cpu
            ),
            "bare": ServerProcess(
                "bare",
                [python, "-m", "uvicorn", "bare:app", "--no-access-log", "--log-level", "warning", "--port", "{port}"],
                root,
                server_cpu,
            ),
        }
        try:
            servers["modelserve"].wait_ready(lambda url: httpx.get(url + "/readyz").status_code == 200)
            servers["bare"].wait_ready(lambda url: httpx.post(url + "/v1/chat/completions", json={}).status_code == 200)
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in servers}
            with httpx.Client(timeout=60) as client:
                for server in servers.values():  # warm up
                    for _ in range(3):
                        one_stream(client, server.url, args.tokens)
                for _ in range(args.requests):
                    for name, server in servers.items():  # in turns: a busy moment hits both
                        results[name].append(one_stream(client, server.url, args.tokens))
        finally:
            for server in servers.values():
                server.stop()
    print(f"{args.tokens} tokens per request, {args.requests} requests each, pinned: {pin}\n")
    print("| server | first token p50 ms | first token p90 ms | tokens/s (median) | vs bare |")
    print("|---|---:|---:|---:|---:|")
    bare_rate = statistics.median(rate for _, rate in results["bare"])
    for name, runs in results.items():
        firsts = sorted(first for first, _ in runs)
        rate = statistics.median(rate for _, rate in runs)
        p90 = firsts[min(len(firsts) - 1, int(len(firsts) * 0.9))]
        print(
            f"| {name} | {statistics.median(firsts) * 1000:.2f} | {p90 * 1000:.2f} | {rate:,.0f} | "
            f"{rate / bare_rate:.2f}x |"
        )


if __name__ == "__main__":
    main()
