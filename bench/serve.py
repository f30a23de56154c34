"""Serve mode's time to first token against the policy's own, paired per trial.

Load shape. A scripted streaming policy (`tests/serve_fixtures.py:
ScriptedPolicyServer`, vLLM's `/v1/completions` stream protocol) says a
200-token turn, one token every 20 ms, in its own process.
`forge-record serve --policy` (recorder + gateway) runs in front of it in
another; the gateway alone (no recorder) in a third, to show where the time
goes. This process is the harness. A trial asks, for each API (Anthropic
Messages, Responses, Chat Completions), the policy directly, the gateway and
forge-record for the same turn, one after the other in an order that rotates
with the trial; each request starts once the one before it has its first text
(+50 ms), every stream is read to its end, and at most `--parallel` are in
flight (the earlier ones still streaming: that is the load). Each is timed from
the request to the first generated text in the answer's stream
(`content_block_delta`, `response.output_text.delta`, a chunk with
`content`; the policy's own: its first token chunk). "Added" is a trial's
TTFT minus the same trial's policy TTFT, so machine load that drifts over the
run falls on both sides of each difference. Each request names itself with a
`[[marker]]` the policy stamps (when it had the prompt, when its first token
left), which splits serve mode's added time into the request side (harness
to policy) and the token side (policy's first token to the harness's text).

    .venv/bin/python bench/serve.py              # 12 trials per API, 4 streams in flight (~3 min)
    .venv/bin/python bench/serve.py --quick      # 4 trials

Target (issue 15): at most 5 ms added at p50. Before serve mode streamed,
the harness's first byte of text came when the whole generation was done:
the "whole generation" column.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from forgerl import printer  # noqa: E402
from forgerl.recorder.control import RecorderControl  # noqa: E402
from forgerl.recorder.proxy import free_port  # noqa: E402
from forgerl.recorder.sse import SSEDecoder  # noqa: E402
from serve_fixtures import FIRST_TEXT, TOKENIZER_DIR  # noqa: E402

TOKENS, PACE_S = 200, 0.02
POLICY = f"""
import sys, time
sys.path.insert(0, {str(REPO / 'tests')!r})
from aiohttp import web
from transformers import AutoTokenizer
from serve_fixtures import TOKENIZER_DIR, ScriptedPolicyServer
tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
words = " ".join(f"w{{n}}" for n in range(400))
text = tok.decode(tok.encode(words)[:{TOKENS - 1}])

class Turns(dict):
    def __missing__(self, name):  # every [[marker]] says the same turn
        return text

class Stamped(ScriptedPolicyServer):
    received = {{}}

    def routes(self, app):
        super().routes(app)
        app.router.add_get("/stamps", self.stamps)

    def _turn(self, prompt):
        said = super()._turn(prompt)
        self.received[said[0]] = time.monotonic()
        return said

    async def stamps(self, request):  # marker -> [prompt in, first token out]
        return web.json_response({{s.turn: [self.received[s.turn], s.first_sent] for s in self.said}})

with Stamped(tok, Turns(), delay_s={PACE_S}) as server:
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

CONFIGS = ("policy", "gateway", "serve")
Timing = tuple[float, float, float, float]  # TTFT, whole stream (s); when sent, when the first text came (monotonic)


@functools.cache
def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def _direct_body(text: str) -> dict:
    """The policy asked directly (`/v1/completions`) for the turn a harness's `text` asks for."""
    tok = _tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return {"model": "m", "prompt": tok.encode(prompt, add_special_tokens=False), "max_tokens": 1024, "stream": True,
            "return_token_ids": True, "logprobs": 1}


def _ttft(timing: Timing, stamp: list[float]) -> float:
    return timing[0]


def _request_side(timing: Timing, stamp: list[float]) -> float:
    """From sending the request until the policy has the prompt."""
    return stamp[0] - timing[2]


def _token_side(timing: Timing, stamp: list[float]) -> float:
    """From the policy's first token leaving until the harness has it as text."""
    return timing[3] - stamp[1]


def _direct_first(data: dict) -> bool:
    return bool(data["choices"][0].get("token_ids"))


async def timed(session: aiohttp.ClientSession, url: str, body: dict, first, started: asyncio.Future) -> Timing:
    """One streamed request, read to its end; `started` is set at the first text."""
    sent = time.monotonic()
    first_at = None
    try:
        async with session.post(url, json=body) as response:
            response.raise_for_status()
            decoder = SSEDecoder()
            async for chunk in response.content.iter_any():
                for event in decoder.feed(chunk):
                    if first_at is None and event.data.strip() != "[DONE]" and first(json.loads(event.data)):
                        first_at = time.monotonic()
                        started.set_result(None)
    finally:
        if not started.done():
            started.set_result(None)
    if first_at is None:
        raise RuntimeError(f"{url}: no generated text in the stream")
    return first_at - sent, time.monotonic() - sent, sent, first_at


