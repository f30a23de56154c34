"""A plain torch SFT loop over `forge-convert --to tokens` shards: training without veRL.

Reads `input_ids` and `loss_mask` (1 on the model's tokens) from the shards'
`train/` split and trains a causal LM on the masked next-token loss, with
logits only at the loss positions (`torch_model.loss_logits`). No row is cut:
one longer than `--max-length` is left out and counted. A step takes rows in
a seeded shuffled order until they hold `--batch-tokens` (at least one row;
0: one row a step), the loss the mean over the step's loss tokens. Rows of a
step that share at least `SHARE_PREFIX` leading tokens (a harness's system
prompt and tools) run that prefix once, their remainders in padded batches
against its keys and values, each batch's graph freed by its backward, then
one backward through the prefix with their summed gradient
(`torch_model.shared_prefix_backward`: the row-by-row gradient up to float
rounding); `--no-share-prefix` runs every row whole. `--warmup N` raises the
learning rate over N steps, then decays it to 0 along a cosine (`lr_factor`). Prints one line per
step (`step N loss X rows R tokens T trained M shared P s S tok/s K`, P the
tokens not recomputed). `forge-train sft --engine torch` runs it and writes
the checkpoint; `trainer/gpu_check.sh` runs it as a file
(it needs torch, transformers and pyarrow, not an installed forgerl), with a
Hugging Face folder (`--model`) or a small random Qwen3 (`--random-qwen3`).

    python trainer/sft_loop.py --tokens DIR (--model PATH | --random-qwen3) [--steps 20] [--device cpu]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

if __package__:
    from .torch_model import BadInput, load_model, loss_logits, pick_device, shared_prefix_backward
else:  # run as a file (gpu_check.sh): its folder is on sys.path, forgerl need not be installed
    from torch_model import BadInput, load_model, loss_logits, pick_device, shared_prefix_backward

SHARE_PREFIX = 32  # the fewest shared leading tokens that make rows of a step run their prefix once


@dataclass
class SftRow:
    where: str  # shard file, row, session and segment: what a refusal names
    ids: list[int]
    mask: list[int]


def read_rows(tokens: Path, columns: list[str]) -> list[dict[str, Any]]:
    """Every row of a tokens folder's parquet shards (`columns` only), in file order."""
    return [r for path in shard_files(tokens) for r in read_table(path, columns)]


def shard_files(tokens: Path, split: str = "") -> list[Path]:
    files = sorted((tokens / split).rglob("*.parquet"))
    if not files:
        raise BadInput(f"{tokens / split}: no parquet shards (make them with forge-convert --to tokens)")
    return files


def read_table(path: Path, columns: list[str]) -> list[dict[str, Any]]:
    try:
        return pq.read_table(path, columns=columns).to_pylist()
    except (pa.ArrowInvalid, KeyError) as e:  # not parquet, or a column missing
        raise BadInput(f"{path}: not a tokens shard: {e}") from None


def sft_rows(tokens: Path) -> list[SftRow]:
    """The train split's rows that have loss tokens."""
    out = [SftRow(f"{path} row {i} (session {r['session_id']}, segment {r['segment_id']})", r["input_ids"],
                  r["loss_mask"])
           for path in shard_files(tokens, "train")
           for i, r in enumerate(read_table(path, ["input_ids", "loss_mask", "session_id", "segment_id"]))
           if any(r["loss_mask"])]
    if not out:
        raise BadInput(f"{tokens}: no row has loss tokens")
    return out


def fitting(data: list[SftRow], max_length: int) -> tuple[list[SftRow], int]:
    """The rows of at most `max_length` tokens (0: all), and how many were left out."""
    kept = [r for r in data if not max_length or len(r.ids) <= max_length]
    if not kept:
        raise BadInput(f"no row fits --max-length {max_length} (the shortest has {min(len(r.ids) for r in data)} "
                       f"tokens); rows are left out, never cut")
    return kept, len(data) - len(kept)


def plan(data: list[SftRow], seed: int, batch_tokens: int, steps: int | None = None,
         epochs: int = 1) -> list[list[int]]:
    """The row indices of each step: `epochs` passes, or as many as `steps` needs, each pass in its own seeded
    order; a step takes rows until the next would pass `batch_tokens`."""
    out: list[list[int]] = []
    epoch = 0
    while (len(out) < steps) if steps is not None else (epoch < epochs):
        order = list(range(len(data)))
        random.Random(seed * 1000003 + epoch).shuffle(order)
        step: list[int] = []
        size = 0
        for i in order:
            if step and size + len(data[i].ids) > batch_tokens:
                out.append(step)
                step, size = [], 0
            step.append(i)
            size += len(data[i].ids)
        out.append(step)
        epoch += 1
    return out[:steps] if steps is not None else out


def prefix_groups(data: list[SftRow], step: list[int], least: int) -> list[tuple[int, list[int]]]:
    """The step's rows as (shared prefix length, rows), the groups that skip the most recomputed tokens (prefix
    times rows after the first): rows sorted by their ids, a run of them kept together or cut where neighbours
    share least (a trie's branches), a group's prefix at least `least` tokens (0: every row alone, prefix 0)
    and a token short of its shortest row, so every row has a remainder."""
    order = sorted(step, key=lambda i: (data[i].ids, i))
    shared = [min(len(os.path.commonprefix([data[a].ids, data[b].ids])), len(data[a].ids) - 1,
                  len(data[b].ids) - 1) for a, b in zip(order, order[1:])]  # commonprefix takes any sequences

    def best(lo: int, hi: int) -> tuple[int, list[tuple[int, list[int]]]]:  # rows order[lo:hi]: saved, groups
        if hi - lo == 1 or not least:
            return 0, [(0, [i]) for i in order[lo:hi]]
        low = min(shared[lo:hi - 1])
        cuts = [lo] + [k + 1 for k in range(lo, hi - 1) if shared[k] == low] + [hi]
        parts = [best(a, b) for a, b in zip(cuts, cuts[1:])]
        apart = sum(saved for saved, _ in parts)
        if low >= least and low * (hi - lo - 1) >= apart:
            return low * (hi - lo - 1), [(low, order[lo:hi])]
        return apart, [group for _, groups in parts for group in groups]

    return best(0, len(order))[1]


