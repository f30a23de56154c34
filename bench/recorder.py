"""Recorder latency, throughput and capacity against bare mitmdump, side by side.

    .venv/bin/python bench/recorder.py            # full run, ~10 min
    .venv/bin/python bench/recorder.py --quick    # smoke run, < 2 min

Every piece runs in its own process: the scripted upstream
(`python examples/scripted_upstream.py`), the proxy under test, and the load
generator (`bench/loadgen.py`, aiohttp, one fresh connection per request).
The same load goes through each configuration in turn:

    direct              no proxy
    mitmdump            bare `mitmdump -q --mode reverse:UP@127.0.0.1:PORT --set stream_large_bodies=1`
    forge-record        `forge-record serve --upstream UP --listen 127.0.0.1:PORT --out DIR`: its own tuned
                        set-up (only the mitmproxy addons a recorder needs, connection_strategy=lazy,
                        recording in a writer process; see recorder/proxy.py and writer_process.py)
    mitmdump-tuned      bare mitmdump + the TUNED options below
    forge-addon-tuned   `mitmdump -q -s recorder/addon.py --mode ... --set forge_out=DIR` + TUNED
    forge-record-keys   forge-record + `--hold-keys`: the client sends a capability token, the recorder checks
                        it and swaps in the real key (recorder/credentials.py)

"Holding the keys" compares forge-record-keys with forge-record: the swap's
CPU per call, in process (`KeyHolder.swap` on a call's headers, µs), and the
added TTFT p50 and proxy CPU per request, each paired within a trial (and
cell) as the rest of the bench pairs against direct, with a 95% t-interval
over those pairs.

Trials are interleaved (every configuration once per trial, in rotated
order) and the tables show the median over trials of each per-trial figure,
so slow drift and other processes on the machine hit every configuration
alike. "proxy CPU" counts the proxy and its children (forge-record's writer
process). The targets (DESIGN.md §9) are ratios against bare mitmdump; absolute
times are printed but never judged. Exit status is 0 unless something broke
(a failed or lost stream, a proxy that would not start).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from forgerl import printer
from forgerl.recorder.credentials import MAX_TTL_S, SECRET_ENV, KeyHolder, Tokens

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = Path(sys.executable).parent
PY = sys.executable
LOADGEN = str(HERE / "loadgen.py")
ADDON = str(ROOT / "recorder" / "addon.py")
SCRIPTED = str(ROOT / "examples" / "scripted_upstream.py")

# The mitmproxy options worth setting for a reverse-proxy recorder (see bench/README.md, "Profiling").
# Every other --set candidate measured (http2, validate_inbound_headers, body_size_limit, termlog
# verbosity beyond -q) made no difference above noise here, or would cost safety for none.
TUNED = [
    # Eager (the default) opens the upstream connection when the client connects, before the
    # recorder's requestheaders hook picks the upstream: with separate Anthropic/OpenAI upstreams,
    # every Anthropic call also opens (and drops) a connection, a TLS handshake in production, to
    # the OpenAI one. Lazy opens only the one used; on loopback it is latency-neutral.
    "connection_strategy=lazy",
]

BENCH_SECRET = "bench-secret-" + "0" * 32  # the keys config's recorder secret (a bench, not a deployment)
REAL_KEY = "sk-bench-real-key"  # what the keys config swaps in
STREAM_CHUNKS, STREAM_DELAY = 50, 0.02  # latency load: one stream ~1 s
CAP_DELAY = 0.1  # capacity load: slow streams, 100 ms between chunks


# ------------------------------------------------------------------ processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"not listening on {port} after {timeout:.0f} s")


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def child_pids(pid: int) -> list[int]:
    try:
        return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                for c in (task / "children").read_text().split()]
    except OSError:
        return []


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return float("nan")


def machine_busy() -> float:
    """CPU-seconds the whole machine has been busy since boot (all cores)."""
    try:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = values[3] + values[4]
        return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


class Process:
    """A child process with its output in a log file; stopped with SIGTERM."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None):
        self.name = name
        self.argv = argv
        self.log_path = log_dir / f"{name}-{int(time.time() * 1000)}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=ROOT, start_new_session=True, env=env)

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def start_upstream(log_dir: Path, chunks: int, delay: float) -> tuple[Process, str]:
    """The scripted model server (examples/scripted_upstream.py) in its own process."""
    port = free_port()
    argv = [PY, SCRIPTED, "--port", str(port), "--chunks", str(chunks), "--chunk-delay", str(delay)]
    up = Process(f"upstream-{chunks}x{delay}", argv, log_dir)
    wait_port(port, up.proc)
    UPSTREAM_PIDS[:] = [up.proc.pid]
    return up, f"http://127.0.0.1:{port}"


