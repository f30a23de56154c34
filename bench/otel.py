"""What live OTLP export (`--otlp`, issue 33) costs: writer CPU per call, and the TTFT it adds at 8 streams.

    .venv/bin/python bench/otel.py                 # 6 trials, ~2 min
    .venv/bin/python bench/otel.py --trials 3 --duration 3

Each trial starts `forge-record serve` twice, export off and on (the order
alternates between trials), and runs the same load through each: 8 staggered
streams of 50 chunks 20 ms apart (bench/loadgen.py against the scripted
upstream, every piece in its own process, as bench/recorder.py does). The "on"
recorder exports to a real OTLP/HTTP receiver on a socket
(tests/otlp_receiver.py). Per trial: the writer process's CPU per recorded
call (the recorder's child: where spans are built and posted), the whole
recorder's CPU per call, and TTFT p50 / p95; "added" figures are on minus off
within a trial, reported as the mean over trials with a 95% t-interval.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from otlp_receiver import OtlpReceiver  # noqa: E402
from recorder import (BIN, ROOT, Config, Process, Proxy, child_pids, cpu_seconds, free_port,  # noqa: E402
                      loadgen, mean_ci, pct, start_upstream, wait_port)

STREAMS, CHUNKS, DELAY = 8, 50, 0.02


def one_run(upstream: str, work: Path, otlp: str, duration: float, seed: int) -> dict:
    """One recorder, one load: TTFT p50/p95 (ms), writer and recorder CPU per recorded call (ms)."""
    port = free_port()
    out = Path(tempfile.mkdtemp(prefix="otel-", dir=work)) / "data"
    argv = [str(BIN / "forge-record"), "serve", "--upstream", upstream, "--listen", f"127.0.0.1:{port}",
            "--out", str(out), *(["--otlp", otlp] if otlp else [])]
    process = Process("otlp-on" if otlp else "otlp-off", argv, work)
    wait_port(port, process.proc)
    proxy = Proxy(Config("forge-record", "forge-record", records=True), f"http://127.0.0.1:{port}", out, process)
    loadgen(proxy, proxy.url, "stream", "-c", "4", "--shape", "lockstep", "--duration", "0.01")  # warm up
    writer = child_pids(proxy.pid)[0]
    before = cpu_seconds(writer)
    raw = loadgen(proxy, proxy.url, "stream", "-c", str(STREAMS), "--shape", "staggered", "--duration",
                  str(duration), "--stream-len", str(CHUNKS * DELAY), "--seed", str(seed))
    time.sleep(1.0)  # the writer's last flush and posts of this load
    writer_cpu = cpu_seconds(writer) - before
    log = process.log_path
    info = proxy.stop()
    if raw["ok"] != raw["n"] or info.get("complete", 0) < raw["ok"]:
        raise RuntimeError(f"lost streams or calls: {raw['ok']}/{raw['n']} ok, {info}\n{process.tail()}")
    ttft = [t * 1000 for t in raw["ttft"]]
    return {"p50": pct(ttft, 50), "p95": pct(ttft, 95), "calls": raw["ok"],
            "writer_ms": writer_cpu * 1000 / raw["ok"], "recorder_ms": raw["proxy_cpu"] * 1000 / raw["ok"],
            "log": log.read_text(errors="replace").splitlines()[-3:]}


def build_us(repeat: int = 20) -> float:
    """In process: µs to build and serialise one call's spans (the example dataset's calls, in writing order)."""
    import pyarrow.parquet as pq

    from forgerl.recorder.otel import SessionTrace, ToolUses, export_request, writing_order

    rows = sorted(pq.read_table(ROOT / "analysis" / "example" / "calls").to_pylist(), key=writing_order)
    t0 = time.perf_counter()
    for _ in range(repeat):
        traces: dict[str, SessionTrace] = {}
        for row in rows:
            trace = traces.setdefault(row["session_id"], SessionTrace(row["session_id"]))
            export_request(trace.add(row, ToolUses())).SerializeToString()
    return (time.perf_counter() - t0) * 1e6 / (repeat * len(rows))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=6)
    p.add_argument("--duration", type=float, default=5.0, help="seconds of load per run")
    args = p.parse_args(argv)
    pairs: list[tuple[dict, dict]] = []
    with tempfile.TemporaryDirectory(prefix="bench-otel-") as tmp, OtlpReceiver() as receiver:
        work = Path(tmp)
        up, url = start_upstream(work, CHUNKS, DELAY)
        try:
            for trial in range(args.trials):
                order = ("", receiver.url) if trial % 2 == 0 else (receiver.url, "")
                runs = {bool(o): one_run(url, work, o, args.duration, trial) for o in order}
                pairs.append((runs[False], runs[True]))
                print(f"trial {trial}: off {fmt(runs[False])} | on {fmt(runs[True])}", file=sys.stderr, flush=True)
        finally:
            up.stop()
        spans = len(receiver.spans())
    print(f"\nlive OTLP export, {args.trials} trials x {STREAMS} streams x {args.duration:g} s "
          f"({spans} spans received); building + serialising a call's spans in process: {build_us():.0f} µs")
    for key, name in (("writer_ms", "writer CPU / call (ms)"), ("recorder_ms", "recorder CPU / call (ms)"),
                      ("p50", "TTFT p50 (ms)"), ("p95", "TTFT p95 (ms)")):
        off = statistics.median(a[key] for a, _ in pairs)
        on = statistics.median(b[key] for _, b in pairs)
        mean, lo, hi = mean_ci([b[key] - a[key] for a, b in pairs])
        print(f"  {name:26s} off {off:7.3f}  on {on:7.3f}  added {mean:+7.3f} [95% CI {lo:+.3f}, {hi:+.3f}]")
    return 0


def fmt(run: dict) -> str:
    return (f"{run['calls']} calls, TTFT p50 {run['p50']:.1f} ms, writer {run['writer_ms']:.2f} ms/call, "
            f"recorder {run['recorder_ms']:.2f} ms/call")


if __name__ == "__main__":
    sys.exit(main())