async def trials(urls: dict[str, str], n: int, parallel: int) -> tuple[dict, dict]:
    """(trial, api, config) -> `Timing` for `n` trials of every API through every config, and the policy's
    stamps: (trial, api, config) -> (when it had the prompt, when its first token left)."""
    gate = asyncio.Semaphore(parallel)
    timings: dict[tuple[int, str, str], Timing] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        async def one(key: tuple[int, str, str], url: str, body: dict, first, started: asyncio.Future) -> None:
            async with gate:
                timings[key] = await timed(session, url, body, first, started)

        loop = asyncio.get_running_loop()
        await asyncio.gather(*(timed(session, urls[config] + path, body_of("hi"), first, loop.create_future())
                               for path, body_of, first in FIRST_TEXT.values()  # warm up: imports, templates
                               for config in CONFIGS[1:]))
        tasks = []
        for trial in range(n):
            for api, (path, body_of, first) in FIRST_TEXT.items():
                order = CONFIGS[trial % 3:] + CONFIGS[:trial % 3]
                for config in order:
                    marker = f"[[t{trial}_{api}_{config}]]"  # names the request in the policy's stamps
                    url, body, is_first = ((urls[config] + "/v1/completions", _direct_body(marker), _direct_first)
                                           if config == "policy" else (urls[config] + path, body_of(marker), first))
                    if config == "serve":
                        url = url.replace("/s/bench", f"/s/bench-{api}")
                    started = loop.create_future()
                    tasks.append(asyncio.create_task(one((trial, api, config), url, body, is_first, started)))
                    await started
                    await asyncio.sleep(0.05)
        await asyncio.gather(*tasks)
        async with session.get(urls["policy"] + "/stamps") as response:
            stamps = await response.json()
    return timings, {key: stamps[f"t{key[0]}_{key[1]}_{key[2]}"] for key in timings}


def p(values: list[float], q: int) -> float:
    """The q-th percentile, in ms."""
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] * 1000 if len(values) > 1 else values[0] * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=12, help="trials per API (default 12)")
    parser.add_argument("--parallel", type=int, default=4, help="streams in flight at most (default 4)")
    parser.add_argument("--quick", action="store_true", help="4 trials per API")
    args = parser.parse_args()
    n = 4 if args.quick else args.trials
    policy = subprocess.Popen([sys.executable, "-c", POLICY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    policy_url = policy.stdout.readline().strip()
    gateway = subprocess.Popen([sys.executable, "-c", GATEWAY, policy_url], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    gateway_url = gateway.stdout.readline().strip()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="forge-bench-serve-") as out:
        serve = subprocess.Popen([str(REPO / ".venv" / "bin" / "forge-record"), "serve", "--policy", policy_url,
                                  "--tokenizer", str(TOKENIZER_DIR), "--served-model", "m", "--listen",
                                  f"127.0.0.1:{port}", "--out", out, "--max-tokens", "1024"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        try:
            RecorderControl(f"http://127.0.0.1:{port}").wait_ready(120, alive=lambda: serve.poll() is None)
            load_before = os.getloadavg()[0]
            timings, stamps = asyncio.run(trials({"policy": policy_url, "gateway": gateway_url,
                                                  "serve": f"http://127.0.0.1:{port}/s/bench"}, n, args.parallel))
            load = (load_before, os.getloadavg()[0])
        finally:
            serve.terminate()
            serve.wait(30)
            for child in (gateway, policy):
                child.stdin.close()
                child.wait(30)
    print_table(timings, stamps, n, args.parallel, load)
    return 0


def print_table(timings: dict, stamps: dict, n: int, parallel: int, load: tuple[float, float]) -> None:
    rows = []
    for api in FIRST_TEXT:
        def of(config: str, value) -> list[float]:
            return [value(timings[(trial, api, config)], stamps[(trial, api, config)]) for trial in range(n)]

        def added(config: str, value) -> list[float]:
            return [mine - own for mine, own in zip(of(config, value), of("policy", value))]

        ttft, request_side, token_side = _ttft, _request_side, _token_side
        whole = p(of("policy", lambda timing, stamp: timing[1]), 50)
        rows.append([api, f"{p(of('policy', ttft), 50):.1f}", f"{p(added('gateway', ttft), 50):+.1f}",
                     f"{p(added('gateway', ttft), 90):+.1f}", f"{p(added('serve', ttft), 50):+.1f}",
                     f"{p(added('serve', ttft), 90):+.1f}", f"{p(added('serve', request_side), 50):+.1f}",
                     f"{p(added('serve', token_side), 50):+.1f}", f"{p(of('serve', ttft), 50):.1f}", f"{whole:.0f}",
                     f"{p(of('serve', ttft), 50) / whole:.4f}"])
    printer.show(printer.table(
        ["API", "policy TTFT p50", "gateway added p50", "gateway added p90", "serve added p50", "serve added p90",
         "serve request side p50", "serve token side p50", "serve TTFT p50", "whole generation p50",
         "TTFT / whole generation"], rows,
        title=f"serve mode TTFT: {TOKENS} tokens at {PACE_S * 1000:.0f} ms, {n} paired trials per API, at most "
              f"{parallel} streams in flight; load average {load[0]:.1f} -> {load[1]:.1f} on {os.cpu_count()} "
              "cores (ms)",
        caption="target: serve added p50 <= +5 ms (before: the first text came with the whole generation); added = a "
                "trial's TTFT minus the same trial's policy TTFT; serve's request side: what it adds from sending the "
                "request until the policy has the prompt, token side: from the policy's first token leaving until the "
                "harness has the text (the policy's stamps); gateway = the policy gateway alone, serve = forge-record "
                "serve --policy (recorder + gateway)", style=printer.MARKDOWN))


if __name__ == "__main__":
    sys.exit(main())
