"""Local runner throughput and per-rollout overhead, against the bare harness CLI through the same recorder.

    .venv/bin/python bench/runner.py            # parallelism 1, 4, 16; 4 trials of 48 rollouts each
    .venv/bin/python bench/runner.py --quick    # parallelism 1, 4; one trial of 4 rollouts
    .venv/bin/python bench/runner.py --levels 1 --trials 5

The model is the scripted upstream performing QwenClawBench task_00067 (one
shell tool call that writes the query file, then a final answer) through a
real harness CLI (Codex by default), behind one recorder started as
`forge-run` starts its own (`forge-record serve`, a process of its own).
Both sides are run once before the clock (the CLI's files in the page cache,
the runner's fork servers up). Each parallelism level runs both sides
`--trials` times, taking turns in the order bare, runner, runner, bare, ...
(so both see the same background load, and a machine that speeds up or slows
down over a level favours neither side); the median of the trials' ratios
counts:

    bare      the peer: the harness CLI itself, run in a fresh temp dir pointed at the recorder
              (no workspace files, no sandbox, no grading), N at a time
    runner    LocalRunner: workspace from the task's 8 files, private HOME, sandbox (network + PID
              namespace, cgroup, rlimits), grade() (in the jail after the harness: this grader reads files
              alone), outcome written, temp dir removed

"overhead" is what the runner adds around the model and the harness: workspace
setup + grading (which first asks the recorder's flush barrier to make the
session's calls durable, so the transcript holds every call) + teardown, per
rollout, from the timings each outcome records. The ratio column is runner
throughput / bare throughput. "bare cpu ms" and "runner cpu ms" are the
whole machine's busy CPU time per rollout while each side ran (/proc/stat;
median of the trials): on 2 cores, where 4 and 16 harnesses at once are
CPU-bound, their ratio is about the throughput ratio those levels can reach,
and it is only meaningful on an otherwise quiet machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the runner tests' tasks
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))  # the scripted upstream

from runner_fixtures import BENCH, SPARQL_TASK, task_script  # noqa: E402
from scripted_upstream import ScriptedUpstream  # noqa: E402

from forgerl import printer  # noqa: E402
from forgerl.harnesses import RunContext, get_harness  # noqa: E402
from forgerl.runners.attempt import PASSTHROUGH_ENV  # noqa: E402
from forgerl.runners.local import LocalRunner  # noqa: E402
from forgerl.runners.rollout import Rollout  # noqa: E402
from forgerl.runners.serve import upstream_recorder  # noqa: E402
from forgerl.runners.loader import find_task  # noqa: E402
from forgerl.schema.writer import DatasetWriter  # noqa: E402


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy since boot (/proc/stat: user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in f.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def bare(harness, exe: str, recorder_url: str, prompt: str, n: int, parallel: int) -> float:
    """Wall seconds for n plain harness runs, `parallel` at a time."""

    def one(i: int) -> None:
        tmp = Path(tempfile.mkdtemp(prefix="forgerl-bench-bare-"))
        try:
            (tmp / "home").mkdir()
            ctx = RunContext(prompt, tmp, tmp / "home", recorder_url, f"bare-{parallel}-{i}-{time.time_ns()}")
            argv, env = harness.command(exe, ctx)
            env = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ} | env
            subprocess.run(argv, cwd=tmp, env=env, capture_output=True, stdin=subprocess.DEVNULL, check=True,
                           timeout=300)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    start = time.monotonic()
    with ThreadPoolExecutor(parallel) as pool:
        list(pool.map(one, range(n)))
    return time.monotonic() - start


def runner(harness, recorder_url: str, out: Path, task, n: int, parallel: int) -> tuple[float, list[dict]]:
    local = LocalRunner(harness, recorder_url, out, parallel=parallel, retries=0)
    start = time.monotonic()
    with DatasetWriter(out, source="bench") as writer:
        outcomes = local.run([Rollout(task, i, f"bench-p{parallel}") for i in range(n)], writer)
    wall = time.monotonic() - start
    bad = [o for o in outcomes if o.status == "infra_error" or not o.scores]
    if bad:
        raise SystemExit(f"bench: {len(bad)} rollouts failed: {bad[0].error}")
    return wall, [o.extra["timings"] for o in outcomes]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--harness", default="codex", choices=["codex", "claude-code"])
    p.add_argument("--trials", type=int, default=4, help="bare/runner pairs per level (the median ratio counts)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 4, 16], help="the parallelism levels to run")
    p.add_argument("--rollouts", type=int, default=48, help="rollouts per trial and side: three waves at the "
                   "highest level, so the throughput is not one wave's slowest harness and the batch's last grade")
    args = p.parse_args()
    levels, n, trials = ((1, 4), 4, 1) if args.quick else (args.levels, args.rollouts, args.trials)
    harness = get_harness(args.harness)
    exe = harness.find()
    task = find_task(BENCH, SPARQL_TASK)
    rows = []
    with tempfile.TemporaryDirectory(prefix="forgerl-bench-") as tmp, ScriptedUpstream(task_script) as up, \
            upstream_recorder(Path(tmp) / "data", up.url) as url:
        data = Path(tmp) / "data"
        bare(harness, exe, url, task.prompt, 1, 1)  # the CLI's files into the page cache
        runner(harness, url, data, task, 2, 1)  # the fork servers started, the grading code imported
        for parallel in levels:
            pairs, cpus, timings = [], [], []
            for trial in range(trials):
                seconds, cpu_ms = {}, {}
                for side in ("bare", "runner") if trial % 2 == 0 else ("runner", "bare"):
                    cpu = machine_cpu_s()
                    if side == "bare":
                        seconds[side] = bare(harness, exe, url, task.prompt, n, parallel)
                    else:
                        seconds[side], trial_timings = runner(harness, url, data, task, n, parallel)
                        timings += trial_timings
                    cpu_ms[side] = 1000 * (machine_cpu_s() - cpu) / n
                pairs.append((seconds["bare"], seconds["runner"]))
                cpus.append((cpu_ms["bare"], cpu_ms["runner"]))

            def mean_ms(key: str) -> float:
                return 1000 * statistics.mean(t[key] for t in timings)

            ratios = sorted(b / r for b, r in pairs)
            overhead = mean_ms("setup") + mean_ms("grade") + mean_ms("teardown")
            rows.append([parallel, f"{trials}x{n}", f"{statistics.median(n / b for b, _ in pairs):.2f}",
                         f"{statistics.median(n / r for _, r in pairs):.2f}", f"{statistics.median(ratios):.3f}",
                         f"{ratios[0]:.3f}-{ratios[-1]:.3f}", f"{mean_ms('setup'):.0f}", f"{mean_ms('harness'):.0f}",
                         f"{mean_ms('grade'):.0f}", f"{mean_ms('teardown'):.0f}", f"{overhead:.0f}",
                         f"{statistics.median(b for b, _ in cpus):.0f}", f"{statistics.median(r for _, r in cpus):.0f}"])
    head = ["parallel", "rollouts", "bare/s", "runner/s", "ratio", "range", "setup ms", "harness ms", "grade ms",
            "teardown ms", "overhead ms", "bare cpu ms", "runner cpu ms"]
    printer.show(printer.table(head, rows, title=f"harness: {args.harness}; peer: the bare harness CLI through the "
                               f"same recorder; ratio = runner throughput / bare throughput (median of the trials; "
                               f"range: min-max); {os.cpu_count()} CPUs", left=0, style=printer.MARKDOWN))
    return 0


if __name__ == "__main__":
    sys.exit(main())
