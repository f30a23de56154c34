"""Serve mode's time to first token against the policy's own.

Load shape. A scripted streaming policy (`tests/serve_fixtures.py:
ScriptedPolicyServer`, vLLM's `/v1/completions` stream protocol) says a
200-token turn, one token every 20 ms, in its own process.
`forge-record serve --policy` (recorder + gateway) runs in front of it in
another; the gateway alone (no recorder) in a third, to show where the time
goes. This process is the harness: it sends streamed requests in each API
(Anthropic Messages, Responses, Chat Completions; `--parallel` at a time)
and times each from the request to the first generated text in the answer's
stream (`content_block_delta`, `response.output_text.delta`, a chunk with
`content`). The peer is the policy asked directly for the same tokens: its
time to the first token chunk.

    .venv/bin/python bench/serve.py              # 12 requests per API, 2 in flight (~2 min)
    .venv/bin/python bench/serve.py --quick      # 4 per API

Target (issue 15): at most 5 ms added at p50. Before serve mode streamed,
the harness's first byte of text came when the whole generation was done:
the "whole generation" column.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from forgerl.recorder.control import RecorderControl  # noqa: E402
from forgerl.recorder.proxy import free_port  # noqa: E402
from forgerl.recorder.sse import SSEDecoder  # noqa: E402

TOKENS, PACE_S = 200, 0.02
POLICY = f"""
import sys, time
sys.path.insert(0, {str(REPO / 'tests')!r})
from transformers import AutoTokenizer
from serve_fixtures import TOKENIZER_DIR, ScriptedPolicyServer
tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
words = " ".join(f"w{{n}}" for n in range(400))
text = tok.decode(tok.encode(words)[:{TOKENS - 1}])
with ScriptedPolicyServer(tok, {{"default": text}}, delay_s={PACE_S}) as server:
    print(server.url, flush=True)
    sys.stdin.read()
"""
GATEWAY = f"""
import sys
sys.path.insert(0, {str(REPO / 'tests')!r})
from serve_fixtures import TOKENIZER_DIR
from forgerl.recorder.policy import HTTPPolicy
from forgerl.recorder.serve import GatewayThread, PolicyGateway, load_tokenizer, tool_format
tok = load_tokenizer(str(TOKENIZER_DIR))
gateway = PolicyGateway(HTTPPolicy(sys.argv[1], "m"), tok, "m", fmt=tool_format(tok, None))
with GatewayThread(gateway) as url:
    print(url, flush=True)
    sys.stdin.read()
