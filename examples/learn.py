"""`make demo-learn`: issue 35's loop in one command: record a teacher, train a student on it, serve it, measure it.

Why it exists: every stage is tested on its own; this runs them end to end
through the public verbs only, so a mask on the wrong tokens, a template that
differs between training and serving, a lost policy version or a reward on
the wrong rows shows up as a student that does not learn. Stages:

1. record: the rule-based teacher (learn_teacher.py) solves benchmarks/learn/train
   through `forge-run` in each harness along both production paths: a vendor-API
   upstream (attempt 0, rows re-rendered: `retokenized`) and serve mode through
   its token policy server (attempt 1, engine ids); tagged `policy_version=teacher`;
2. convert: `forge-convert --to tokens` with the offline Qwen tokenizer;
3. sft: `forge-train sft --engine torch`: v0 (a seeded random Qwen3, 0 steps), then v1 from v0;
4. eval v0, v1: each served by real vLLM (float32, its training dtype), run greedy on
   benchmarks/learn/heldout in each harness (`forge-run --policy --temperature 0 --max-tokens 256`);
5. check-serve: vLLM's logprobs on v1's calls against the checkpoint's own;
6. replay: the baseline (always the most common training trajectory) on held-out;
7. compare + report: `forge-analyze compare` v0 -> v1 and replay -> v1 per harness on the
   held-out tasks, `forge-analyze report` (learning curves) into OUT/report.html.

It prints the compare table, one row per stage (seconds, peak RSS of its largest
process) and the targets, and writes OUT/summary.json. Every verb's output is in OUT/logs/.

    python examples/learn.py [--out learn-out] [--fresh] [--small]

`--small` is the CI version (pi only, a few tasks, a few steps): the plumbing, not the targets.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from forgerl import printer
from forgerl.cli import run_verb
from forgerl.errors import UserError
from forgerl.recorder.proxy import free_port
from learn_teacher import TOKENIZER_DIR, TeacherPolicyServer, replay_action, script
from scripted_upstream import ScriptedUpstream

REPO = Path(__file__).resolve().parents[1]
LEARN = REPO / "benchmarks" / "learn"
BIN = Path(sys.executable).parent
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
HELDOUT = "learn-heldout-*"
SERVED = "student"
EVAL_MAX_TOKENS = 256  # a turn: the teacher's longest is ~60 tokens; an untrained student would ramble to 1024
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


@dataclass(frozen=True)
class Plan:
    """What one run records, trains and evaluates (the tuned full run, or the CI-sized one)."""

    harnesses: tuple[str, ...] = ("pi", "claude-code")
    train: tuple[str, ...] = ()  # task ids; empty: all of benchmarks/learn/train
    heldout: tuple[str, ...] = ()  # empty: all of benchmarks/learn/heldout
    hidden: int = 64
    layers: int = 2
    steps: int = 150
    lr: float = 1e-2
    warmup: int = 10  # then a cosine decay to 0 (forge-train sft --warmup)
    batch_tokens: int = 11500  # ~8 pi rows a step, run as one shared prefix and one batch of remainders
    max_length: int = 4096  # SFT leaves longer rows out (Claude Code's ~19k-token rows)
    parallel: int = 2


FULL = Plan()
SMALL = Plan(harnesses=("pi",), train=("learn-train-append-00", "learn-train-copy-00"),
             heldout=("learn-heldout-append-00", "learn-heldout-copy-00"), steps=2)


@dataclass
class Stage:
    name: str
    seconds: float = 0.0
    peak_mb: float = 0.0
    runs: int = 0


@dataclass
class Loop:
    """One run's folders and the cost of each stage so far."""

    out: Path
    plan: Plan
    stages: list[Stage] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.out / "data"

    def ckpt(self, version: str) -> Path:
        return self.out / "ckpt" / version

    @contextmanager
    def stage(self, name: str) -> Iterator[Stage]:
        """Time a stage; the verbs run inside it add their peak RSS (`wait4` of each)."""
        stage = Stage(name)
        print(f"learn: {name} ...", flush=True)
        started = time.monotonic()
        yield stage
        stage.seconds = time.monotonic() - started
        self.stages.append(stage)
        print(f"learn: {name} done in {stage.seconds:.0f} s", flush=True)

    def verb(self, stage: Stage, verb: str, *args: str) -> str:
        """Run `forge-<verb>` to completion, its output in OUT/logs; a failure stops the loop with its log tail."""
        log = self.out / "logs" / f"{slug(stage.name)}-{stage.runs:02d}-{verb}.log"
        proc = spawn([str(BIN / f"forge-{verb}"), *args], log)
        stage.runs += 1
        code = reap(proc, stage)
        text = log.read_text(errors="replace")
        if code != 0:
            raise RuntimeError(f"forge-{verb} {' '.join(args)} exited {code}; {log}:\n{text[-3000:]}")
        return text

    def run_tasks(self, stage: Stage, split: str, harness: str, version: str, *how: str, attempts: int = 1) -> None:
        ids = self.plan.train if split == "train" else self.plan.heldout
        self.verb(stage, "run", str(LEARN / split), "--harness", harness, *how, "--policy-version", version,
                  "--attempts", str(attempts), "--parallel", str(self.plan.parallel), "--out", str(self.data),
                  *(a for task in ids for a in ("--task", task)))


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)


