"""`forge-train rl`: veRL PPO/GRPO where every rollout is a real harness run served by the policy.

Writes two files and launches `verl.trainer.main_ppo` on them:

- `agent_loop.yaml` (`rollout.agent.agent_loop_config_path`): registers
  `forgerl_harness` (`trainer/agent_loop.py`) with the harness, the task
  source, the dataset root the rollouts are recorded into, and the user's
  redaction rules (`--redact-rules`) their recorders take;
- `rl_config.yaml`: the complete PPO config (veRL's own, composed with our
  overrides), GRPO by default, on veRL's V1 trainer.

Every segment trains (`--rows thread`, the default; `per_call`: every call;
`last`: only the segment holding the final call): the config's `forgerl`
section says how a rollout becomes rows and
`rollout.agent.agent_loop_manager_class` names `segment_manager.py`'s manager,
whose workers give each row its reward (`--segment-reward copy|discount`,
`--gamma`) and loss weight (`--weighting rollout|segment`); the maths is in
`segment_rl.py`; `trainer.v1.sampler.custom_sampler` names its replay buffer,
which puts the `forgerl/...` metrics in the trainer's. veRL's V1 trainer
runs on TransferQueue (with tensordict 0.10), which the lock pins.

Prompt rows are the `forge-convert --to verl-rl` shards (`--data`) or, when
none are given, one row per task in `--tasks` (written to `tasks.parquet`).
Rows for another agent (offline: veRL generates one answer and
`reward.compute_score` rewards it) that the offline reward would refuse are
left out first, and the count per rule is reported (`offline_screened`).
Harness system prompts run to tens of thousands of tokens and veRL's default
`prompt_length` of 512 left-truncates with only a warning, so lengths come
from recorded data (`--lengths-from`: a `forge-convert --to tokens` folder) or
are given explicitly, and a length below what was recorded is refused unless
`--allow-truncation`.

`--engine torch` runs none of this: GRPO iterations on CPU in this process,
each served by the project's policy server (`torch_rl.py`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from forgerl.errors import removed_on_user_error
from forgerl.recorder.redact import Redactor
from forgerl.harnesses import get_harness
from forgerl.runners.loader import load_tasks

from .launch import LaunchError, compose, module_command, run, write_config, yaml_list
from .reward import screen
from . import torch_rl
from .segment_rl import CONFIG_KEY, ROWS, SEGMENT_REWARDS, WEIGHTINGS

AGENT_NAME = "forgerl_harness"
MANAGER = "forgerl.trainer.segment_manager.SegmentAgentLoopManager"
SAMPLER = ("forgerl.trainer.segment_manager", "segment_sampler")  # its replay buffer, which logs forgerl/... metrics
REWARD_FILE = Path(__file__).with_name("reward.py")


def recorded_lengths(tokens: Path) -> tuple[int, int]:
    """(longest prompt, longest response) in a tokens folder: the prompt ends where the loss mask starts."""
    files = sorted(tokens.rglob("*.parquet"))
    if not files:
        raise LaunchError(f"--lengths-from {tokens}: no parquet files (make it with forge-convert --to tokens)")
    prompt = response = 0
    for path in files:
        try:
            masks = pq.read_table(path, columns=["loss_mask"]).column("loss_mask").to_pylist()
        except (pa.ArrowException, OSError) as e:  # unreadable, or no loss_mask: not a tokens shard
            raise LaunchError(f"--lengths-from {tokens}: {path.name}: {str(e).splitlines()[0]}") from None
        for row in masks:
            start = row.index(1) if 1 in row else len(row)
            prompt, response = max(prompt, start), max(response, len(row) - start)
    return prompt, response


def lengths(args: argparse.Namespace) -> tuple[int, int]:
    if args.lengths_from:
        prompt, response = recorded_lengths(Path(args.lengths_from))
        given_prompt, given_response = args.prompt_length or prompt, args.response_length or response
        if (given_prompt < prompt or given_response < response) and not args.allow_truncation:
            raise LaunchError(f"recorded samples need prompt_length >= {prompt} and response_length >= {response}; "
                              f"got {given_prompt}/{given_response} (--allow-truncation to accept masked samples)")
        return given_prompt, given_response
    if not (args.prompt_length and args.response_length):
        raise LaunchError("give --lengths-from TOKENS (recorded lengths) or both --prompt-length and "
                          "--response-length: veRL's default 512 would truncate harness prompts")
    return args.prompt_length, args.response_length


def task_rows(tasks_path: Path, harness: str, out: Path) -> Path:
    """One RL prompt row per task, in the columns the converter's verl-rl rows use."""
    tasks = load_tasks(tasks_path)
    rows = [{"data_source": f"forgerl/{harness}", "prompt": [{"role": "user", "content": task.prompt}],
             "agent_name": AGENT_NAME, "reward_model": {"style": "rule", "ground_truth": task.id},
             "extra_info": {"index": i, "task_id": task.id, "harness": harness}} for i, task in enumerate(tasks)]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tasks.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def offline_screened(files: list[str], tasks: Path, out: Path) -> list[str]:
    """`files` without the rows the offline reward would refuse (`reward.screen`; rows of the `forgerl_harness`
    agent are graded by their rollout and pass as they are). When some rows are rewarded offline, the kept rows are
    written under `out/data` and the count per rule goes to stderr and `out/offline_rewards.json`."""
    masks, counts = [], Counter()
    for path in files:
        rows = pq.read_table(path, columns=["agent_name", "reward_model", "extra_info"]).to_pylist()
        offline = [r for r in rows if r["agent_name"] != AGENT_NAME]
        keep, counted = screen(offline, str(tasks.resolve()))
        counts += counted
        verdicts = iter(keep)
        masks.append([r["agent_name"] == AGENT_NAME or next(verdicts) for r in rows])
    if not counts:
        return files
    summary = "; ".join(f"{n} {rule}" for rule, n in sorted(counts.items()))
    if not any(map(any, masks)):
        raise LaunchError(f"every row of --data is refused by the offline reward: {summary}")
    (out / "data").mkdir(parents=True, exist_ok=True)
    (out / "offline_rewards.json").write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n")
    print(f"forge-train: offline rewards: {summary}", file=sys.stderr)
    kept = []
    for i, (path, mask) in enumerate(zip(files, masks)):
        if any(mask):
            kept.append(str((out / "data" / f"train-{i:05d}.parquet").resolve()))
            pq.write_table(pq.read_table(path).filter(pa.array(mask)), kept[-1])
    return kept


