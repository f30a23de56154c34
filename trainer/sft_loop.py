"""A plain torch SFT loop over `forge-convert --to tokens` shards: training without veRL.

Reads `input_ids` and `loss_mask` (1 on the model's tokens) from the shards,
trains a causal LM with the masked next-token loss, and prints one line per
step (`step N loss X tokens T trained M tok/s S`). `trainer/gpu_check.sh` runs
it (as a file: it needs only torch, transformers and pyarrow, not an installed
forgerl) on machines without veRL; it runs on CPU with a tiny model. The model
is a Hugging Face folder (`--model`) or a small random-initialised Qwen3 built
from a config on the spot (`--random-qwen3`), for machines with no weights.

    python trainer/sft_loop.py --tokens DIR (--model PATH | --random-qwen3) [--steps 20] [--device cpu]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

QWEN3_VOCAB = 151936  # Qwen3's tokenizer: the ids in recorded shards go up to here


class BadInput(Exception):
    """Shards or a model the loop cannot train on: one line, exit 2 (the loop runs as a file, without forgerl's
    `UserError`)."""


def read_rows(tokens: Path, columns: list[str]) -> list[dict[str, Any]]:
    """Every row of a tokens folder's parquet shards (`columns` only), in file order."""
    files = sorted(tokens.rglob("*.parquet"))
    if not files:
        raise BadInput(f"{tokens}: no parquet shards (make them with forge-convert --to tokens)")
    out = []
    for path in files:
        try:
            out += pq.read_table(path, columns=columns).to_pylist()
        except pa.ArrowInvalid as e:  # not parquet, or a column missing
            raise BadInput(f"{path}: not a tokens shard: {e}") from None
    return out


def rows(tokens: Path, max_length: int) -> list[tuple[list[int], list[int]]]:
    out = [(r["input_ids"][-max_length:], r["loss_mask"][-max_length:])  # keep the end: it holds the answers
           for r in read_rows(tokens, ["input_ids", "loss_mask"]) if any(r["loss_mask"])]
    if not out:
        raise BadInput(f"{tokens}: no row has loss tokens")
    return out


def load_model(model_path: Path | None, device: str, hidden: int = 256, layers: int = 4) -> Any:
    """The causal LM at `model_path`, or a random-initialised Qwen3 of `hidden` x `layers` (bf16 on GPU)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if model_path is not None:
        try:
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        except (OSError, ValueError) as e:  # no such folder, or a config transformers does not recognise
            raise BadInput(f"--model {model_path}: cannot load: {str(e).splitlines()[0]}") from None
        return model.to(device).train()
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=QWEN3_VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                         max_position_embeddings=65536, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).train()


def train(tokens: Path, model: Any, steps: int, lr: float, max_length: int, device: str) -> list[float]:
    import torch

    data = rows(tokens, max_length)
    optim = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(steps):
        ids, mask = data[step % len(data)]
        start = time.perf_counter()
        input_ids = torch.tensor([ids], device=device)
        labels = input_ids.clone()
        labels[torch.tensor([mask], device=device) == 0] = -100  # loss on the model's tokens only
        loss = model(input_ids=input_ids, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(loss.item())  # .item() waits for the device: the step's time is complete
        rate = len(ids) / (time.perf_counter() - start)
        print(f"step {step + 1} loss {loss.item():.4f} tokens {len(ids)} trained {sum(mask)} tok/s {rate:.0f}",
              flush=True)
    return losses


def loop_parser(prog: str, doc: str | None, steps: int, lr: float, max_length: int) -> argparse.ArgumentParser:
    """The options both torch loops take: shards, steps, learning rate, length, model and device."""
    p = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", required=True, type=Path, help="forge-convert --to tokens output")
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--lr", type=float, default=lr)
    p.add_argument("--max-length", type=int, default=max_length, help="cut each row to its last N tokens")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", type=Path, help="Hugging Face model folder")
    which.add_argument("--random-qwen3", action="store_true", help="a small random-initialised Qwen3 instead")
    p.add_argument("--hidden", type=int, default=256, help="--random-qwen3 hidden size (default 256)")
    p.add_argument("--layers", type=int, default=4, help="--random-qwen3 layers (default 4)")
    p.add_argument("--device", default="", help="cuda or cpu (default: cuda when available)")
    return p


def pick_device(asked: str) -> str:
    import torch

    return asked or ("cuda" if torch.cuda.is_available() else "cpu")


def main(argv: list[str] | None = None) -> int:
    args = loop_parser("python trainer/sft_loop.py", __doc__, steps=20, lr=1e-4, max_length=4096).parse_args(argv)
    try:
        device = pick_device(args.device)
        model = load_model(args.model, device, args.hidden, args.layers)
        losses = train(args.tokens, model, args.steps, args.lr, args.max_length, device)
    except BadInput as e:
        print(f"sft_loop: {e}", file=sys.stderr)
        return 2
    print(f"loss first {losses[0]:.4f} last {losses[-1]:.4f} on {device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
