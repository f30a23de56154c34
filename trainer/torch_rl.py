"""`forge-train rl --engine torch`: GRPO iterations on CPU on the policy's own harness rollouts, no veRL.

Each iteration, for the current checkpoint vN (its `forgerl_policy.json`):

1. serve it with the project's policy server (`policy_server.py`: vLLM CPU
   cannot swap weights in place and say so in `/v1/models`), reloaded with
   the new weights between iterations;
2. `forge-run --policy` the tasks (sampling at `--temperature`, 1 by default)
   into `OUT/data`; `--watch --rounds 1` makes it read the served version from
   `/v1/models`, so every call and outcome says vN;
3. `forge-convert --to tokens` the dataset into `OUT/tokens/vN` and keep vN's
   rows;
4. join each session's reward from vN's outcomes: a session must have exactly
   one outcome, else the iteration is refused (a reward joined to the wrong
   rows would train silently); infrastructure failures (no reward) are left
   out, as the veRL path drops them;
5. one PPO pass of GRPO over every segment (`rl_loop.rl_step`, the maths of
   `segment_rl.py`), each task a group, each session a rollout;
6. save vN+1 in `OUT/checkpoints/vN+1` (weights, the parent's tokenizer
   files, `forgerl_policy.json` with `parent: vN`),

and prints one line: pass rate, loss, rows, seconds. Seeds are fixed (the
server samples from its seed plus the request's number; torch from `--seed`
plus the iteration).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from forgerl.errors import UserError
from forgerl.harnesses import get_harness
from forgerl.runners.loader import load_tasks
from forgerl.runners.policy import checkpoint_version
from forgerl.schema.store import read_table
from forgerl.schema.templates import POLICY_FILE

from .policy_record import policy_record
from .policy_server import serving
from .rl_loop import rl_step, segments, sessions_of
from .segment_rl import Row, batch_multiple, padding_rows, rollout_rows
from .sft_loop import read_rows
from .torch_model import BadInput, load_model, save_checkpoint

TOKEN_COLUMNS = ["session_id", "segment_index", "policy_version", "input_ids", "loss_mask"]
SERVED_MODEL = "policy"
VERSION = re.compile(r"^v(\d+)$")


def verb(name: str) -> str:
    """A forgerl console script: the one beside this interpreter, else on PATH."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else shutil.which(name) or name


def next_version(version: str) -> str:
    found = VERSION.match(version)
    if not found:
        raise UserError(f"policy version {version!r} is not vN: RL iterations number their checkpoints v1, v2, ...")
    return f"v{int(found.group(1)) + 1}"


def call_verb(cmd: list[str]) -> None:
    """Run a forge-* verb; its bad-input line becomes ours, any other failure keeps its output."""
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(done.stderr[-4000:] if done.returncode else "")
    if done.returncode == 2:
        lines = done.stderr.strip().splitlines()
        raise UserError(lines[-1] if lines else f"{cmd[0]} refused its input")
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd[:2])} exited {done.returncode}")


def rollouts(args: argparse.Namespace, url: str, model_dir: Path, data: Path) -> None:
    """forge-run the tasks against the served policy, tagged with its /v1/models version, rendered with the
    served checkpoint's tokenizer (whose template its recorder checks against the checkpoint's)."""
    cmd = [verb("forge-run"), str(args.tasks), "--harness", args.harness, "--policy", url, "--tokenizer",
           str(model_dir), "--served-model", SERVED_MODEL, "--attempts", str(args.attempts), "--parallel",
           str(args.parallel), "--temperature", str(args.temperature), "--out", str(data), "--watch", "--rounds", "1",
           "--watch-interval", "1"]
    for task in args.task_filter:
        cmd += ["--task", task]
    call_verb(cmd)


def session_rewards(data: Path, harness: str, version: str) -> tuple[dict[str, tuple[str, float | None]], float]:
    """session -> (task, reward; None for an infrastructure failure) for `version`'s outcomes, and its pass rate
    over the graded ones; refuses a session with more than one outcome."""
    rows = [r for r in read_table(data, "outcomes", ["session_id", "task_id", "harness", "policy_version", "status",
                                                      "reward", "passed"]).to_pylist()
            if r["harness"] == harness and r["policy_version"] == version]
    seen: dict[str, int] = {}
    for r in rows:
        seen[r["session_id"]] = seen.get(r["session_id"], 0) + 1
    doubled = sorted(s for s, n in seen.items() if n > 1)
    if doubled:
        raise UserError(f"{data}: sessions with more than one outcome of policy {version}: {', '.join(doubled[:3])}; "
                        "a reward must join exactly one session's rows")
    graded = [r for r in rows if r["reward"] is not None]
    if not graded:
        raise UserError(f"{data}: no graded rollout of policy {version} (every one an infrastructure failure?)")
    return ({r["session_id"]: (r["task_id"], r["reward"]) for r in rows},
            sum(bool(r["passed"]) for r in graded) / len(graded))


