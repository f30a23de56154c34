"""`forge-train`: launch veRL on recorded data.

    forge-train sft --data SHARDS --model PATH [--out DIR] [--dry-run]
    forge-train rl --tasks PATH --harness NAME --model PATH (--lengths-from TOKENS | --prompt-length N --response-length N) [--dry-run]

`sft` trains on `forge-convert --to verl-sft` shards with veRL's SFT trainer
(torchrun); `rl` runs veRL PPO/GRPO whose rollouts are real harness runs
answered by the policy through `forge-record`'s serve mode. Both write the
complete veRL config they launch with; `--dry-run` prints it and the command.
"""

from __future__ import annotations

import argparse
import sys

from . import rl, sft
from .launch import LaunchError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="forge-train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sft.add_parser(sub)
    rl.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (LaunchError, ValueError, OSError) as e:
        print(f"forge-train: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
