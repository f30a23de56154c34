"""`forge-train sft`: veRL's SFT trainer on `forge-convert --to verl-sft` shards (`--engine verl`, the default),
or the project's torch loop on `--to tokens` shards on CPU (`--engine torch`, `torch_sft.py`).

The shards folder holds `train/*.parquet`, `val/*.parquet` and the
converter's `verl_config.yaml` (its `max_length`); rows carry `messages`,
`tools` and `enable_thinking`, the keys veRL's `MultiTurnSFTDataset` reads.
`tools` is JSON text (Parquet cannot hold arbitrary JSON Schema), so
`data.custom_cls` names `sft_dataset.ForgeSFTDataset`, veRL's class decoding it.
`data.truncation=error`: veRL refuses a row longer than `max_length` rather
than cutting it.

veRL renders each message alone, concatenates, and raises when that differs
from rendering the whole conversation. With Qwen3-style templates agent
threads with reasoning always differ, and neither render is what the model
generated: the whole render strips `<think>` from turns before the last user
message, and a message rendered alone loses its `<think>` too (the template
keeps reasoning only after a user query). So the launcher keeps veRL's check
by default (a mismatching row stops the run, never trains silently);
`--accept-template-mismatch` sets `data.ignore_input_ids_mismatch=True` and
trains such rows without their reasoning. The exact sequence (engine ids,
reasoning included) is in `forge-convert --to tokens` shards, which
`--engine torch` (`sft_loop.py`) trains on.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from forgerl.converters.verl import SFT_DATASET_CLASS

from . import torch_sft
from .launch import LaunchError, compose, module_command, run, write_config, yaml_list

# Options one engine takes, with their defaults; given to the other engine they are refused.
ENGINE_OPTIONS = {
    "verl": {"nproc": 1, "batch_size": 32, "micro_batch_size": 1, "name": "run", "accept_template_mismatch": False,
             "override": [], "dry_run": False},
    "torch": {"random_qwen3": False, "hidden": 64, "layers": 2, "steps": None, "batch_tokens": 0, "seed": 0,
              "policy_version": "v1", "no_share_prefix": False, "warmup": None},
}
LEARNING_RATE = {"verl": 1e-5, "torch": 1e-3}


def shard_files(data: Path) -> tuple[list[str], list[str], int | None]:
    """(train files, val files, the converter's max_length) of a verl-sft shards folder."""
    if not data.is_dir():
        raise LaunchError(f"--data: no such folder: {data}")
    manifest = data / "manifest.json"
    if manifest.is_file() and json.loads(manifest.read_text()).get("target") == "tokens":
        raise LaunchError(f"--data {data}: tokens shards; veRL's SFT trains on verl-sft shards (forge-convert DATASET "
                          f"--to verl-sft --out SHARDS), --engine torch on these")
    train = sorted(str(p.resolve()) for p in (data / "train").glob("*.parquet"))
    val = sorted(str(p.resolve()) for p in (data / "val").glob("*.parquet"))
    if not train:
        raise LaunchError(f"--data {data}: no train/*.parquet (make it with forge-convert --to verl-sft)")
    snippet = data / "verl_config.yaml"
    max_length = None
    if snippet.exists():
        max_length = ((yaml.safe_load(snippet.read_text()) or {}).get("data") or {}).get("max_length")
    return train, val, max_length


def overrides(args: argparse.Namespace) -> list[str]:
    train, val, recorded_max = shard_files(Path(args.data))
    model = Path(args.model)
    if not (model / "config.json").exists():
        raise LaunchError(f"--model {model}: not a Hugging Face model folder (no config.json)")
    out = Path(args.out).resolve()
    return [
        f"model.path={model.resolve()}",
        f"data.train_files={yaml_list(train)}",
        f"data.val_files={yaml_list(val) if val else 'null'}",
        f"data.max_length={args.max_length or recorded_max or 32768}",
        "data.truncation=error",
        "data.pad_mode=no_padding",
        f"data.ignore_input_ids_mismatch={args.accept_template_mismatch}",
        "data.messages_key=messages", "data.tools_key=tools", "data.enable_thinking_key=enable_thinking",
        f"data.custom_cls.path={SFT_DATASET_CLASS[0]}", f"data.custom_cls.name={SFT_DATASET_CLASS[1]}",
        f"data.train_batch_size={args.batch_size}",
        f"data.micro_batch_size_per_gpu={args.micro_batch_size}",
        f"optim.lr={args.lr}",
        f"trainer.total_epochs={args.epochs}",
        f"trainer.n_gpus_per_node={args.nproc}",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        "trainer.project_name=forgerl-sft", f"trainer.experiment_name={args.name}",
        "trainer.logger=[console]",
        *args.override,
    ]


def engine_options(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with the engine's own defaults filled in; the other engine's options refused."""
    for engine, options in ENGINE_OPTIONS.items():
        for key, default in options.items():
            given = getattr(args, key)
            if engine != args.engine and given is not None:
                raise LaunchError(f"--{key.replace('_', '-')} is for --engine {engine}")
            if engine == args.engine and given is None:
                setattr(args, key, default)
    if args.lr is None:
        args.lr = LEARNING_RATE[args.engine]
    if args.engine == "torch" and args.steps is not None and args.epochs is not None:
        raise LaunchError("--steps and --epochs: give one")
    if args.epochs is None:
        args.epochs = 1
    if args.engine == "verl" and args.model is None:
        raise LaunchError("--engine verl needs --model")
    if args.engine == "torch" and (args.model is None) == (not args.random_qwen3):
        raise LaunchError("--engine torch needs --model DIR or --random-qwen3, one of them")
    return args


def main(args: argparse.Namespace) -> int:
    args = engine_options(args)
    if args.engine == "torch":
        return torch_sft.main(args)
    config = write_config(Path(args.out), "sft_config", compose("sft_trainer_engine", overrides(args)))
    print(f"# veRL SFT config: {config}", flush=True)
    if args.accept_template_mismatch:
        print("# data.ignore_input_ids_mismatch=True: rows whose per-turn and whole renders differ train on the "
              "per-turn render, without the reasoning of those turns", flush=True)
    if args.dry_run:
        print(config.read_text(), end="")
    return run(module_command("verl.trainer.sft_trainer", config, args.nproc), args.dry_run)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft", help="SFT: veRL on verl-sft shards (torchrun), or the torch loop on tokens shards (CPU)")
    p.add_argument("--engine", choices=("verl", "torch"), default="verl",
                   help="verl (default): veRL's SFT trainer; torch: the project's loop on tokens shards, on CPU")
    p.add_argument("--data", required=True, help="forge-convert output: --to verl-sft (verl) or --to tokens (torch)")
    p.add_argument("--model", type=Path, help="Hugging Face model folder to start from")
    p.add_argument("--out", default="forge-sft",
                   help="verl: where the config and checkpoints go; torch: the checkpoint folder (default ./forge-sft)")
    p.add_argument("--epochs", type=int, help="passes over the data (default 1)")
    p.add_argument("--lr", type=float, help="learning rate (default 1e-5 verl, 1e-3 torch)")
    p.add_argument("--max-length", type=int, default=0,
                   help="max tokens per row (verl default: the converter's; torch: longer rows are left out and "
                        "counted, default 0: none)")
    verl = p.add_argument_group("--engine verl")
    verl.add_argument("--nproc", type=int, help="GPUs on this node (default 1)")
    verl.add_argument("--batch-size", type=int, help="global batch size (default 32)")
    verl.add_argument("--micro-batch-size", type=int, help="per-GPU micro batch (default 1)")
    verl.add_argument("--name", help="experiment name (default run)")
    verl.add_argument("--accept-template-mismatch", action="store_true", default=None,
                      help="train rows whose per-turn render differs from the whole render (reasoning dropped)")
    verl.add_argument("--override", action="append", metavar="KEY=VALUE", help="any further veRL override, repeatable")
    verl.add_argument("--dry-run", action="store_true", default=None,
                      help="print the config and the command, run nothing")
    own = p.add_argument_group("--engine torch")
    own.add_argument("--random-qwen3", action="store_true", default=None,
                     help="start from a seeded random Qwen3 built from a config instead of --model")
    own.add_argument("--hidden", type=int, help="--random-qwen3 hidden size (default 64)")
    own.add_argument("--layers", type=int, help="--random-qwen3 layers (default 2)")
    own.add_argument("--steps", type=int, help="optimizer steps instead of --epochs (0: save the untrained model)")
    own.add_argument("--batch-tokens", type=int, help="tokens a step takes, whole rows (default 0: one row a step)")
    own.add_argument("--seed", type=int, help="model init and row order (default 0)")
    own.add_argument("--policy-version", help="the checkpoint's policy_version (default v1)")
    own.add_argument("--warmup", type=int, help="lr warm-up steps, then a cosine decay to 0 (default: a constant lr)")
    own.add_argument("--no-share-prefix", action="store_true", default=None,
                     help="run every row whole (default: rows of a step sharing a long prefix run it once)")
    p.set_defaults(func=main)