@dataclass
class Config:
    name: str
    kind: str  # direct | mitmdump | forge-record | addon
    tuned: bool = False
    records: bool = False
    keys: bool = False  # forge-record --hold-keys: the client sends a token (`client_key`)

    def argv(self, upstream: str, port: int, out: Path) -> list[str] | None:
        mode = f"reverse:{upstream}@127.0.0.1:{port}"
        sets = [a for opt in (TUNED if self.tuned else []) for a in ("--set", opt)]
        if self.kind == "direct":
            return None
        if self.kind == "mitmdump":
            return [str(BIN / "mitmdump"), "-q", "--mode", mode, "--set", "stream_large_bodies=1", *sets]
        if self.kind == "forge-record":
            return [str(BIN / "forge-record"), "serve", "--upstream", upstream, "--listen", f"127.0.0.1:{port}",
                    "--out", str(out), *(["--hold-keys"] if self.keys else [])]
        if self.kind == "addon":
            return [str(BIN / "mitmdump"), "-q", "-s", ADDON, "--mode", mode, "--set", f"forge_out={out}", *sets]
        raise ValueError(self.kind)


CONFIGS = {c.name: c for c in [
    Config("direct", "direct"),
    Config("mitmdump", "mitmdump"),
    Config("forge-record", "forge-record", records=True),
    Config("mitmdump-tuned", "mitmdump", tuned=True),
    Config("forge-addon-tuned", "addon", tuned=True, records=True),
    Config("forge-record-keys", "forge-record", records=True, keys=True),
]}


@dataclass
class Proxy:
    config: Config
    url: str
    out: Path
    process: Process | None = None
    sent_ok: int = 0  # successful calls sent through it, to compare with the recorded rows
    client_key: str = ""  # what the load generator sends as its key ("" : its own placeholder)

    @classmethod
    def start(cls, config: Config, upstream: str, work: Path) -> Proxy:
        if config.kind == "direct":
            return cls(config, upstream, work)
        port = free_port()
        out = Path(tempfile.mkdtemp(prefix=f"{config.name}-", dir=work))
        env = {**os.environ, SECRET_ENV: BENCH_SECRET, "OPENAI_API_KEY": REAL_KEY} if config.keys else None
        process = Process(config.name, config.argv(upstream, port, out / "data"), work, env)
        try:
            wait_port(port, process.proc)
        except RuntimeError as e:
            process.stop()
            raise RuntimeError(f"{config.name}: {e}\n{process.tail()}") from None
        key = Tokens(BENCH_SECRET).issue("default", MAX_TTL_S)[0] if config.keys else ""  # calls without /s/<id>/
        return cls(config, f"http://127.0.0.1:{port}", out / "data", process, client_key=key)

    @property
    def pid(self) -> int | None:
        return self.process.proc.pid if self.process else None

    @property
    def pids(self) -> list[int]:
        """The proxy and its children (forge-record's writer process): their CPU is the proxy's."""
        return [self.pid, *child_pids(self.pid)] if self.pid else []

    def stop(self) -> dict:
        """SIGTERM; for a recording proxy, count the complete calls it wrote."""
        if self.process is None:
            return {}
        rss = sum(rss_mb(p) for p in self.pids)
        status = self.process.stop()
        info: dict = {"exit": status, "sent_ok": self.sent_ok, "rss_mb": rss}
        if self.config.records:
            from forgerl.schema.store import read_table
            try:
                calls = read_table(self.out, "calls", columns=["call_id", "complete"])
                complete = sum(1 for v in calls.column("complete").to_pylist() if v)
                info.update(rows=calls.num_rows, complete=complete,
                            unique=len(set(calls.column("call_id").to_pylist())))
            except Exception as e:  # a broken dataset is a finding, reported by the caller
                info.update(read_error=f"{type(e).__name__}: {e}")
        return info


UPSTREAM_PIDS: list[int] = []  # CPU they use is ours, not "other load"


