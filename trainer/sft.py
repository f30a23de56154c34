"""`forge-train sft`: veRL's SFT trainer on `forge-convert --to verl-sft` shards.

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
`sft_loop.py` trains on.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from forgerl.converters.verl import SFT_DATASET_CLASS

from .launch import LaunchError, compose, module_command, run, write_config, yaml_list


def shard_files(data: Path) -> tuple[list[str], list[str], int | None]:
    """(train files, val files, the converter's max_length) of a verl-sft shards folder."""
    if not data.is_dir():
        raise LaunchError(f"--data: no such folder: {data}")
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


def main(args: argparse.Namespace) -> int:
    config = write_config(Path(args.out), "sft_config", compose("sft_trainer_engine", overrides(args)))
    print(f"# veRL SFT config: {config}", flush=True)
    if args.accept_template_mismatch:
        print("# data.ignore_input_ids_mismatch=True: rows whose per-turn and whole renders differ train on the "
              "per-turn render, without the reasoning of those turns", flush=True)
    if args.dry_run:
        print(config.read_text(), end="")
    return run(module_command("verl.trainer.sft_trainer", config, args.nproc), args.dry_run)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sft", help="veRL SFT on verl-sft shards (torchrun)")
    p.add_argument("--data", required=True, help="forge-convert --to verl-sft output folder")
    p.add_argument("--model", required=True, help="Hugging Face model folder to start from")
    p.add_argument("--out", default="forge-sft", help="where the config and checkpoints go (default ./forge-sft)")
    p.add_argument("--nproc", type=int, default=1, help="GPUs on this node (default 1)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32, help="global batch size")
    p.add_argument("--micro-batch-size", type=int, default=1, help="per-GPU micro batch")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--max-length", type=int, default=0, help="max tokens per row (default: the converter's)")
    p.add_argument("--name", default="run", help="experiment name")
    p.add_argument("--accept-template-mismatch", action="store_true",
                   help="train rows whose per-turn render differs from the whole render (reasoning dropped)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="any further veRL override, repeatable")
    p.add_argument("--dry-run", action="store_true", help="print the config and the command, run nothing")
    p.set_defaults(func=main)
