"""Load generator for `bench/recorder.py`, run in its own process.

    python bench/loadgen.py stream   --url URL -c 8 --shape staggered --duration 6 --stream-len 1.0
    python bench/loadgen.py hammer   --url URL -c 32 --duration 5
    python bench/loadgen.py capacity --url URL -n 500 --chunks 50

Each load command prints one JSON object on stdout. The client is aiohttp
(its C HTTP parser keeps the generator's own cost per chunk small next to
the proxy's; httpx's pure-Python stack costs several times more CPU per
request, which on a 2-core machine would be taken from the proxy under
test). Every request opens a fresh TCP connection and closes it afterwards
(`TCPConnector(force_close=True)`), as a harness CLI launched per task does,
so the proxy's per-connection set-up is part of what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time

import aiohttp

CHAT_PATH = "/v1/chat/completions"


# ~100 words: the scripted upstream echoes the prompt, cut into its --chunks deltas (whole words).
PROMPT = " ".join(f"word{i}" for i in range(100))


def chat_body(stream: bool) -> bytes:
    return json.dumps({
        "model": "bench", "stream": stream,
        "messages": [{"role": "system", "content": "You are a benchmark."},
                     {"role": "user", "content": PROMPT}],
    }).encode()


STREAM_BODY = chat_body(True)
PLAIN_BODY = chat_body(False)
HEADERS = {"content-type": "application/json",  # FORGE_BENCH_KEY: a token, for a recorder holding the keys
           "authorization": f"Bearer {os.environ.get('FORGE_BENCH_KEY', 'sk-bench')}"}


def new_session(limit: int = 0) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(force_close=True, limit=limit, enable_cleanup_closed=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)


def _has_content(line: bytes) -> bool:
    """A `data:` line whose first choice's delta carries non-empty text."""
    if not line.startswith(b"data:") or b"[DONE]" in line:
        return False
    try:
        event = json.loads(line[5:])
        choices = event.get("choices") or []
        return bool(choices and (choices[0].get("delta") or {}).get("content"))
    except ValueError:
        return False


async def one_stream(session: aiohttp.ClientSession, url: str) -> dict:
    """One streamed chat completion; times are seconds from just before the request is sent."""
    t0 = time.perf_counter()
    ttft = None
    content_chunks = 0
    done = False
    try:
        async with session.post(url + CHAT_PATH, data=STREAM_BODY, headers=HEADERS) as resp:
            if resp.status != 200:
                await resp.read()
                return {"ok": False, "error": f"HTTP {resp.status}", "t0": t0}
            async for line in resp.content:
                if line.startswith(b"data:"):
                    if b"[DONE]" in line:
                        done = True
                    elif ttft is None:
                        if _has_content(line):
                            ttft = time.perf_counter() - t0
                            content_chunks += 1
                    elif b'"content"' in line:
                        content_chunks += 1
        total = time.perf_counter() - t0
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}", "t0": t0}
    ok = done and ttft is not None
    return {"ok": ok, "ttft": ttft, "total": total, "chunks": content_chunks, "t0": t0,
            **({} if ok else {"error": "stream ended without [DONE]" if ttft else "no content"})}


async def run_streams(url: str, concurrency: int, shape: str, duration: float, stream_len: float,
                      seed: int) -> dict:
    """C closed-loop workers for `duration` s.

    staggered: worker i first starts at U(0, stream_len), then starts its next
    stream as soon as the previous one ends, so starts stay spread out.
    lockstep: rounds in which all C start together; the next round starts
    when the slowest of the round has finished.
    """
    rng = random.Random(seed)
    results: list[dict] = []
    async with new_session() as session:
        t_begin = time.perf_counter()
        deadline = t_begin + duration
        if shape == "staggered":
            async def worker(offset: float) -> None:
                await asyncio.sleep(offset)
                while time.perf_counter() < deadline:
                    result = await one_stream(session, url)
                    results.append(result)
                    if not result["ok"]:
                        await asyncio.sleep(0.05)  # a refused connection must not spin
            await asyncio.gather(*(worker(rng.uniform(0, stream_len)) for _ in range(concurrency)))
        elif shape == "lockstep":
            while time.perf_counter() < deadline:
                results.extend(await asyncio.gather(*(one_stream(session, url) for _ in range(concurrency))))
                await asyncio.sleep(0.02)
        else:
            raise ValueError(shape)
        elapsed = time.perf_counter() - t_begin
    good = [r for r in results if r["ok"]]
    return {
        "shape": shape, "concurrency": concurrency, "elapsed": elapsed,
        "n": len(results), "ok": len(good),
        "errors": sorted({r.get("error", "") for r in results if not r["ok"]})[:5],
        "ttft": [r["ttft"] for r in good], "total": [r["total"] for r in good],
        "chunks": sorted({r["chunks"] for r in good}),
        "streams_per_s": len(good) / elapsed,
    }