def loadgen(proxy: Proxy | None, url: str, *args: str, timeout: float = 300) -> dict:
    """Run one load in its own process; return its JSON result, plus the CPU the proxy used
    (`proxy_cpu`, s) and the CPU other processes on the machine used (`other_load`, in cores)."""
    mine = proxy.pids if proxy else []
    ours = [*mine, *UPSTREAM_PIDS]
    cpu0 = {p: cpu_seconds(p) for p in ours}
    child0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0 = machine_busy()
    t0 = time.monotonic()
    env = {**os.environ, "FORGE_BENCH_KEY": proxy.client_key} if proxy and proxy.client_key else None
    done = subprocess.run([PY, LOADGEN, *args, "--url", url], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env)
    wall = time.monotonic() - t0
    busy = machine_busy() - busy0
    child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"loadgen {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout)
    used = {p: cpu_seconds(p) - cpu0[p] for p in ours}
    result["proxy_cpu"] = sum(used[p] for p in mine if used[p] == used[p])
    loadgen_cpu = (child1.ru_utime + child1.ru_stime) - (child0.ru_utime + child0.ru_stime)
    result["other_load"] = max(0.0, busy - sum(used.values()) - loadgen_cpu) / wall
    result["wall"] = wall
    if proxy is not None:
        proxy.sent_ok += result.get("ok", 0)
    return result


def quiet_loadgen(args, proxy: Proxy | None, url: str, *load: str) -> dict:
    """`loadgen`, rerun (up to --retries times) while other processes took more than
    --max-other cores; keeps the quietest attempt."""
    best = None
    for attempt in range(1 + args.retries):
        result = loadgen(proxy, url, *load)
        if result.get("ok") != result.get("n", result.get("ok")) or result.get("errors"):
            return result  # a failure is reported, however noisy the machine was
        if best is None or result["other_load"] < best["other_load"]:
            best = result
        if result["other_load"] <= args.max_other or attempt == args.retries:
            break
        print(f"    other processes used {result['other_load']:.2f} cores during {' '.join(load[:3])}; rerunning",
              file=sys.stderr, flush=True)
    return best


# ------------------------------------------------------------------ statistics


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}  # Student's t, 97.5% quantile, by degrees of freedom


def mean_ci(values: list[float]) -> tuple[float, float, float]:
    """Mean and its 95% t-interval (the table's next smaller df: a little wide between rows); NaN under 2."""
    values = [v for v in values if v == v]
    if len(values) < 2:
        return float("nan"), float("nan"), float("nan")
    mean = statistics.fmean(values)
    t = T975[max(df for df in T975 if df <= len(values) - 1)]
    half = t * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def swap_us(n: int = 20000) -> float:
    """CPU µs of one `KeyHolder.swap` (check the token, put the real key in its place), on a call's headers."""
    from mitmproxy.http import Headers, Request
    holder = KeyHolder(Tokens(BENCH_SECRET), {"openai": REAL_KEY})
    token = holder.tokens.issue("default", MAX_TTL_S)[0]
    requests = [Request.make("POST", "http://127.0.0.1/v1/chat/completions", b"", Headers(
        host="127.0.0.1", content_type="application/json", authorization=f"Bearer {token}")) for _ in range(n)]
    t0 = time.process_time()
    for r in requests:
        holder.swap(r.headers, r.query, "openai", "default")
    return (time.process_time() - t0) / n * 1e6