def agent_loop_yaml(args: argparse.Namespace, out: Path) -> Path:
    entry = {"name": AGENT_NAME, "_target_": "forgerl.trainer.agent_loop.HarnessAgentLoop",
             "harness": args.harness, "tasks": str(Path(args.tasks).resolve()),
             "dataset": str((out / "rollouts").resolve()), "served_model": args.served_model,
             "policy_version": args.policy_version, "isolate_network": not args.no_isolate_network,
             "redact_rules": str(Path(args.redact_rules).resolve()) if args.redact_rules else ""}
    path = out / "agent_loop.yaml"
    path.write_text(yaml.safe_dump([entry], sort_keys=False))
    return path


def overrides(args: argparse.Namespace, out: Path) -> list[str]:
    get_harness(args.harness)
    if args.redact_rules:
        Redactor.from_file(args.redact_rules)  # a bad file is one line now, not a failure in every rollout
    model = Path(args.model)
    if not (model / "config.json").exists():
        raise LaunchError(f"--model {model}: not a Hugging Face model folder (no config.json)")
    prompt_length, response_length = lengths(args)
    if args.data:
        train = sorted(str(p.resolve()) for p in (Path(args.data) / "train").glob("*.parquet"))
        if not train:
            raise LaunchError(f"--data {args.data}: no train/*.parquet (make it with forge-convert --to verl-rl)")
        train = offline_screened(train, Path(args.tasks), out)
    else:
        train = [str(task_rows(Path(args.tasks), args.harness, out).resolve())]
    loop = agent_loop_yaml(args, out)
    rollout = "actor_rollout_ref.rollout"
    return [
        f"algorithm.adv_estimator={args.algorithm}",
        f"data.train_files={yaml_list(train)}", f"data.val_files={yaml_list(train)}",
        "data.prompt_key=prompt", "data.return_raw_chat=True", "data.truncation=error",
        f"data.max_prompt_length={prompt_length}", f"data.max_response_length={response_length}",
        f"data.train_batch_size={args.batch_size}",
        f"actor_rollout_ref.model.path={model.resolve()}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch_size}",
        f"{rollout}.name=vllm", f"{rollout}.mode=async", f"{rollout}.n={args.n}",
        f"{rollout}.prompt_length={prompt_length}", f"{rollout}.response_length={response_length}",
        f"{rollout}.calculate_log_probs=True",
        f"{rollout}.agent.agent_loop_config_path={loop.resolve()}",
        f"{rollout}.agent.default_agent_loop={AGENT_NAME}",
        *expansion_overrides(args),
        f"reward.custom_reward_function.path={REWARD_FILE}",
        "reward.custom_reward_function.name=compute_score",
        f"+reward.custom_reward_function.reward_kwargs.tasks={Path(args.tasks).resolve()}",
        f"trainer.n_gpus_per_node={args.nproc}", "trainer.nnodes=1", f"trainer.total_epochs={args.epochs}",
        "trainer.project_name=forgerl-rl", f"trainer.experiment_name={args.name}", "trainer.logger=[console]",
        f"trainer.default_local_dir={(out / 'checkpoints').resolve()}",
        *args.override,
    ]


