"""`forge-analyze report` over 1M calls / 100k sessions, against the same metrics computed with pandas.

    .venv/bin/python bench/analysis.py                  # 100k sessions x 10 calls (generated once, then reused)
    .venv/bin/python bench/analysis.py --sessions 10000 # smoke run
    .venv/bin/python bench/analysis.py --viewer         # `forge-analyze view` on the same data + one 500-call session

The dataset is written by the real `DatasetWriter` (two writer processes,
one per core): half Claude Code-like sessions (Bash/Read/Edit/Grep/TodoWrite),
half Codex-like (exec_command/apply_patch/update_plan), ten calls each, every
call resending the whole history, tool results failing about one time in
eight, and one graded outcome per session over 1,000 tasks. Then, each in a
fresh process pinned to 2 cores:

    forge-analyze   `forge-analyze report DATASET --by harness --out report.html` (wall time of the CLI)
    pandas          read the same Parquet files with pyarrow, compute the per-harness metrics in pandas

The pandas peer implements the README's definitions for the argument shapes
this generator emits (no `cd` hops, no command lists); its numbers must equal
the report's, which the bench checks before printing the table. Target
(DESIGN.md §9): the report in < 10 s on 2 cores.

`--viewer` adds one Claude Code-like session of 500 calls (cached too) and
times `forge-analyze view` (its own process, pinned to the same 2 cores)
over HTTP: the sessions list's first page (cold: it builds the sessions
index; then warm, sorted by cost, and filtered), and the 500-call session
and its last call. The peer is the target (issue 16): the list of a
1M-call dataset in < 2 s, a 500-call session in < 1 s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

CALLS_PER_SESSION = 10
TASKS = 1000
CORES = "0,1"
CLAUDE_TOOLS = ["Bash", "Read", "Edit", "Write", "Glob", "Grep", "TodoWrite", "Agent"]
CODEX_TOOLS = ["exec_command", "write_stdin", "apply_patch", "update_plan", "view_image"]


def _claude_action(rng: random.Random, t: int) -> tuple[str, dict]:
    f = f"/w/src/m{rng.randint(0, 3)}.py"
    return rng.choice([
        ("Read", {"file_path": f}), ("Edit", {"file_path": f, "old_string": "a", "new_string": "b"}),
        ("Bash", {"command": "pytest -q tests"}), ("Bash", {"command": "ls -la"}), ("Grep", {"pattern": "TODO"}),
        ("TodoWrite", {"todos": [{"content": f"step {i}", "status": "completed" if i < t % 4 else "pending",
                                  "activeForm": "working"} for i in range(3)]}),
    ])


def _codex_action(rng: random.Random, t: int) -> tuple[str, dict]:
    f = f"src/m{rng.randint(0, 3)}.py"
    return rng.choice([
        ("exec_command", {"cmd": "pytest -q tests"}), ("exec_command", {"cmd": f"cat {f}"}),
        ("apply_patch", {"input": f"*** Begin Patch\n*** Update File: {f}\n@@\n-a\n+b\n*** End Patch"}),
        ("update_plan", {"plan": [{"step": f"s{i}", "status": "completed" if i < t % 3 else "pending"}
                                  for i in range(2)]}),
    ])


def _write_sessions(root: str, first: int, count: int, calls: int = CALLS_PER_SESSION, prefix: str = "s") -> None:
    from forgerl.schema.messages import Exchange, Message, Part, Usage
    from forgerl.schema.records import CallRecord
    from forgerl.schema.writer import DatasetWriter

    t0 = datetime(2026, 12, 1, tzinfo=timezone.utc)
    with DatasetWriter(root, flush_interval=20.0, source="bench") as w:
        for i in range(first, first + count):
            rng = random.Random(i)
            claude = i % 2 == 0
            harness, sid = ("claude-code" if claude else "codex"), f"{prefix}{i:07d}"
            names = CLAUDE_TOOLS if claude else CODEX_TOOLS
            tools = [{"name": n, "description": f"the {n} tool", "parameters": {"type": "object"}} for n in names]
            model = "claude-sonnet-4-5" if claude else "gpt-5"
            user = [Part("text", text=f"Task {i % TASKS}: make the tests pass.")]
            if claude:
                user.append(Part("text", text="<system-reminder>Plan with TodoWrite.</system-reminder>"))
            history = [Message("system", (Part("text", text=f"You are {harness}."),)), Message("user", tuple(user))]
            for t in range(calls):
                final = t == calls - 1
                name, args = (_claude_action if claude else _codex_action)(rng, t)
                cid = f"{sid}-t{t}"
                parts = (Part("text", text="Done." if final else f"Step {t}."),) + (
                    () if final else (Part("tool_call", tool_name=name, call_id=cid, arguments=json.dumps(args)),))
                out = Message("assistant", parts)
                ex = Exchange(input=list(history), output=[out], tools=tools, model_requested=model,
                              model_returned=model, stop_reason="end_turn" if final else "tool_use",
                              usage=Usage(input_tokens=200 + 40 * t, output_tokens=30, cache_read_tokens=1500 * t,
                                          cache_write_tokens=60 if claude else 0))
                start = t0 + timedelta(seconds=i * 60 + t)
                w.add_call(CallRecord(call_id=f"{sid}-c{t}", session_id=sid, api="anthropic" if claude else "responses",
                                      method="POST", path="/v1/messages" if claude else "/v1/responses",
                                      t_start=start, t_end=start + timedelta(milliseconds=800), status=200,
                                      complete=True, streamed=True, exchange=ex, seq=t))
                history.append(out)
                if not final:
                    failed = rng.random() < 0.125
                    text = ("Exit code 1\nFAILED" if failed else "ok") if claude else \
                        f"Process exited with code {1 if failed else 0}\nOutput:\n..."
                    history.append(Message("user" if claude else "tool", (
                        Part("tool_result", call_id=cid, text=text, is_error=failed if claude else None),)))
            w.add_session(sid, harness=harness, user_agent=harness)
            reward = rng.choice([1.0, 1.0, 0.5, 0.0])
            w.add_outcome({"session_id": sid, "task_id": f"task{i % TASKS}", "attempt": i // TASKS, "harness": harness,
                           "model": model, "status": "success" if reward == 1.0 else "failed", "reward": reward,
                           "passed": reward == 1.0, "t_start": t0, "t_end": t0})


def generate(root: Path, sessions: int) -> float:
    marker = root / "bench-sessions.txt"
    if marker.exists() and marker.read_text().strip() == str(sessions):
        return 0.0
    if root.exists():
        subprocess.run(["rm", "-rf", str(root)], check=True)
    start = time.perf_counter()
    half = sessions // 2
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_write_sessions, args=(str(root), 0, half)),
             ctx.Process(target=_write_sessions, args=(str(root), half, sessions - half))]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"generator failed: exit {p.exitcode}")
    marker.write_text(f"{sessions}\n")
    return time.perf_counter() - start


# --- the pandas peer ------------------------------------------------------------------------


def pandas_metrics(root: str) -> dict[str, dict]:
    """The per-harness metrics of `metrics_by_harness`, computed with pandas (generator's shapes only)."""
    import numpy as np
    import pandas as pd
    import pyarrow.parquet as pq

    from forgerl.analysis import kinds
    from forgerl.analysis.reliability import pass_at_k
    from forgerl.schema.files import data_files

    def read(table, cols):
        return pq.read_table(data_files(root, table), columns=cols).to_pandas()

    calls = read("calls", ["call_id", "session_id", "seq", "t_start", "output_refs", "tools", "model_returned",
                           "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"])
    msgs = read("messages", ["session_id", "part_hash", "part_type", "role", "tool_name", "tool_call_id",
                             "arguments", "is_error", "text"])
    sessions = read("sessions", ["session_id", "harness"]).drop_duplicates("session_id")
    outcomes = read("outcomes", ["task_id", "harness", "status", "passed"])

    calls = calls.sort_values(["session_id", "t_start", "seq", "call_id"])
    calls["turn"] = calls.groupby("session_id").cumcount() + 1
    refs = calls[["session_id", "turn", "output_refs"]].explode("output_refs").rename(columns={"output_refs": "part_hash"})
    refs["pos"] = refs.groupby(level=0).cumcount() + 1
    tc = refs.merge(msgs[msgs.part_type == "tool_call"], on=["session_id", "part_hash"])
    tc["step"] = tc.turn * 100000 + tc.pos
    tc["kind"] = tc.tool_name.map(kinds.TOOL_KINDS).fillna("other")
    args = tc.arguments.map(json.loads)
    tc["command"] = args.map(lambda a: a.get("cmd") or a.get("command"))
    patch_file = args.map(lambda a: a.get("input")).str.extract(kinds.PATCH_FILE)[0]
    tc["path"] = args.map(lambda a: a.get("file_path")).fillna(patch_file)

    def program_target(command):
        if not isinstance(command, str):
            return None
        words = command.split()
        arg = next((w for w in words[1:] if not w.startswith("-")), None)
        return words[0].rsplit("/", 1)[-1] + (f" {arg}" if arg else "")

    tc["target"] = tc.path.fillna(tc.command.map(program_target)).fillna(args.map(lambda a: a.get("pattern")))
    tc["target"] = tc.target.fillna(tc.tool_name)
    check = "|".join(f"(?:{p})" for p in kinds.CHECK_COMMANDS.values())
    tc["is_check"] = (tc.kind == "shell") & tc.command.fillna("").str.contains(check, regex=True)

    res = msgs[msgs.part_type == "tool_result"].copy()
    code = pd.to_numeric(res.text.str.extract(kinds.EXIT_CODE.replace("(?i)", ""), flags=2)[0], errors="coerce")
    res["failed"] = res.is_error.fillna(False).astype(bool) | (code.fillna(0) != 0) | \
        res.text.fillna("").str.contains(kinds.ERROR_TEXT, regex=True)
    res = res.groupby(["session_id", "tool_call_id"], as_index=False).failed.any()

    # verification: a check after the last write (or a read of a written file)
    writes = tc[tc.kind == "write"]
    last = writes.groupby("session_id").agg(last_step=("step", "max"), writes=("step", "size"))
    last["last_turn"] = writes.loc[writes.groupby("session_id").step.idxmax()].set_index("session_id").turn
    after = tc.merge(last, left_on="session_id", right_index=True)
    after = after[after.step > after.last_step]
    written = writes[["session_id", "path"]].drop_duplicates().assign(was_written=True)
    after = after.merge(written, on=["session_id", "path"], how="left")
    checks = after[after.is_check | ((after.kind == "read") & after.was_written.notna())]
    first_check = checks.groupby("session_id").turn.min()
    last["verified"] = last.index.isin(first_check.index)
    last["latency"] = first_check.reindex(last.index) - last.last_turn

    # recovery episodes per intent
    a = tc.merge(res, on=["session_id", "tool_call_id"]).sort_values(["session_id", "kind", "target", "step"])
    g = a.groupby(["session_id", "kind", "target"], sort=False)
    prev = g.failed.shift(fill_value=False)
    a["episode"] = (a.failed & ~prev).astype(int).groupby([a.session_id, a.kind, a.target]).cumsum()
    a = a[a.episode > 0]
    a = a.assign(failed_turn=a.turn.where(a.failed), ok_turn=a.turn.where(~a.failed))
    ep = a.groupby(["session_id", "kind", "target", "episode"])[["failed_turn", "ok_turn"]].min().reset_index()
    ep["recovered"] = ep.ok_turn.notna()
    ep["to_recover"] = ep.ok_turn - ep.failed_turn

    # coverage: distinct names used among those offered
    offered = calls.drop_duplicates(["session_id", "tools"])
    offered = offered.assign(name=offered.tools.map(lambda s: [t["name"] for t in json.loads(s)])).explode("name")
    offered = offered.drop_duplicates(["session_id", "name"])[["session_id", "name"]]
    used = tc.drop_duplicates(["session_id", "tool_name"])[["session_id", "tool_name"]]
    both = offered.merge(used, left_on=["session_id", "name"], right_on=["session_id", "tool_name"], how="left")
    cov = both.groupby("session_id").agg(offered=("name", "size"), used=("tool_name", "count"))
    cov["coverage"] = cov.used / cov.offered

    # plans: the last snapshot's statuses
    snaps = tc[tc.tool_name.isin(kinds.PLAN_SNAPSHOTS)].sort_values("step").groupby("session_id").tail(1)
    items = snaps.apply(lambda r: json.loads(r.arguments)[kinds.PLAN_SNAPSHOTS[r.tool_name][2:]], axis=1)
    plans = pd.DataFrame({"session_id": snaps.session_id, "items": items.map(len),
                          "done": items.map(lambda xs: sum(x["status"] in kinds.PLAN_DONE for x in xs))})

    # costs at list price
    def price(model):
        best = max((p for p in kinds.PRICES if model.startswith(p[0])), key=lambda p: len(p[0]))
        return best[1:]
    pr = np.array([price(m) for m in calls.model_returned])
    calls["cost"] = (calls.input_tokens * pr[:, 0] + calls.output_tokens * pr[:, 1] + calls.cache_read_tokens * pr[:, 2]
                     + calls.cache_write_tokens * pr[:, 3]) / 1e6

    att = outcomes[outcomes.status != "infra_error"]
    per_task = att.groupby(["task_id", "harness"]).passed.agg(["size", "sum"]).reset_index()
    per_task["p1"] = [pass_at_k(n, c, 1) for n, c in zip(per_task["size"], per_task["sum"])]

    h = sessions.set_index("session_id").harness
    out = {}
    for harness in sorted(h.unique()):
        ids = set(h.index[h == harness])
        s_last = last[last.index.isin(ids)]
        s_ep = ep[ep.session_id.isin(ids)]
        s_plan = plans[plans.session_id.isin(ids)]
        s_calls = calls[calls.session_id.isin(ids)]
        out[harness] = {
            "sessions": len(ids), "turns": len(s_calls),
            "verification_rate": s_last.verified.mean(), "verify_latency_turns": s_last.latency.mean(),
            "recovery_rate": s_ep.recovered.mean(), "give_up_rate": 1 - s_ep.recovered.mean(),
            "turns_to_recover": s_ep.to_recover.mean(),
            "tool_coverage": cov[cov.index.isin(ids)].coverage.mean(),
            "plan_completion": s_plan.done.sum() / s_plan["items"].sum(),
            "pass_at_1": per_task[per_task.harness == harness].p1.mean(),
            "input_tokens": s_calls.input_tokens.sum(), "cache_read_tokens": s_calls.cache_read_tokens.sum(),
            "cache_write_tokens": s_calls.cache_write_tokens.sum(), "cost_usd": s_calls.cost.sum(),
        }
    return out


def _timed(cmd: list[str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + sys of the child) and stdout of one run pinned to CORES."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    r = subprocess.run(["taskset", "-c", CORES, *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        raise SystemExit(f"{cmd[0]} failed: {r.stderr.strip()[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), r.stdout


LONG_SESSION, LONG_CALLS = "long0000000", 500
VIEWER_TARGETS = {"list": 2.0, "session": 1.0}


def _viewer_get(url: str) -> tuple[float, dict]:
    import urllib.request

    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=600) as r:
        body = json.load(r)
    return time.perf_counter() - start, body


def viewer_bench(data: Path) -> int:
    """Time `forge-analyze view` over HTTP on the bench dataset (plus one 500-call session)."""
    marker = data / "bench-long-session.txt"
    if not marker.exists():
        _write_sessions(str(data), 0, 1, calls=LONG_CALLS, prefix="long")
        marker.write_text(f"{LONG_CALLS}\n")
    forge = str(Path(sys.executable).with_name("forge-analyze"))
    start = time.perf_counter()
    proc = subprocess.Popen(["taskset", "-c", CORES, forge, "view", str(data), "--listen", "127.0.0.1:0"],
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline()
        listening = time.perf_counter() - start
        base = line.split(" at ")[1].split()[0]
        rows = [("server start (until it listens)", listening, None)]
        t, page = _viewer_get(base + "api/sessions?limit=50")
        rows.append(("sessions list, first page, cold (builds the index)", t, VIEWER_TARGETS["list"]))
        rows.append(("  same, from process start", listening + t, None))
        rows.append(("sessions list, first page, warm", _viewer_get(base + "api/sessions?limit=50")[0],
                     VIEWER_TARGETS["list"]))
        t, by_cost = _viewer_get(base + "api/sessions?limit=50&sort=cost")
        rows.append(("sessions list by cost, page 1", t, VIEWER_TARGETS["list"]))
        rows.append(("sessions list by cost, page 2 (keyset)",
                     _viewer_get(base + f"api/sessions?limit=50&sort=cost&after={by_cost['next']}")[0],
                     VIEWER_TARGETS["list"]))
        rows.append(("sessions list, harness=codex by reward",
                     _viewer_get(base + "api/sessions?limit=50&harness=codex&sort=reward")[0], VIEWER_TARGETS["list"]))
        rows.append(("sessions list, text search (scans every message part)",
                     _viewer_get(base + "api/sessions?limit=50&q=make%20the%20tests%20pass")[0], None))
        t, session = _viewer_get(base + f"api/session?id={LONG_SESSION}")
        rows.append((f"{len(session['calls'])}-call session (calls, segments, costs)", t, VIEWER_TARGETS["session"]))
        last = session["calls"][-1]["call_id"]
        rows.append(("  its last call (whole history rebuilt)",
                     _viewer_get(base + f"api/call?id={last}&session={LONG_SESSION}")[0],
                     VIEWER_TARGETS["session"]))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    from forgerl import printer
    from forgerl.schema.duck import connect
    n_calls, n_sessions = connect(data).execute("SELECT count(*), count(DISTINCT session_id) FROM calls").fetchone()
    print()
    printer.show(printer.table(
        [f"`forge-analyze view`, {n_calls:,} calls / {n_sessions:,} sessions, 2 cores (taskset {CORES})", "s",
         "target s", "target / this"],
        [(name, f"{seconds:.3f}", target or "-", f"{target / seconds:.1f}" if target else "-")
         for name, seconds, target in rows], style=printer.MARKDOWN))
    missed = [name for name, seconds, target in rows if target and seconds > target]
    print(f"\ntargets: {'met' if not missed else 'MISSED: ' + ', '.join(missed)}")
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "forgerl-bench-analysis")
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--pandas-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--viewer", action="store_true", help="time `forge-analyze view` instead of the report")
    args = parser.parse_args(argv)
    if args.pandas_only:  # the peer's own process: print its metrics as JSON
        print(json.dumps(pandas_metrics(str(args.data)), default=float))
        return 0
    gen = generate(args.data, args.sessions)
    if args.viewer:
        return viewer_bench(args.data)
    from forgerl import printer
    from forgerl.schema.duck import connect
    con = connect(args.data)
    n_calls, n_sessions = con.execute("SELECT count(*), count(DISTINCT session_id) FROM calls").fetchone()
    n_parts = con.execute("SELECT count(*) FROM messages").fetchone()[0]
    print(f"dataset: {n_calls:,} calls, {n_sessions:,} sessions, {n_parts:,} message parts"
          + (f" (generated in {gen:.0f} s)" if gen else " (reused)"))

    forge = str(Path(sys.executable).with_name("forge-analyze"))
    out = args.data.parent / "forgerl-bench-report.html"
    sql = [forge, "sql", str(args.data), "SELECT * FROM metrics_by_harness", "--format", "json"]
    report_runs, pandas_runs = [], []
    for _ in range(args.trials):
        report_runs.append(_timed([forge, "report", str(args.data), "--by", "harness", "--out", str(out)])[:2])
        wall, cpu, peer = _timed([sys.executable, __file__, "--pandas-only", "--data", str(args.data)])
        pandas_runs.append((wall, cpu))
        print(f"trial: report {report_runs[-1][0]:.2f} s ({report_runs[-1][1]:.2f} cpu-s), "
              f"pandas {wall:.2f} s ({cpu:.2f} cpu-s)", flush=True)
    ours = {r["harness"]: r for r in json.loads(_timed(sql)[2])}
    theirs = json.loads(peer)
    mismatches = [(h, k, ours[h][k], v) for h, row in theirs.items() for k, v in row.items()
                  if not (v is None and ours[h][k] is None) and abs(float(ours[h][k]) - float(v)) > 1e-6 * max(1, abs(v))]
    print(f"metrics agree: {'yes' if not mismatches else 'NO ' + str(mismatches[:5])}")
    (rw, rc), (pw, pc) = min(report_runs), min(pandas_runs)
    print()
    printer.show(printer.table(
        [f"{n_calls:,} calls, 2 cores (taskset {CORES}), best of {args.trials}", "wall s", "cpu s",
         "pandas wall / this"],
        [("`forge-analyze report` (table + HTML with plots)", f"{rw:.2f}", f"{rc:.2f}", f"{pw / rw:.2f}"),
         ("pandas + pyarrow, same metrics", f"{pw:.2f}", f"{pc:.2f}", "1.00")], style=printer.MARKDOWN))
    print(f"\ntarget: report < 10 s on 2 cores over 1M calls -> {'met' if rw < 10 else 'MISSED'} "
          f"(wall {rw:.2f} s, cpu {rc:.2f} s)")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