def med(values: list[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def ms(v: float, signed: bool = False) -> str:
    if v != v:
        return "-"
    return f"{v * 1000:+.1f}" if signed else f"{v * 1000:.1f}"


@dataclass
class Cell:
    shape: str
    concurrency: int
    duration: float

    @property
    def key(self) -> str:
        return f"{self.shape[:4]}-{self.concurrency}"

    @property
    def label(self) -> str:
        return f"{self.concurrency:>3} {self.shape}"


@dataclass
class Results:
    """trial -> config -> cell key -> per-trial summary."""
    stream: dict[str, dict[str, list[dict]]] = field(default_factory=dict)
    hammer: dict[str, list[dict]] = field(default_factory=dict)
    capacity: dict[str, dict] = field(default_factory=dict)
    recorded: dict[str, list[dict]] = field(default_factory=dict)
    rss: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def add_stream(self, config: str, cell: Cell, raw: dict) -> None:
        summary = {
            "n": raw["n"], "ok": raw["ok"], "errors": raw["errors"], "chunks": raw["chunks"],
            "ttft_p50": pct(raw["ttft"], 50), "ttft_p99": pct(raw["ttft"], 99),
            "total_p50": pct(raw["total"], 50), "total_p99": pct(raw["total"], 99),
            "streams_per_s": raw["streams_per_s"],
            "cpu_per_stream": raw["proxy_cpu"] / raw["ok"] if raw["ok"] else float("nan"),
            "other_load": raw["other_load"],
        }
        self.stream.setdefault(config, {}).setdefault(cell.key, []).append(summary)
        if raw["ok"] != raw["n"] or raw["chunks"] not in ([], [STREAM_CHUNKS]):
            self.failures.append(f"{config} {cell.label}: {raw['n'] - raw['ok']} of {raw['n']} streams failed "
                                 f"{raw['errors']}, chunk counts {raw['chunks']}")

    def stat(self, config: str, key: str, name: str) -> float:
        return med([t[name] for t in self.stream.get(config, {}).get(key, [])])

    def added(self, config: str, key: str, name: str) -> float:
        """Median over trials of (proxied − direct) for one statistic, paired within each trial."""
        mine, direct = self.stream.get(config, {}).get(key, []), self.stream.get("direct", {}).get(key, [])
        return med([a[name] - b[name] for a, b in zip(mine, direct)])


# ------------------------------------------------------------------ the run


def run_trials(args, configs: list[Config], cells: list[Cell], work: Path, res: Results) -> None:
    up, upstream = start_upstream(work, STREAM_CHUNKS, STREAM_DELAY)
    try:
        for trial in range(args.trials):
            order = configs[trial % len(configs):] + configs[:trial % len(configs)]
            for config in order:
                t_cfg = time.monotonic()
                try:
                    proxy = Proxy.start(config, upstream, work)
                except RuntimeError as e:
                    res.failures.append(str(e))
                    continue
                try:
                    target = proxy if config.kind != "direct" else None
                    # Warm up: the first flows through a fresh mitmproxy import and set up lazily.
                    loadgen(target, proxy.url, "stream", "-c", "4", "--shape", "lockstep", "--duration", "0.01")
                    loadgen(target, proxy.url, "hammer", "-c", "4", "--duration", "0.3")
                    for i, cell in enumerate(cells):
                        raw = quiet_loadgen(args, target, proxy.url, "stream", "-c", str(cell.concurrency), "--shape", cell.shape,
                                      "--duration", str(cell.duration), "--stream-len",
                                      str(STREAM_CHUNKS * STREAM_DELAY), "--seed", str(trial * 100 + i))
                        res.add_stream(config.name, cell, raw)
                    raw = quiet_loadgen(args, target, proxy.url, "hammer", "-c", str(args.hammer_workers),
                                  "--duration", str(args.hammer_s))
                    raw["cpu_per_request"] = raw["proxy_cpu"] / raw["ok"] if raw["ok"] else float("nan")
                    res.hammer.setdefault(config.name, []).append(raw)
                    if raw["errors"]:
                        res.failures.append(f"{config.name} hammer: {raw['errors']} errors ({raw['last_error']})")
                finally:
                    info = proxy.stop()
                if "rss_mb" in info:
                    res.rss.setdefault(config.name, []).append(info["rss_mb"])
                check_recorded(config.name, info, res)
                print(f"  trial {trial + 1}/{args.trials} {config.name:<18} {time.monotonic() - t_cfg:5.1f} s",
                      file=sys.stderr, flush=True)
    finally:
        up.stop()


def check_recorded(name: str, info: dict, res: Results) -> None:
    if not info:
        return
    if info.get("exit") not in (0, None):
        res.failures.append(f"{name}: exited with status {info['exit']} on SIGTERM")
    if "read_error" in info:
        res.failures.append(f"{name}: could not read its dataset: {info['read_error']}")
    elif "complete" in info and info["complete"] < info["sent_ok"]:
        res.failures.append(f"{name}: {info['sent_ok'] - info['complete']} of {info['sent_ok']} completed calls "
                            "missing from the dataset")
    if "complete" in info:
        res.recorded.setdefault(name, []).append(info)


def run_capacity(args, work: Path, res: Results, names: list[str]) -> None:
    up, upstream = start_upstream(work, args.cap_chunks, CAP_DELAY)
    try:
        for name in names:
            config = CONFIGS[name]
            proxy = Proxy.start(config, upstream, work)
            try:
                raw = loadgen(proxy, proxy.url, "capacity", "-n", str(args.cap_streams), "--ramp", str(args.cap_ramp),
                              timeout=120 + args.cap_chunks * CAP_DELAY * 4)
            finally:
                info = proxy.stop()
            lost = raw["n"] - raw["ok"]
            wrong = [c for c in raw["chunks"] if c != args.cap_chunks]
            entry = {"n": raw["n"], "ok": raw["ok"], "peak_open": raw["peak_open"], "errors": raw["errors"],
                     "ttft_p50": pct(raw["ttft"], 50), "ttft_p99": pct(raw["ttft"], 99),
                     "total_p50": pct(raw["total"], 50), "total_p99": pct(raw["total"], 99),
                     "proxy_cpu": raw["proxy_cpu"], **info}
            if config.records:
                entry["missing"] = raw["ok"] - info.get("complete", 0)
            res.capacity[name] = entry
            if lost or wrong:
                res.failures.append(f"capacity {name}: {lost} of {raw['n']} streams lost {raw['errors']}"
                                    + (f", chunk counts {raw['chunks']}" if wrong else ""))
            check_recorded(f"capacity {name}", info, Results())  # rows checked below with the exact count
            if config.records and entry.get("complete") != raw["n"]:
                res.failures.append(f"capacity {name}: {entry.get('complete')} complete rows recorded for "
                                    f"{raw['n']} streams ({info})")
            print(f"  capacity {name:<18} {raw['ok']}/{raw['n']} streams, peak {raw['peak_open']} open",
                  file=sys.stderr, flush=True)
    finally:
        up.stop()


# ------------------------------------------------------------------ tables


def report(args, configs: list[Config], cells: list[Cell], res: Results) -> str:
    names = [c.name for c in configs]
    out = []
    out.append(f"### Latency (ms; median of {args.trials} trial(s); added = proxied − direct, paired per trial)\n")
    rows = []
    for cell in cells:
        for name in names:
            if cell.key not in res.stream.get(name, {}):
                continue
            r = lambda s: res.stat(name, cell.key, s)  # noqa: E731
            a = lambda s: res.added(name, cell.key, s)  # noqa: E731
            n = sum(t["ok"] for t in res.stream[name][cell.key])
            rows.append([cell.label, name, str(n), ms(r("ttft_p50")), ms(r("ttft_p99")), ms(r("total_p50")),
                         ms(r("total_p99")), ms(a("ttft_p50"), True), ms(a("ttft_p99"), True),
                         ms(a("total_p50"), True), ms(a("total_p99"), True),
                         ms(r("cpu_per_stream")) if name != "direct" else "-", f"{r('other_load'):.2f}"])
    out.append(printer.text(printer.table(
        ["streams", "config", "n", "TTFT p50", "TTFT p99", "total p50", "total p99", "+TTFT p50", "+TTFT p99",
         "+total p50", "+total p99", "proxy CPU/stream", "other load"], rows, left=2, style=printer.MARKDOWN)))

    out.append(f"\n### Throughput (median of {args.trials} trial(s))\n")
    rows = []
    for name in names:
        h = res.hammer.get(name, [])
        sps = {c.key: res.stat(name, c.key, "streams_per_s") for c in cells}
        rows.append([name, f"{med([x['requests_per_s'] for x in h]):.0f}",
                     ms(med([x['p50'] for x in h])),
                     ms(med([x["cpu_per_request"] for x in h])) if name != "direct" else "-",
                     *(f"{sps[c.key]:.2f}" for c in cells),
                     f"{med(res.rss.get(name, [])):.0f}" if name in res.rss else "-"])
    out.append(printer.text(printer.table(
        ["config", f"req/s ({args.hammer_workers} workers)", "req p50 ms", "proxy CPU/req ms",
         *(f"streams/s {c.key}" for c in cells), "proxy RSS MB at end"], rows, style=printer.MARKDOWN)))

    if res.capacity:
        out.append(f"\n### Capacity: {args.cap_streams} concurrent SSE streams, {args.cap_chunks} chunks "
                   f"{CAP_DELAY * 1000:.0f} ms apart, started over {args.cap_ramp:.0f} s\n")
        rows = []
        for name, c in res.capacity.items():
            rows.append([name, f"{c['ok']}/{c['n']}", str(c["peak_open"]),
                         str(c.get("complete", "-")), ms(c["ttft_p50"]), ms(c["ttft_p99"]),
                         ms(c["total_p50"]), ms(c["total_p99"]), f"{c['proxy_cpu']:.1f}",
                         f"{c.get('rss_mb', float('nan')):.0f}"])
        out.append(printer.text(printer.table(
            ["config", "completed", "peak open", "recorded complete", "TTFT p50", "TTFT p99", "total p50",
             "total p99", "proxy CPU s", "proxy RSS MB"], rows, style=printer.MARKDOWN)))

    if "forge-record-keys" in res.stream and "forge-record" in res.stream:
        out.append("\n" + keys_report(cells, res))
    out.append("\n### Targets (DESIGN.md §9): ratios against bare mitmdump\n")
    out.append(targets(args, cells, res))
    return "\n".join(out)


def keys_report(cells: list[Cell], res: Results) -> str:
    """forge-record-keys against forge-record: the swap in process, and the paired differences with their CI."""
    ttft = [a["ttft_p50"] - b["ttft_p50"] for c in cells for a, b in
            zip(res.stream["forge-record-keys"].get(c.key, []), res.stream["forge-record"].get(c.key, []))]
    cpu = [a["cpu_per_request"] - b["cpu_per_request"] for a, b in
           zip(res.hammer.get("forge-record-keys", []), res.hammer.get("forge-record", []))]
    rows = [["swap CPU per call, in process", "-", f"{swap_us():.1f} µs", "-"]]
    for what, diffs, unit, scale in (("added TTFT p50 (per trial and cell)", ttft, "ms", 1e3),
                                     ("proxy CPU per request, short requests (per trial)", cpu, "µs", 1e6)):
        mean, low, high = mean_ci(diffs)
        rows.append([what, str(len(diffs)), f"{mean * scale:+.2f} {unit}",
                     f"[{low * scale:+.2f}, {high * scale:+.2f}] {unit}" if low == low else "-"])
    return ("### Holding the keys: forge-record-keys − forge-record, paired\n\n" + printer.text(printer.table(
        ["what", "pairs", "mean", "95% CI"], rows, left=1, style=printer.MARKDOWN)))


PAIRS = [("forge-record", "mitmdump"), ("forge-addon-tuned", "mitmdump-tuned"), ("forge-addon-tuned", "mitmdump")]


def targets(args, cells: list[Cell], res: Results) -> str:
    """One row per target, one column per (ours, baseline) pair: measured, ratio, verdict."""
    pairs = [(a, b) for a, b in PAIRS if a in res.stream and b in res.stream and "direct" in res.stream]
    rows = []
    for cell in cells:
        row = [f"+TTFT p50, {cell.label}" + ("" if cell.shape == "staggered" else " (info)"),
               "≤ 1.10× or ≤ +1 ms"]
        for ours, base in pairs:
            mine, theirs = res.added(ours, cell.key, "ttft_p50"), res.added(base, cell.key, "ttft_p50")
            if mine != mine or theirs != theirs:
                row.append("-")
                continue
            ok = mine <= max(theirs * 1.10, theirs + 0.001)
            ratio = f"{mine / theirs:.2f}×" if theirs > 0 else "n/a"
            row.append(f"{ms(mine, True)} vs {ms(theirs, True)} ({ratio}) {'PASS' if ok else 'MISS'}")
        rows.append(row)
    throughput = [("req/s, short requests", lambda n: med([x["requests_per_s"] for x in res.hammer.get(n, [])])),
                  ("streams/s, 64 staggered", lambda n: res.stat(n, "stag-64", "streams_per_s"))]
    for what, get in throughput:
        row = [f"throughput {what}", "≥ 0.90×"]
        for ours, base in pairs:
            a, b = get(ours), get(base)
            row.append(f"{a:.1f} / {b:.1f} ({a / b:.2f}×) {'PASS' if a / b >= 0.90 else 'MISS'}"
                       if a == a and b == b and b else "-")
        rows.append(row)
    for name, c in res.capacity.items():
        if CONFIGS[name].records:
            ok = c["ok"] == c["n"] and c.get("complete") == c["n"]
            rows.append([f"{c['n']} open SSE streams ({name})", "0 lost",
                         f"{c['ok']}/{c['n']} completed, {c.get('complete')} recorded complete: "
                         f"{'PASS' if ok else 'FAIL'}"] + [""] * (len(pairs) - 1))
    headers = ["target", "goal", *(f"{a} vs {b}" for a, b in pairs)]
    if not pairs:
        headers = ["target", "goal", "result"]
    return printer.text(printer.table(headers, rows, left=2, style=printer.MARKDOWN))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 trial, short loads (< 2 min)")
    parser.add_argument("--trials", type=int, help="interleaved trials (default 3; --quick 1)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {list(CONFIGS)}")
    parser.add_argument("--cells", default="", help="e.g. stag-1,stag-8,lock-8 (default: all)")
    parser.add_argument("--no-capacity", action="store_true", help="skip the 500-stream capacity test")
    parser.add_argument("--json", metavar="FILE", help="also write every per-trial figure here")
    parser.add_argument("--max-other", type=float, default=0.25, metavar="CORES",
                        help="rerun a load while other processes used more CPU than this (default 0.25 cores)")
    parser.add_argument("--retries", type=int, default=2, help="reruns per load at most (default 2; --quick 0)")
    args = parser.parse_args(argv)

    quick = args.quick
    args.trials = args.trials or (1 if quick else 3)
    if quick and "--retries" not in (argv if argv is not None else sys.argv):
        args.retries = 0
    d = 2.0 if quick else 5.0
    cells = [Cell("staggered", 1, 2.0 if quick else 8.0), Cell("staggered", 8, d), Cell("staggered", 64, d),
             Cell("lockstep", 8, d), Cell("lockstep", 64, d)]
    if quick:
        cells = [c for c in cells if c.key != "lock-64"]
    if args.cells:
        wanted = args.cells.split(",")
        cells = [c for c in cells if c.key in wanted]
    args.hammer_workers, args.hammer_s = 32, (2.0 if quick else 5.0)
    args.cap_streams, args.cap_chunks, args.cap_ramp = 500, (20 if quick else 50), (1.0 if quick else 2.0)
    unknown = set(args.configs.split(",")) - set(CONFIGS)
    if unknown:
        parser.error(f"unknown configs {sorted(unknown)}; choose from {list(CONFIGS)}")
    configs = [CONFIGS[n] for n in args.configs.split(",")]
    if "direct" not in args.configs.split(","):
        configs.insert(0, CONFIGS["direct"])  # "added" needs the direct baseline

    t0 = time.monotonic()
    res = Results()
    work = Path(tempfile.mkdtemp(prefix="forgerl-bench-"))
    print(f"bench/recorder.py: {len(configs)} configs x {len(cells)} loads x {args.trials} trial(s) "
          f"(logs in {work})", file=sys.stderr, flush=True)
    try:
        run_trials(args, configs, cells, work, res)
        if not args.no_capacity:
            run_capacity(args, work, res, ["forge-record"] if quick else ["mitmdump", "forge-record"])
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        res.failures.append(f"aborted: {e}")
    mitm = subprocess.run([str(BIN / "mitmdump"), "--version"], capture_output=True, text=True).stdout
    mitm_version = next((l.split()[-1] for l in mitm.splitlines() if l.startswith("Mitmproxy")), "?")
    print(f"\n## Recorder benchmark — {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores, "
          f"Python {sys.version.split()[0]}, mitmproxy {mitm_version}"
          f"{' (--quick)' if quick else ''}, {time.monotonic() - t0:.0f} s\n")
    print(f"Load: {STREAM_CHUNKS} chunks {STREAM_DELAY * 1000:.0f} ms apart per stream; tuned = "
          f"{' '.join('--set ' + o for o in TUNED)}\n")
    print(report(args, configs, cells, res))
    if res.recorded:
        print("\nRecorded (complete rows / successful calls sent): " + ", ".join(
            f"{n}: " + " ".join(f"{i['complete']}/{i['sent_ok']}" for i in v) for n, v in res.recorded.items()))
    if args.json:
        Path(args.json).write_text(json.dumps({"stream": res.stream, "hammer": res.hammer,
                                               "capacity": res.capacity, "recorded": res.recorded,
                                               "failures": res.failures}, indent=1, default=str))
    if res.failures:
        print("\nBROKEN:\n  " + "\n  ".join(res.failures) + f"\n(process logs kept in {work})")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