def lr_factor(step: int, steps: int, warmup: int | None) -> float:
    """The learning rate's share at `step` (0-based) of `steps`: 1 throughout when `warmup` is None, else a
    linear rise over `warmup` steps and a cosine fall to 0 at the end (a few hundred steps from random weights:
    the early steps would otherwise overshoot, the late ones keep shaking what was learned)."""
    if warmup is None:
        return 1.0
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def train(data: list[SftRow], steps: list[list[int]], model: Any, lr: float, device: str,
          log: Callable[[str], None] = print, share_prefix: int = SHARE_PREFIX,
          warmup: int | None = None) -> list[float]:
    """AdamW over the planned steps (`step_gradient`), the rate shaped by `lr_factor`; each step's loss, the
    mean over its loss tokens."""
    import torch

    optim = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for n, step in enumerate(steps):
        start = time.perf_counter()
        for group in optim.param_groups:
            group["lr"] = lr * lr_factor(n, len(steps), warmup)
        total, trained, shared = step_gradient(data, step, model, device, share_prefix)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(total)
        seconds = time.perf_counter() - start
        tokens = sum(len(data[i].ids) for i in step)
        log(f"step {n + 1} loss {total:.4f} rows {len(step)} tokens {tokens} trained {trained} "
            f"shared {shared} s {seconds:.2f} tok/s {tokens / seconds:.0f}")
    return losses


def step_gradient(data: list[SftRow], step: list[int], model: Any, device: str,
                  share_prefix: int) -> tuple[float, int, int]:
    """Backpropagate one step's loss, the sum of its rows' loss-token cross entropies over their count, into the
    model's `.grad`. Rows sharing at least `share_prefix` leading tokens (0: none) run that prefix once
    (`shared_prefix_backward`): the same gradient as row by row, up to float rounding.
    Returns the loss, the loss tokens, and the tokens the decoder did not recompute."""
    import torch

    trained = sum(sum(data[i].mask[1:]) for i in step)  # position 0 has nothing before it to predict from

    def loss(logits: Any, ids: Any, wanted: Any) -> Any:
        return torch.nn.functional.cross_entropy(logits, ids[wanted], reduction="sum") / trained

    total = 0.0
    groups = prefix_groups(data, step, share_prefix)
    for prefix, group in groups:
        ids = [torch.tensor(data[i].ids, device=device) for i in group]
        targets = [torch.tensor(data[i].mask, device=device) > 0 for i in group]
        for wanted in targets:
            wanted[0] = False
        if prefix:
            total += shared_prefix_backward(model, ids, targets, prefix, loss)
            continue
        row_loss = loss(loss_logits(model, ids[0][None], None, targets[0][None]), ids[0], targets[0])
        row_loss.backward()  # per row: its activations are freed before the next
        total += row_loss.item()
    return total, trained, sum(prefix * (len(group) - 1) for prefix, group in groups)


def loop_parser(prog: str, doc: str | None, steps: int, lr: float, max_length: int,
                max_length_help: str = "cut each row to its last N tokens") -> argparse.ArgumentParser:
    """The options both torch loops take: shards, steps, learning rate, length, model and device."""
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", required=True, type=Path, help="forge-convert --to tokens output")
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--max-length", type=int, default=max_length, help=max_length_help)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", type=Path, help="Hugging Face model folder")
    which.add_argument("--random-qwen3", action="store_true", help="a small random-initialised Qwen3 instead")
    p.add_argument("--hidden", type=int, default=256, help="--random-qwen3 hidden size (default 256)")
    p.add_argument("--layers", type=int, default=4, help="--random-qwen3 layers (default 4)")
    p.add_argument("--device", default="", help="cuda or cpu (default: cuda when available)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = loop_parser("python trainer/sft_loop.py", __doc__, steps=20, lr=1e-4, max_length=0,
                    max_length_help="leave out rows longer than N tokens (default 0: none)")
    p.add_argument("--batch-tokens", type=int, default=0, help="tokens a step takes (default 0: one row)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-share-prefix", action="store_true", help="run every row whole, even with a shared prefix")
    p.add_argument("--warmup", type=int, help="warm up over N steps, then a cosine decay to 0 (default: constant lr)")
    args = p.parse_args(argv)
    try:
        data, left_out = fitting(sft_rows(args.tokens), args.max_length)
        device = pick_device(args.device)
        model = load_model(args.model, device, args.hidden, args.layers, args.seed)
        losses = train(data, plan(data, args.seed, args.batch_tokens, steps=args.steps), model, args.lr, device,
                       share_prefix=0 if args.no_share_prefix else SHARE_PREFIX, warmup=args.warmup)
    except BadInput as e:
        print(f"sft_loop: {e}", file=sys.stderr)
        return 2
    trained = f"loss first {losses[0]:.4f} last {losses[-1]:.4f}" if losses else "no steps"
    print(f"{trained} on {device}; {len(data)} rows, {left_out} longer than --max-length left out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
