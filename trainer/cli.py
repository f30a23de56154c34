"""`forge-train`: launch veRL on recorded data.

    forge-train sft --data SHARDS --model PATH [--out DIR] [--dry-run]
    forge-train sft --engine torch --data TOKENS --out CKPT (--model DIR | --random-qwen3) [--steps N | --epochs E]
    forge-train rl --tasks PATH --harness NAME --model PATH (--lengths-from TOKENS | --prompt-length N --response-length N)
                   [--rows thread|per_call|last] [--segment-reward copy|discount] [--weighting rollout|segment] [--dry-run]
    forge-train rl --engine torch --tasks PATH --harness pi --model CKPT --iterations 3 --attempts K --out OUT
    forge-train check-serve --data DATASET --model CKPT [--tolerance 1e-3]

`sft` trains on `forge-convert --to verl-sft` shards with veRL's SFT trainer
(torchrun); `rl` runs veRL PPO/GRPO whose rollouts are real harness runs
answered by the policy through `forge-record`'s serve mode, every segment of
each rollout a training row (`trainer/segment_manager.py`). Both write the
complete veRL config they launch with; `--dry-run` prints it and the command.
`sft --engine torch` trains on `--to tokens` shards with the project's torch
loop on CPU and writes a servable checkpoint (`trainer/torch_sft.py`).
`rl --engine torch` runs GRPO iterations on CPU instead, each served by the
project's policy server (`trainer/torch_rl.py`); `check-serve` compares a
served policy's recorded logprobs with its checkpoint's (`trainer/logprob_check.py`).
"""

from __future__ import annotations

import argparse
import sys

from forgerl.cli import run_verb
from forgerl.recorder.otlp import add_otlp_flag, configure_export

from . import logprob_check, rl, sft


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forge-train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sft.add_parser(sub)
    rl.add_parser(sub)
    add_otlp_flag(sub.choices["rl"])
    logprob_check.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_verb("forge-train", lambda: _otlp(args) or args.func(args))


def _otlp(args: argparse.Namespace) -> None:
    """`rl --otlp URL`: the recorders the rollouts start (their writer processes) export there."""
    if args.command == "rl":
        configure_export(args, outcomes=True)  # the rollouts end their traces with the outcome


if __name__ == "__main__":
    sys.exit(main())