"""

# api -> (path, body, is this SSE event the first generated text?)
APIS = {
    "anthropic": ("/v1/messages", {"model": "m", "max_tokens": 1024, "stream": True,
                                   "messages": [{"role": "user", "content": "hi"}]},
                  lambda data: data.get("type") == "content_block_delta"),
    "responses": ("/v1/responses", {"model": "m", "input": "hi", "stream": True},
                  lambda data: data.get("type") == "response.output_text.delta"),
    "chat": ("/v1/chat/completions", {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
             lambda data: any((c.get("delta") or {}).get("content") for c in data.get("choices") or [])),
}


async def timed(session: aiohttp.ClientSession, url: str, body: dict, first) -> tuple[float, float]:
    """(seconds to the first generated text, seconds to the end of the stream)."""
    start = time.perf_counter()
    ttft = None
    async with session.post(url, json=body) as response:
        response.raise_for_status()
        decoder = SSEDecoder()
        async for chunk in response.content.iter_any():
            for event in decoder.feed(chunk):
                if ttft is None and event.data.strip() != "[DONE]" and first(json.loads(event.data)):
                    ttft = time.perf_counter() - start
    if ttft is None:
        raise RuntimeError(f"{url}: no generated text in the stream")
    return ttft, time.perf_counter() - start


async def run(url: str, body: dict, first, n: int, parallel: int) -> list[tuple[float, float]]:
    gate = asyncio.Semaphore(parallel)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def one() -> tuple[float, float]:
            async with gate:
                return await timed(session, url, body, first)
        return list(await asyncio.gather(*(one() for _ in range(n))))


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000 if len(values) > 1 else values[0] * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=12, help="requests per API (default 12)")
    parser.add_argument("--parallel", type=int, default=2, help="requests in flight (default 2)")
    parser.add_argument("--quick", action="store_true", help="4 requests per API")
    args = parser.parse_args()
    n = 4 if args.quick else args.requests
    policy = subprocess.Popen([sys.executable, "-c", POLICY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    policy_url = policy.stdout.readline().strip()
    gateway = subprocess.Popen([sys.executable, "-c", GATEWAY, policy_url], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    gateway_url = gateway.stdout.readline().strip()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="forge-bench-serve-") as out:
        from serve_fixtures import TOKENIZER_DIR

        serve = subprocess.Popen([str(REPO / ".venv" / "bin" / "forge-record"), "serve", "--policy", policy_url,
                                  "--tokenizer", str(TOKENIZER_DIR), "--served-model", "m", "--listen",
                                  f"127.0.0.1:{port}", "--out", out, "--max-tokens", "1024"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            RecorderControl(f"http://127.0.0.1:{port}").wait_ready(120, alive=lambda: serve.poll() is None)
            prompt = {"model": "m", "prompt": [151644, 872, 198, 6023], "max_tokens": 1024, "stream": True,
                      "return_token_ids": True, "logprobs": 1}
            direct_first = lambda data: bool(data["choices"][0].get("token_ids"))  # noqa: E731
            for path, body, first in APIS.values():  # warm up: first calls pay imports and template compiles
                for base in (gateway_url, f"http://127.0.0.1:{port}/s/warm"):
                    asyncio.run(run(base + path, body, first, 1, 1))
            rows = []
            for api, (path, body, first) in APIS.items():
                direct = asyncio.run(run(policy_url + "/v1/completions", prompt, direct_first, n, args.parallel))
                alone = asyncio.run(run(gateway_url + path, body, first, n, args.parallel))
                served = asyncio.run(run(f"http://127.0.0.1:{port}/s/bench-{api}{path}", body, first, n,
                                         args.parallel))
                rows.append((api, direct, alone, served))
        finally:
            serve.terminate()
            serve.wait(30)
            for child in (gateway, policy):
                child.stdin.close()
                child.wait(30)
    print_table(rows, n, args.parallel)
    return 0


def print_table(rows: list, n: int, parallel: int) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"serve mode TTFT: {TOKENS} tokens at {PACE_S * 1000:.0f} ms, {n} requests per API, "
                        f"{parallel} in flight (ms)", box=box.MARKDOWN, title_justify="left")
    for name in ("API", "policy TTFT p50", "gateway TTFT p50", "gateway added p50", "serve TTFT p50",
                 "serve TTFT p99", "serve added p50", "serve / policy p50", "whole generation p50",
                 "TTFT / whole generation"):
        table.add_column(name, justify="left" if name == "API" else "right")
    for api, direct, alone, served in rows:
        policy_p50, served_p50 = p([t for t, _ in direct], 50), p([t for t, _ in served], 50)
        alone_p50, whole = p([t for t, _ in alone], 50), p([total for _, total in direct], 50)
        table.add_row(api, f"{policy_p50:.1f}", f"{alone_p50:.1f}", f"{alone_p50 - policy_p50:+.1f}",
                      f"{served_p50:.1f}", f"{p([t for t, _ in served], 99):.1f}", f"{served_p50 - policy_p50:+.1f}",
                      f"{served_p50 / policy_p50:.2f}x", f"{whole:.0f}", f"{served_p50 / whole:.4f}")
    Console(width=200).print(table)
    print("target: serve added p50 <= +5 ms (before: the first text came with the whole generation); "
          "gateway = the policy gateway alone, serve = forge-record serve --policy (recorder + gateway)")


if __name__ == "__main__":
    sys.exit(main())