def training_rows(tokens: Path, version: str, rewards: dict[str, tuple[str, float | None]],
                  max_length: int) -> list[Row]:
    """`version`'s token rows as GRPO rows: each task a group, each session a rollout, every segment a row;
    sessions of an infrastructure failure (no reward) are left out."""
    try:
        found = read_rows(tokens, TOKEN_COLUMNS)
    except BadInput as e:
        raise UserError(str(e)) from None
    sessions = sessions_of([r for r in found if r["policy_version"] == version], max_length)
    unjoined = sorted(set(sessions) - set(rewards))
    if unjoined:
        raise UserError(f"{tokens}: {len(unjoined)} session(s) of policy {version} have no outcome "
                        f"(first {unjoined[0]}); refusing to train rows without their own reward")
    out: list[Row] = []
    for session, rows in sorted(sessions.items()):
        task, reward = rewards[session]
        if reward is not None:
            out += rollout_rows(task, session, segments(rows, max_length), reward, weighting="rollout",
                                loss_agg_mode="seq-mean-token-mean")
    if not out:
        raise UserError(f"{tokens}: no graded row of policy {version} has loss tokens")
    return out


def iteration(args: argparse.Namespace, server: Any, model_dir: Path, n: int) -> Path:
    """One serve -> rollouts -> convert -> GRPO -> save round from `model_dir`; returns the new checkpoint."""
    import torch

    start = time.perf_counter()
    version = server.reload(model_dir) if server.policy.folder != model_dir else server.policy.version
    new = next_version(version)
    out, data = Path(args.out), Path(args.out) / "data"
    rollouts(args, server.url, model_dir, data)
    tokens = out / "tokens" / version
    call_verb([verb("forge-convert"), str(data), "--to", "tokens", "--tokenizer", str(model_dir), "--out", str(tokens),
              "--harness", args.harness, "--val-fraction", "0", "--no-progress"])
    rewards, pass_rate = session_rewards(data, args.harness, version)
    rows = training_rows(tokens, version, rewards, args.max_length)
    torch.manual_seed(args.seed + n)
    model = load_model(model_dir, "cpu")
    padded = rows + padding_rows(len(rows), batch_multiple(1, args.mini_batch_rows), pad_id=0)
    losses = rl_step(model, padded, "cpu", args.lr, args.mini_batch_rows, "seq-mean-token-mean", n)
    folder = out / "checkpoints" / new
    seconds = time.perf_counter() - start
    base = json.loads((model_dir / POLICY_FILE).read_text()).get("base")
    save_checkpoint(model, folder, model_dir, policy_record(
        model, version=new, parent=version, seed=args.seed, base=base, shards=tokens, template_folder=model_dir,
        steps=len(losses), losses=losses, seconds=seconds))
    graded = sum(reward is not None for _, reward in rewards.values())
    print(f"iteration {n} {version} -> {new}: pass rate {pass_rate:.3f} over {graded} rollouts, "
          f"loss {losses[-1]:.6f}, rows {len(rows)}, seconds {seconds:.1f}", flush=True)
    return folder


def main(args: argparse.Namespace) -> int:
    if args.dry_run:
        raise UserError("--dry-run prints veRL's config: --engine torch has none")
    if min(args.iterations, args.attempts, args.parallel, args.mini_batch_rows, args.max_tokens) < 1:
        raise UserError("--iterations, --attempts, --parallel, --mini-batch-rows and --max-tokens must be at least 1")
    get_harness(args.harness)
    model_dir = Path(args.model)
    next_version(checkpoint_version(model_dir))  # a checkpoint forge-train wrote, numbered vN
    unknown = set(args.task_filter) - {task.id for task in load_tasks(args.tasks)}  # bad task files: one line now
    if unknown:
        raise UserError(f"--task-filter: no such task: {', '.join(sorted(unknown))}")
    Path(args.out).mkdir(parents=True, exist_ok=True)  # checked input: a later refusal keeps earlier checkpoints
    with serving(model_dir, SERVED_MODEL, args.seed, args.max_tokens) as server:
        for n in range(1, args.iterations + 1):
            model_dir = iteration(args, server, model_dir, n)
    print(f"last checkpoint: {model_dir}")
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options only `--engine torch` reads."""
    torch_rl = p.add_argument_group("--engine torch (CPU GRPO iterations, no veRL)")
    torch_rl.add_argument("--iterations", type=int, default=3, help="serve -> rollouts -> GRPO rounds (default 3)")
    torch_rl.add_argument("--attempts", type=int, default=4, help="rollouts per task per iteration (default 4)")
    torch_rl.add_argument("--task-filter", action="append", default=[], metavar="ID",
                          help="only these task ids (repeatable)")
    torch_rl.add_argument("--parallel", type=int, default=1, help="harnesses running at once (default 1)")
    torch_rl.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    torch_rl.add_argument("--max-tokens", type=int, default=1024,
                          help="cap on the tokens the policy generates per call (default 1024)")
    torch_rl.add_argument("--lr", type=float, default=1e-5)
    torch_rl.add_argument("--mini-batch-rows", type=int, default=4, help="rows per PPO update (default 4)")
    torch_rl.add_argument("--max-length", type=int, default=8192, help="cut each row to its last N tokens")
    torch_rl.add_argument("--seed", type=int, default=0)
