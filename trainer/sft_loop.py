"""A plain torch SFT loop over `forge-convert --to tokens` shards: the fallback when veRL cannot start.

Reads `input_ids` and `loss_mask` (1 on the model's tokens) from the shards,
trains a causal LM with the masked next-token loss, and prints one line per
step (`step N loss X tokens T`). Used by `trainer/gpu_check.sh` on machines
where veRL's trainer cannot run (no Ray wheel), and runnable on CPU with a
tiny model. It needs only torch, transformers and pyarrow.

    python -m forgerl.trainer.sft_loop --tokens DIR --model PATH [--steps 20] [--lr 1e-4] [--max-length 4096]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow.parquet as pq


def rows(tokens: Path, max_length: int) -> list[tuple[list[int], list[int]]]:
    files = sorted(tokens.rglob("*.parquet"))
    if not files:
        raise ValueError(f"{tokens}: no parquet shards (make them with forge-convert --to tokens)")
    out = []
    for path in files:
        table = pq.read_table(path, columns=["input_ids", "loss_mask"])
        for ids, mask in zip(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist()):
            if any(mask):
                out.append((ids[-max_length:], mask[-max_length:]))  # keep the end: it holds the answers
    if not out:
        raise ValueError(f"{tokens}: no row has loss tokens")
    return out


def train(tokens: Path, model_path: Path, steps: int, lr: float, max_length: int, device: str) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    data = rows(tokens, max_length)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device).train()
    optim = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        ids, mask = data[step % len(data)]
        input_ids = torch.tensor([ids], device=device)
        labels = input_ids.clone()
        labels[torch.tensor([mask], device=device) == 0] = -100  # loss on the model's tokens only
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(loss.item())
        print(f"step {step + 1} loss {loss.item():.4f} tokens {len(ids)} trained {sum(mask)}", flush=True)
    return losses


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m forgerl.trainer.sft_loop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", required=True, type=Path)
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--max-length", type=int, default=4096)
    p.add_argument("--device", default="", help="cuda or cpu (default: cuda when available)")
    args = p.parse_args(argv)
    try:
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        losses = train(args.tokens, args.model, args.steps, args.lr, args.max_length, device)
    except (ValueError, OSError) as e:
        print(f"sft_loop: {e}", file=sys.stderr)
        return 2
    print(f"loss first {losses[0]:.4f} last {losses[-1]:.4f} on {device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