def expansion_overrides(args: argparse.Namespace) -> list[str]:
    """The `forgerl` section (`segment_rl.Expansion`) and, when more than one row comes from a rollout, the
    manager that weighs them, on veRL's V1 trainer (its legacy one takes one output per rollout)."""
    if args.segment_reward == "discount" and not 0.0 < args.gamma < 1.0:
        raise LaunchError(f"--segment-reward discount needs 0 < --gamma < 1, not {args.gamma}")
    section = [f"+{CONFIG_KEY}.rows={args.rows}", f"+{CONFIG_KEY}.segment_reward={args.segment_reward}",
               f"+{CONFIG_KEY}.gamma={args.gamma}", f"+{CONFIG_KEY}.weighting={args.weighting}"]
    if args.rows == "last":
        return section
    return [*section, "trainer.use_v1=True", f"+actor_rollout_ref.rollout.agent.agent_loop_manager_class={MANAGER}",
            f"trainer.v1.sampler.custom_sampler.path=pkg://{SAMPLER[0]}", f"trainer.v1.sampler.custom_sampler.name={SAMPLER[1]}"]


def main(args: argparse.Namespace) -> int:
    if args.engine == "torch":
        return torch_rl.main(args)
    out = Path(args.out)
    with removed_on_user_error(out):  # a bad --tasks or override is found after tasks.parquet is written
        out.mkdir(parents=True, exist_ok=True)
        config = write_config(out, "rl_config", compose("ppo_trainer", overrides(args, out)))
    print(f"# veRL PPO config: {config}\n# agent loop: {out / 'agent_loop.yaml'}", flush=True)
    if args.dry_run:
        print((out / "agent_loop.yaml").read_text(), end="")
        print(json.dumps({"prompt_length": lengths(args)[0], "response_length": lengths(args)[1]}))
    return run(module_command("verl.trainer.main_ppo", config), args.dry_run)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rl", help="PPO/GRPO with a real harness per rollout, served by the policy (veRL, or "
                                  "--engine torch: CPU iterations)")
    p.add_argument("--engine", choices=("verl", "torch"), default="verl",
                   help="verl (default): launch veRL; torch: GRPO iterations in this process on CPU, each served by "
                        "the project's policy server (trainer/torch_rl.py)")
    p.add_argument("--tasks", required=True, help="task file or folder (QwenClawBench task_*.md or TOML)")
    p.add_argument("--harness", required=True, help="claude-code, codex, openclaw, zeroclaw, pi, ...")
    p.add_argument("--model", required=True, help="Hugging Face model folder (the policy)")
    p.add_argument("--data", help="forge-convert --to verl-rl output (default: one row per task)")
    p.add_argument("--out", default="forge-rl", help="configs, rollouts dataset, checkpoints (default ./forge-rl)")
    p.add_argument("--lengths-from", metavar="TOKENS", help="forge-convert --to tokens folder: size lengths from it")
    p.add_argument("--prompt-length", type=int, default=0)
    p.add_argument("--response-length", type=int, default=0)
    p.add_argument("--allow-truncation", action="store_true",
                   help="accept lengths below the recorded ones (over-long rollouts come back fully masked)")
    p.add_argument("--algorithm", default="grpo", help="algorithm.adv_estimator (default grpo)")
    p.add_argument("--n", type=int, default=4, help="rollouts per task (default 4)")
    p.add_argument("--batch-size", type=int, default=8, help="tasks per step")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--nproc", type=int, default=1, help="GPUs on this node")
    p.add_argument("--served-model", default="policy", help="model name the harness is told")
    p.add_argument("--policy-version", default="", help="tag recorded rollouts with this version")
    p.add_argument("--no-isolate-network", action="store_true", help="let harnesses reach the network")
    p.add_argument("--redact-rules", default="", metavar="FILE",
                   help="extra redaction regexes, one per line, for the recorder each rollout starts (keys, tokens "
                        "and .env secrets are always redacted)")
    p.add_argument("--rows", choices=ROWS, default="thread",
                   help="what a rollout trains: every segment (thread, default), every call (per_call), or the "
                        "segment holding the final call (last)")
    p.add_argument("--segment-reward", choices=SEGMENT_REWARDS, default="copy",
                   help="each row's reward: the rollout's (copy, default) or gamma^(segments after it) times it")
    p.add_argument("--gamma", type=float, default=0.9, help="discount per segment for --segment-reward discount")
    p.add_argument("--weighting", choices=WEIGHTINGS, default="rollout",
                   help="rollout (default): a rollout counts once in the loss however many rows it has; "
                        "segment: every row counts once")
    p.add_argument("--name", default="run", help="experiment name")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="further veRL overrides")
    p.add_argument("--dry-run", action="store_true", help="print the configs and the command, run nothing")
    torch_rl.add_arguments(p)
    p.set_defaults(func=main)