async def run_hammer(url: str, concurrency: int, duration: float) -> dict:
    """C workers sending short non-streaming requests back to back for `duration` s."""
    count = errors = 0
    latencies: list[float] = []
    last_error = ""
    async with new_session() as session:
        t_begin = time.perf_counter()
        deadline = t_begin + duration

        async def worker() -> None:
            nonlocal count, errors, last_error
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                try:
                    async with session.post(url + CHAT_PATH, data=PLAIN_BODY, headers=HEADERS) as resp:
                        body = await resp.read()
                        if resp.status == 200 and body:
                            count += 1
                            latencies.append(time.perf_counter() - t0)
                        else:
                            errors += 1
                            last_error = f"HTTP {resp.status}"
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    errors += 1
                    last_error = f"{type(e).__name__}: {e}"
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t_begin
    latencies.sort()
    return {"concurrency": concurrency, "elapsed": elapsed, "ok": count, "errors": errors,
            "last_error": last_error, "requests_per_s": count / elapsed,
            "p50": latencies[len(latencies) // 2] if latencies else None}


async def run_capacity(url: str, n: int, ramp: float) -> dict:
    """Open `n` streams (their starts spread over `ramp` s) and keep them all open together."""
    rng = random.Random(1)
    open_now = peak = 0

    async def tracked(session: aiohttp.ClientSession) -> dict:
        nonlocal open_now, peak
        await asyncio.sleep(rng.uniform(0, ramp))
        open_now += 1
        peak = max(peak, open_now)
        try:
            return await one_stream(session, url)
        finally:
            open_now -= 1

    async with new_session() as session:
        t_begin = time.perf_counter()
        results = await asyncio.gather(*(tracked(session) for _ in range(n)))
        elapsed = time.perf_counter() - t_begin
    good = [r for r in results if r["ok"]]
    return {"n": n, "ok": len(good), "peak_open": peak, "elapsed": elapsed,
            "chunks": sorted({r["chunks"] for r in good}),
            "errors": sorted({r.get("error", "") for r in results if not r["ok"]})[:5],
            "ttft": [r["ttft"] for r in good], "total": [r["total"] for r in good]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loadgen", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("stream", help="C concurrent streamed chat completions")
    s.add_argument("--url", required=True)
    s.add_argument("-c", "--concurrency", type=int, default=8)
    s.add_argument("--shape", choices=("staggered", "lockstep"), default="staggered")
    s.add_argument("--duration", type=float, default=6.0)
    s.add_argument("--stream-len", type=float, default=1.0, help="one stream's length in s (spread of starts)")
    s.add_argument("--seed", type=int, default=0)
    h = sub.add_parser("hammer", help="C workers sending short non-streaming requests")
    h.add_argument("--url", required=True)
    h.add_argument("-c", "--concurrency", type=int, default=32)
    h.add_argument("--duration", type=float, default=5.0)
    k = sub.add_parser("capacity", help="N streams open at once")
    k.add_argument("--url", required=True)
    k.add_argument("-n", type=int, default=500)
    k.add_argument("--ramp", type=float, default=1.0, help="spread the N starts over this many s")
    args = parser.parse_args(argv)

    if args.command == "stream":
        result = asyncio.run(run_streams(args.url, args.concurrency, args.shape, args.duration,
                                         args.stream_len, args.seed))
    elif args.command == "hammer":
        result = asyncio.run(run_hammer(args.url, args.concurrency, args.duration))
    else:
        result = asyncio.run(run_capacity(args.url, args.n, args.ramp))
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
