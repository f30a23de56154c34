"""One GRPO step in plain torch over `forge-convert --to tokens` shards, every segment a row.

The GPU smoke check's RL half (`trainer/gpu_check.sh`, on machines without
veRL): each session of the shards is a rollout, each of its rows (segments,
or calls with `--mode per-call`) a training row, all rollouts one prompt
group. Rows get their reward and loss weight, the batch its fully masked
padding rows and its GRPO advantages from `segment_rl.py` -- the same maths
the veRL path hands to veRL -- then each mini-batch is one PPO update (old log
probs recomputed by the model before the step, as veRL does). Prints the loss
per mini-batch, tokens/s, and the expansion metrics.

Tokens shards carry no call times, so a session's rows are ordered by segment
index (creation order) and the last one is taken as the final. A session with
no reward (an ungraded recording) gets a stand-in: 1 for even, 0 for odd
sessions in file order, so the group has something to compare (`--rewards
stand-in` says so in the output; the smoke checks the mechanics, not learning).

    python trainer/rl_loop.py --tokens DIR (--model PATH | --random-qwen3) [--steps 1] [--device cpu]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

if __package__:
    from .segment_rl import (LOSS_AGG_MODES, SEGMENT_REWARDS, WEIGHTINGS, Row, batch_multiple, expansion_metrics,
                             padding_rows, policy_loss, rollout_rows, to_batch)
    from .sft_loop import loop_parser, read_rows
    from .torch_model import BadInput, load_model, pick_device, token_logprobs
else:  # run as a file (gpu_check.sh): its folder is on sys.path, forgerl need not be installed
    from segment_rl import (LOSS_AGG_MODES, SEGMENT_REWARDS, WEIGHTINGS, Row, batch_multiple, expansion_metrics,
                            padding_rows, policy_loss, rollout_rows, to_batch)
    from sft_loop import loop_parser, read_rows
    from torch_model import BadInput, load_model, pick_device, token_logprobs

COLUMNS = ["session_id", "segment_index", "input_ids", "loss_mask", "reward"]


def sessions_of(rows: list[dict[str, Any]], max_length: int) -> dict[str, list[dict[str, Any]]]:
    """Token rows with loss tokens in their last `max_length` by session, each session's in segment order."""
    sessions: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if any(r["loss_mask"][-max_length:]):
            sessions.setdefault(r["session_id"], []).append(r)
    for found in sessions.values():
        found.sort(key=lambda r: r["segment_index"])
    return sessions


def segments(rows: list[dict[str, Any]], max_length: int) -> list[tuple[list[int], list[int], list[int], list]]:
    """A session's rows as `rollout_rows` segments (prompt ids, response ids, response mask, no logprobs), each
    cut to its last `max_length` tokens; the response starts at the first loss token."""
    out = []
    for r in rows:
        ids, mask = r["input_ids"][-max_length:], r["loss_mask"][-max_length:]
        start = mask.index(1)
        out.append((ids[:start], ids[start:], mask[start:], []))
    return out


def shard_rows(tokens: Path, max_length: int, segment_reward: str, gamma: float, weighting: str,
               loss_agg_mode: str) -> tuple[list[Row], bool]:
    """The shards' rows as training rows (each cut to its last `max_length` tokens), and whether any reward
    is a stand-in."""
    sessions = sessions_of(read_rows(tokens, COLUMNS), max_length)
    if not sessions:
        raise BadInput(f"{tokens}: no row has loss tokens")
    out: list[Row] = []
    stand_in = False
    for n, (session, found) in enumerate(sessions.items()):
        reward = found[-1]["reward"]
        if reward is None:
            reward, stand_in = float(n % 2 == 0), True
        out += rollout_rows("smoke", session, segments(found, max_length), float(reward), segment_reward, gamma,
                            weighting, loss_agg_mode)
    return out, stand_in


def rl_step(model: Any, padded: list[Row], device: str, lr: float, mini_batch_rows: int, loss_agg_mode: str,
            step: int) -> list[float]:
    """One PPO pass over `padded` (whole mini-batches): one update per mini-batch."""
    import torch

    whole = to_batch(padded, pad_id=0)  # the group's advantages need every rollout
    optim = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for m, first in enumerate(range(0, len(padded), mini_batch_rows)):
        rows_of = slice(first, first + mini_batch_rows)
        width = int(whole.attention_mask[rows_of].sum(-1).max())
        part = {name: getattr(whole, name)[rows_of, :width].to(device)
                for name in ("input_ids", "attention_mask", "response_mask", "advantages", "weights")}
        start = time.perf_counter()
        with torch.no_grad():
            old = token_logprobs(model, part["input_ids"], part["attention_mask"], part["response_mask"])
        new = token_logprobs(model, part["input_ids"], part["attention_mask"], part["response_mask"])
        loss = policy_loss(new, old, part["advantages"], part["response_mask"], part["weights"],
                           loss_agg_mode=loss_agg_mode)
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(loss.item())
        tokens = int(part["attention_mask"].sum())
        print(f"rl step {step} minibatch {m + 1} loss {loss.item():.6f} rows {len(padded[rows_of])} "
              f"tokens {tokens} tok/s {tokens / (time.perf_counter() - start):.0f}", flush=True)
    return losses


def main(argv: list[str] | None = None) -> int:
    p = loop_parser("python trainer/rl_loop.py", __doc__, steps=1, lr=1e-5, max_length=2048)
    p.add_argument("--mini-batch-rows", type=int, default=4)
    p.add_argument("--dp-size", type=int, default=1, help="rows must also divide by this (padding rows)")
    p.add_argument("--segment-reward", choices=SEGMENT_REWARDS, default="copy")
    p.add_argument("--gamma", type=float, default=0.9)
    p.add_argument("--weighting", choices=WEIGHTINGS, default="rollout")
    p.add_argument("--loss-agg-mode", choices=LOSS_AGG_MODES, default="seq-mean-token-mean")
    args = p.parse_args(argv)
    try:
        rows, stand_in = shard_rows(args.tokens, args.max_length, args.segment_reward, args.gamma, args.weighting,
                                    args.loss_agg_mode)
        device = pick_device(args.device)
        model = load_model(args.model, device, args.hidden, args.layers)
    except BadInput as e:
        print(f"rl_loop: {e}", file=sys.stderr)
        return 2
    padded = rows + padding_rows(len(rows), batch_multiple(args.dp_size, args.mini_batch_rows), pad_id=0)
    print(f"rows {len(rows)} rewards {'stand-in' if stand_in else 'recorded'} {expansion_metrics(padded)}",
          flush=True)
    for step in range(args.steps):
        rl_step(model, padded, device, args.lr, args.mini_batch_rows, args.loss_agg_mode, step + 1)
    print(f"rl done on {device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