def spawn(command: list[str], log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=ENV)


def reap(proc: subprocess.Popen, stage: Stage) -> int:
    """Wait for `proc` and add its peak RSS (its own or its largest waited-for descendant's) to `stage`."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    stage.peak_mb = max(stage.peak_mb, usage.ru_maxrss / 1024)
    return proc.returncode


def tokenizer_args(tokenizer: Path, served: str) -> list[str]:
    return ["--tokenizer", str(tokenizer), "--served-model", served]


# --- stages ------------------------------------------------------------------------------------------


def record(loop: Loop) -> None:
    """The teacher on the train tasks, every harness, both paths (vendor upstream: attempt 0; serve: attempt 1)."""
    with loop.stage("record teacher") as stage, ScriptedUpstream(script()) as upstream, \
            TeacherPolicyServer(served_model="teacher") as policy:
        for harness in loop.plan.harnesses:
            loop.run_tasks(stage, "train", harness, "teacher", "--upstream", upstream.url)
            loop.run_tasks(stage, "train", harness, "teacher", "--policy", policy.url,
                           *tokenizer_args(TOKENIZER_DIR, "teacher"), attempts=2)


def convert(loop: Loop) -> None:
    with loop.stage("convert") as stage:
        loop.verb(stage, "convert", str(loop.data), "--to", "tokens", "--tokenizer", str(TOKENIZER_DIR),
                  "--out", str(loop.out / "shards"), "--val-fraction", "0", "--no-progress")


def sft(loop: Loop) -> None:
    """v0: the seeded random student, untrained; v1: v0 after SFT on the teacher's shards."""
    plan, shards = loop.plan, str(loop.out / "shards")
    with loop.stage("sft v0") as stage:
        loop.verb(stage, "train", "sft", "--engine", "torch", "--data", shards, "--out", str(loop.ckpt("v0")),
                  "--random-qwen3", "--hidden", str(plan.hidden), "--layers", str(plan.layers), "--steps", "0",
                  "--seed", "0", "--policy-version", "v0")
    with loop.stage("sft v1") as stage:
        loop.verb(stage, "train", "sft", "--engine", "torch", "--data", shards, "--out", str(loop.ckpt("v1")),
                  "--model", str(loop.ckpt("v0")), "--steps", str(plan.steps), "--lr", str(plan.lr),
                  "--warmup", str(plan.warmup),
                  "--batch-tokens", str(plan.batch_tokens), "--max-length", str(plan.max_length), "--seed", "0",
                  "--policy-version", "v1")


