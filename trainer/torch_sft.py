"""`forge-train sft --engine torch`: the project's torch loop on `forge-convert --to tokens` shards, on CPU.

No veRL: `sft_loop.py` trains a Hugging Face folder (`--model`) or a seeded
random Qwen3 (`--random-qwen3`) and this writes the checkpoint folder vLLM,
the policy server and serve mode load (`torch_model.save_checkpoint`): the
weights in the dtype they trained in, the tokenizer the shards were made with
(checked against the manifest's hashes: the ids must be that tokenizer's), and
`forgerl_policy.json` (version, parent, seed, shards, loss, time, peak RSS).
Before the first step every row's loss spans are checked against the
tokenizer's chat-template markers (`shard_checks.py`). `--steps 0` writes the
untrained model: v0.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from forgerl.converters.tokenizer import load_tokenizer, tokenizer_hash
from forgerl.errors import UserError, removed_on_user_error
from forgerl.schema.templates import POLICY_FILE, folder_template_sha256

from .policy_record import policy_record
from .shard_checks import ChatMarkers, check_loss_spans
from .sft_loop import SHARE_PREFIX, fitting, plan, sft_rows, train
from .torch_model import QWEN3_VOCAB, BadInput, load_model, pick_device, random_qwen3, save_checkpoint, train_dtype


class SftError(UserError):
    """Shards, a model or options `--engine torch` cannot train on: one line, exit 2."""


def tokens_manifest(data: Path) -> dict[str, Any]:
    """The manifest of a `forge-convert --to tokens` folder made with a tokenizer folder; refuse anything else."""
    path = data / "manifest.json"
    if not path.is_file():
        raise SftError(f"--data {data}: no manifest.json (make the shards with forge-convert DATASET --to tokens "
                       f"--tokenizer DIR --out SHARDS)")
    manifest = json.loads(path.read_text())
    if manifest.get("target") != "tokens":
        raise SftError(f"--data {data}: {manifest.get('target')} shards; --engine torch trains on tokens shards: "
                       f"forge-convert DATASET --to tokens --tokenizer DIR --out SHARDS")
    name = (manifest.get("tokenizer") or {}).get("name")
    if not name or not Path(name).is_dir():
        raise SftError(f"--data {data}: the shards' tokenizer {name!r} is not a folder here; the checkpoint carries "
                       f"the tokenizer its ids came from (forge-convert --to tokens --tokenizer DIR)")
    return manifest


def shards_tokenizer(manifest: dict[str, Any], data: Path) -> tuple[Path, Any]:
    """The shards' tokenizer folder and the tokenizer, unchanged since the shards were made."""
    recorded = manifest["tokenizer"]
    folder = Path(recorded["name"])
    tokenizer = load_tokenizer(str(folder))
    now = {"sha256": tokenizer_hash(tokenizer), "chat_template_sha256": folder_template_sha256(folder)}
    for key, value in now.items():
        if recorded.get(key, value) != value:
            raise SftError(f"--data {data}: the tokenizer at {folder} changed since the shards were made "
                           f"({key} {recorded[key][:12]} in the manifest, {value[:12] if value else None} now)")
    return folder, tokenizer


def start_model(args: argparse.Namespace, tokenizer: Any, markers: ChatMarkers,
                device: str) -> tuple[Any, tuple[str, str | None]]:
    """The model to train and where it came from (`base`, parent version)."""
    if args.model is None:
        model = random_qwen3(args.hidden, args.layers, train_dtype(device), args.seed,
                             max(QWEN3_VOCAB, len(tokenizer.get_vocab())), eos_id=markers.end).to(device).train()
        return model, (f"random-qwen3 {args.hidden}/{args.layers}", None)
    model = load_model(args.model, device, seed=args.seed)
    parent_file = args.model / POLICY_FILE
    parent = json.loads(parent_file.read_text()).get("policy_version") if parent_file.is_file() else None
    return model, (str(args.model.resolve()), parent)


def main(args: argparse.Namespace) -> int:
    import torch

    data, out = Path(args.data), Path(args.out)
    if not data.is_dir():
        raise SftError(f"--data: no such folder: {data}")
    if out.exists() and any(out.iterdir()):
        raise SftError(f"--out {out}: exists and is not empty")
    manifest = tokens_manifest(data)
    folder, tokenizer = shards_tokenizer(manifest, data)
    markers = ChatMarkers.of(tokenizer)
    started = time.perf_counter()
    try:
        rows = sft_rows(data)
        checked = check_loss_spans(((r.where, r.ids, r.mask) for r in rows), markers)
        kept, left_out = fitting(rows, args.max_length)
        device = pick_device("")
        torch.manual_seed(args.seed)
        model, (base, parent) = start_model(args, tokenizer, markers, device)
        vocab = model.get_input_embeddings().num_embeddings
        if max(max(r.ids) for r in kept) >= vocab:
            raise BadInput(f"--model {args.model}: {vocab} embedding rows, the shards hold larger token ids")
        steps = plan(kept, args.seed, args.batch_tokens, args.steps, args.epochs)
        print(f"sft: {len(kept)} rows ({checked} loss-span checked, {left_out} longer than --max-length "
              f"{args.max_length} left out), {len(steps)} steps, {base} on {device}", flush=True)
        losses = train(kept, steps, model, args.lr, device, lambda line: print(line, flush=True),
                       0 if args.no_share_prefix else SHARE_PREFIX, args.warmup)
    except BadInput as e:
        raise SftError(str(e)) from None
    seconds = time.perf_counter() - started
    policy = policy_record(model, version=args.policy_version, parent=parent, seed=args.seed, base=base, shards=data,
                           template_folder=folder, steps=len(steps), losses=losses, seconds=seconds)
    with removed_on_user_error(out):
        save_checkpoint(model.eval(), out, folder, policy)
    trained = f"loss first {losses[0]:.4f} last {losses[-1]:.4f}" if losses else "untrained"
    print(f"sft done: {len(steps)} steps, {trained}, {seconds:.1f} s, peak RSS {policy['peak_rss_mb']:.0f} MB -> {out} "
          f"({args.policy_version})", flush=True)
    return 0
