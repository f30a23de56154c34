"""`forge-train check-serve`: does the served policy compute what the checkpoint computes?

A serve-mode call records the ids the policy server sampled and their
log-probabilities (`calls.completion_logprobs`). The checkpoint, run in torch
on the same prompt and completion ids, must give the same numbers: a server
that loaded other weights, another dtype, or renders another vocabulary shows
up here as a gap. Per call: the largest and the mean absolute difference;
beyond `--tolerance` (default 1e-3; float32 vLLM CPU on a float32 checkpoint
agrees to about 1e-6) the verb exits 2 with one line naming the worst call.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forgerl.errors import UserError
from forgerl.schema.files import MANIFEST
from forgerl.schema.store import read_table

from .policy_server import load_checkpoint
from .torch_model import token_logprobs

COLUMNS = ["call_id", "policy_version", "prompt_token_ids", "completion_token_ids", "completion_logprobs"]
DEFAULT_TOLERANCE = 1e-3


@dataclass(frozen=True)
class CallGap:
    call_id: str
    tokens: int
    max_abs: float
    mean_abs: float


def served_calls(dataset: Path, policy_version: str = "") -> list[dict[str, Any]]:
    """The dataset's calls with served ids and logprobs (of `policy_version` when given)."""
    if not (dataset / MANIFEST).exists():
        raise UserError(f"--data {dataset}: not a forgerl dataset (no {MANIFEST})")
    calls = [c for c in read_table(dataset, "calls", COLUMNS).to_pylist()
             if c["completion_token_ids"] and c["completion_logprobs"] and c["prompt_token_ids"]
             and (not policy_version or c["policy_version"] == policy_version)]
    if not calls:
        which = f" of policy {policy_version}" if policy_version else ""
        raise UserError(f"--data {dataset}: no served call{which} with completion ids and logprobs "
                        "(record with forge-run --policy or forge-record serve --policy)")
    return calls


def call_gaps(model: Any, calls: list[dict[str, Any]]) -> list[CallGap]:
    """Per call, |served logprob - checkpoint logprob| over its completion tokens."""
    import torch

    gaps = []
    with torch.no_grad():
        for call in calls:
            prompt, completion = call["prompt_token_ids"], call["completion_token_ids"]
            ids = torch.tensor([prompt + completion])
            mask = torch.zeros_like(ids)
            mask[0, len(prompt):] = 1
            mine = token_logprobs(model, ids, torch.ones_like(ids), mask)[0, len(prompt):]
            diff = (mine - torch.tensor(call["completion_logprobs"], dtype=mine.dtype)).abs()
            gaps.append(CallGap(call["call_id"], len(completion), float(diff.max()), float(diff.mean())))
    return gaps


def main(args: argparse.Namespace) -> int:
    calls = served_calls(Path(args.data), args.policy_version)  # bad --data: one line before the model loads
    gaps = call_gaps(load_checkpoint(Path(args.model)), calls)
    for gap in gaps:
        print(f"{gap.call_id} tokens {gap.tokens} max_abs {gap.max_abs:.3g} mean_abs {gap.mean_abs:.3g}")
    worst = max(gaps, key=lambda g: g.max_abs)
    tokens = sum(g.tokens for g in gaps)
    mean = sum(g.mean_abs * g.tokens for g in gaps) / tokens
    print(f"calls {len(gaps)} tokens {tokens} max_abs {worst.max_abs:.3g} mean_abs {mean:.3g} "
          f"tolerance {args.tolerance:g}")
    if worst.max_abs > args.tolerance:
        raise UserError(f"served logprobs differ from {args.model}'s by up to {worst.max_abs:.3g} "
                        f"(call {worst.call_id}; tolerance {args.tolerance:g}): the server is not serving this "
                        "checkpoint as it was trained")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-serve", help="compare the served policy's recorded logprobs with the checkpoint's own")
    p.add_argument("--data", required=True, help="dataset recorded in serve mode (forge-run --policy)")
    p.add_argument("--model", required=True, help="the checkpoint folder the server was serving")
    p.add_argument("--policy-version", default="", help="only calls tagged with this version")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help=f"largest absolute logprob difference accepted (default {DEFAULT_TOLERANCE:g})")
    p.set_defaults(func=main)