@contextmanager
def vllm(loop: Loop, stage: Stage, ckpt: Path) -> Iterator[str]:
    """Real vLLM (CPU) serving `ckpt` in float32, the dtype it trained in; yields its URL."""
    port = free_port()
    log = loop.out / "logs" / f"vllm-{ckpt.name}.log"
    proc = spawn([str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(ckpt),
                  "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port), "--max-model-len",
                  "65536", "--dtype", "float32", "--enforce-eager"], log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vLLM did not start ({log}):\n{log.read_text(errors='replace')[-2000:]}")
            try:
                urllib.request.urlopen(f"{url}/v1/models", timeout=2).read()
                break
            except OSError:
                time.sleep(1)
        yield url
    finally:
        if proc.returncode is None:
            proc.terminate()
            reap(proc, stage)


def evaluate(loop: Loop, version: str) -> None:
    """`version`'s checkpoint served by vLLM, greedy on the held-out tasks in every harness."""
    ckpt = loop.ckpt(version)
    with loop.stage(f"eval {version}") as stage, vllm(loop, stage, ckpt) as url:
        for harness in loop.plan.harnesses:
            loop.run_tasks(stage, "heldout", harness, version, "--policy", url, *tokenizer_args(ckpt, SERVED),
                           "--temperature", "0", "--max-tokens", str(EVAL_MAX_TOKENS))


def check_serve(loop: Loop) -> str:
    """Its last line: calls and tokens compared, the largest and mean logprob difference (exit 2 beyond tolerance)."""
    with loop.stage("check-serve v1") as stage:
        return loop.verb(stage, "train", "check-serve", "--data", str(loop.data), "--model", str(loop.ckpt("v1")),
                         "--policy-version", "v1").strip().splitlines()[-1]


def replay(loop: Loop) -> None:
    """The baseline: the most common training trajectory whatever the prompt, on held-out."""
    with loop.stage("replay baseline") as stage, TeacherPolicyServer(replay=replay_action(),
                                                                     served_model="replay") as policy:
        for harness in loop.plan.harnesses:
            loop.run_tasks(stage, "heldout", harness, "replay", "--policy", policy.url,
                           *tokenizer_args(TOKENIZER_DIR, "replay"))


def compare(loop: Loop) -> dict[str, dict]:
    """Prints the v0 -> v1 table per harness on held-out; returns, per harness, v0, v1, replay and the interval."""
    result: dict[str, dict] = {}
    with loop.stage("compare + report") as stage:
        common = [str(loop.data), "--per", "harness", "--task-glob", HELDOUT]
        print(loop.verb(stage, "analyze", "compare", "--a", "policy_version=v0", "--b", "policy_version=v1",
                        *common).rstrip())
        for a in ("v0", "replay"):
            groups = json.loads(loop.verb(stage, "analyze", "compare", "--a", f"policy_version={a}", "--b",
                                          "policy_version=v1", *common, "--json"))["groups"]
            for group in groups:
                row = next(m for m in group["metrics"] if m["metric"] == "pass@1")
                got = result.setdefault(group["harness"], {"tasks": row["tasks"]})
                got.update({a: row["a"], "v1": row["b"], f"v1-{a}": row["delta"], f"v1-{a} interval": row["delta_ci"]})
        loop.verb(stage, "analyze", "report", str(loop.data), "--by", "policy_version", "--task-glob", HELDOUT,
                  "--out", str(loop.out / "report.html"))
    return result


def interval(bounds: list[float] | None) -> str:
    return "none" if bounds is None else f"[{bounds[0]:+.3f}, {bounds[1]:+.3f}]"


def targets(rates: dict[str, dict]) -> list[dict]:
    """The issue's SFT targets per harness: v0 = 0, v1 >= max(0.6, baseline + 0.35), v1 - v0 interval above 0."""
    rows = []
    for harness, r in sorted(rates.items()):
        bar = max(0.6, r["replay"] + 0.35)
        low = (r["v1-v0 interval"] or [float("nan")])[0]
        rows += [{"harness": harness, "target": "v0 = 0", "value": f"{r['v0']:.3f}", "met": r["v0"] == 0},
                 {"harness": harness, "target": f"v1 >= {bar:.2f}", "value": f"{r['v1']:.3f}", "met": r["v1"] >= bar},
                 {"harness": harness, "target": "v1 - v0 interval excludes 0",
                  "value": interval(r["v1-v0 interval"]),
                  "met": low > 0}]
    return rows


def show(loop: Loop, rates: dict[str, dict], goals: list[dict]) -> None:
    printer.show(printer.table(["stage", "seconds", "peak RSS MB", "verbs"],
                               ([s.name, f"{s.seconds:.0f}", f"{s.peak_mb:.0f}", s.runs] for s in loop.stages),
                               title=f"stages: {sum(s.seconds for s in loop.stages):.0f} s in all"))
    printer.show(printer.table(["harness", "tasks", "replay", "v0", "v1", "v1 - v0 interval"],
                               ([h, r["tasks"], f"{r['replay']:.3f}", f"{r['v0']:.3f}", f"{r['v1']:.3f}",
                                 interval(r["v1-v0 interval"])] for h, r in sorted(rates.items())),
                               title="held-out pass@1"))
    printer.show(printer.table(["harness", "target", "value", "met"],
                               ([g["harness"], g["target"], g["value"], "met" if g["met"] else "NOT met"]
                                for g in goals), left=2, title="targets"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="learn.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("learn-out"), help="where everything goes (default learn-out)")
    parser.add_argument("--fresh", action="store_true", help="remove a non-empty --out first")
    parser.add_argument("--small", action="store_true", help="the CI version: pi, a few tasks, a few steps")
    args = parser.parse_args(argv)

    def action() -> int:
        if args.out.exists() and any(args.out.iterdir()):
            if not args.fresh:
                raise UserError(f"{args.out} is not empty: give --fresh to replace it, or another --out")
            shutil.rmtree(args.out)
        loop = Loop(args.out.resolve(), SMALL if args.small else FULL)
        for step in (record, convert, sft):
            step(loop)
        for version in ("v0", "v1"):
            evaluate(loop, version)
        served = check_serve(loop)
        replay(loop)
        rates = compare(loop)
        goals = targets(rates)
        show(loop, rates, goals)
        print(f"check-serve v1: {served}")
        summary = {"plan": asdict(loop.plan), "stages": [asdict(s) for s in loop.stages], "heldout": rates,
                   "check_serve": served,
                   "targets": goals, "self_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        (loop.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"learn: wrote {loop.out / 'summary.json'} and {loop.out / 'report.html'}")
        return 0

    return run_verb("learn.py", action)


if __name__ == "__main__":
    sys.exit(main())
