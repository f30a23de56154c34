"""Multi-segment GRPO in plain torch: row rewards, row weights, advantages, the PPO loss, padding rows.

A harness rollout is cut into segments (`forgerl.schema.segments`: subagents,
compactions, token breaks...); every segment becomes one training row (one per
call in per-call mode). Segments hold disjoint model tokens: each call belongs
to exactly one segment. This module is the maths of that expansion, importing
only torch, so the GPU smoke loop (`rl_loop.py`, no veRL there) and the veRL
path (`segment_manager.py`, which hands the same numbers to veRL) share it;
`tests/test_trainer_segments.py` checks it against veRL's own functions.

Rollout j of prompt group g (its uid) has graded reward R_j and K_j rows,
k = 0 .. K_j-1 in order of their last call, except that row K_j-1 is the one
holding the call grading read (the main thread's last: `trajectory.py`).

Baseline. veRL's GRPO groups rows by uid: mean and std over the group's rows.
Copied to K_j rows, R_j would count K_j times in that mean and std (a rollout
cut into 12 segments pulls the baseline 12 times as hard as an uncut one). So
the baseline is taken over one row per rollout, its final one, as veRL 0.9.1's
multi-trajectory GRPO does (`compute_advantage_for_multi_trajectories`):
    A_j = (R_j - mean_g R) / (std_g R + eps)      (std unbiased; a lone rollout: mean 0, std 1)
and A_j is given to every row of rollout j (times its response mask).

Row reward (`segment_reward`): `copy` -- every row carries R_j; `discount` --
row k carries gamma^(K_j-1-k) R_j (the final row R_j). Credit follows it: the
row's loss is scaled by c_k = gamma^(K_j-1-k) (1 for `copy`). It scales the
advantage, not the reward before the baseline: gamma^d R_j minus an
undiscounted baseline would turn an early segment of a successful rollout into
a negative advantage.

Loss weight (`weighting`). The PPO loss aggregates rows (`agg_loss`):
- `token-mean`: sum over model tokens / token count. Segments hold disjoint
  tokens, so a rollout weighs its model tokens however it is cut: no fix needed.
- `seq-mean-*`: each row is one sequence of the mean, so a rollout cut in K_j
  rows counts K_j times.
`weighting=rollout` (default) makes each rollout count once: rows get
u_k = 1/K_j under the seq-mean modes (1 under token-mean, where tokens already
count once). `weighting=segment` keeps u_k = 1: every segment is a sample.
The row's loss weight is w_k = c_k u_k; for the clipped PPO loss with w > 0,
w * loss(A) = loss(w A) exactly, so it is the advantage w_k A_j. veRL
multiplies its per-token policy loss by `rollout_is_weights`; the manager puts
w_k there (entropy and KL terms are not weighted).

Padding. Batches must divide by the data-parallel size and the PPO
mini-batch; padding rows are fully masked (response mask 0, weight 0, reward 0,
a group of their own): every loss term is multiplied by the mask, so their
gradient is exactly zero, and seq-mean modes leave fully masked rows out of
their count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

SEGMENT_REWARDS = ("copy", "discount")
WEIGHTINGS = ("rollout", "segment")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
PAD_GROUP = "pad"
ROWS = ("last", "thread", "per_call")
CONFIG_KEY = "forgerl"  # the PPO config section that holds an Expansion


@dataclass(frozen=True)
class Expansion:
    """The `forgerl` section of the PPO config: how a rollout becomes training rows."""

    rows: str = "last"  # last: the segment with the graded call only; thread: every segment; per_call: every call
    segment_reward: str = "copy"
    gamma: float = 1.0
    weighting: str = "rollout"

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Expansion:
        section = dict(config.get(CONFIG_KEY) or {})
        found = cls(**section)
        for name, allowed in (("rows", ROWS), ("segment_reward", SEGMENT_REWARDS), ("weighting", WEIGHTINGS)):
            if getattr(found, name) not in allowed:
                raise ValueError(f"{CONFIG_KEY}.{name} must be one of {allowed}, not {getattr(found, name)!r}")
        if not 0.0 < found.gamma <= 1.0:
            raise ValueError(f"{CONFIG_KEY}.gamma must be in (0, 1], not {found.gamma}")
        return found


def segment_rewards(reward: float, count: int, segment_reward: str = "copy", gamma: float = 1.0) -> list[float]:
    """The reward each of a rollout's `count` rows carries (the last row holds the graded call)."""
    return [reward * c for c in credits(count, segment_reward, gamma)]


def credits(count: int, segment_reward: str = "copy", gamma: float = 1.0) -> list[float]:
    if segment_reward not in SEGMENT_REWARDS:
        raise ValueError(f"segment_reward must be one of {SEGMENT_REWARDS}, not {segment_reward!r}")
    if segment_reward == "copy":
        return [1.0] * count
    return [gamma ** (count - 1 - k) for k in range(count)]


def row_weights(count: int, segment_reward: str = "copy", gamma: float = 1.0, weighting: str = "rollout",
                loss_agg_mode: str = "token-mean") -> list[float]:
    """w_k = c_k u_k for each of a rollout's rows (module docstring)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, not {weighting!r}")
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, not {loss_agg_mode!r}")
    per_row = 1.0 / count if weighting == "rollout" and loss_agg_mode.startswith("seq-mean") else 1.0
    return [c * per_row for c in credits(count, segment_reward, gamma)]


@dataclass
class Row:
    """One training row: a segment (or call) of a rollout, as the loss sees it."""

    group: str  # the prompt's uid: GRPO groups by it
    rollout: str  # the rollout the row came from
    final: bool  # holds the call grading read (the main thread's last)
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    reward: float  # the row's reward (segment_rewards)
    weight: float  # the row's loss weight (row_weights)
    logprobs: list[float] = field(default_factory=list)  # the policy's at sampling time (0 where mask is 0)
    padding: bool = False


def rollout_rows(group: str, rollout: str, segments: Sequence[tuple[list[int], list[int], list[int], list[float]]],
                 reward: float, segment_reward: str = "copy", gamma: float = 1.0, weighting: str = "rollout",
                 loss_agg_mode: str = "token-mean") -> list[Row]:
    """A rollout's rows from its segments (prompt ids, response ids, response mask, logprobs), in order."""
    count = len(segments)
    rewards = segment_rewards(reward, count, segment_reward, gamma)
    weights = row_weights(count, segment_reward, gamma, weighting, loss_agg_mode)
    return [Row(group, rollout, k == count - 1, list(p), list(r), list(m), rewards[k], weights[k], list(lp))
            for k, (p, r, m, lp) in enumerate(segments)]


def padding_rows(count: int, multiple: int, pad_id: int) -> list[Row]:
    """Fully masked rows that bring `count` rows up to a multiple of `multiple`."""
    missing = -count % multiple
    return [Row(f"{PAD_GROUP}{i}", f"{PAD_GROUP}{i}", True, [pad_id], [pad_id], [0], 0.0, 0.0, [0.0], padding=True)
            for i in range(missing)]


def batch_multiple(dp_size: int, mini_batch_rows: int) -> int:
    """What a batch's row count must divide by: every data-parallel rank gets whole mini-batches."""
    return math.lcm(dp_size, mini_batch_rows)


def grpo_advantages(rewards: torch.Tensor, groups: Sequence[str], rollouts: Sequence[str],
                    finals: Sequence[bool], response_mask: torch.Tensor, norm_by_std: bool = True,
                    epsilon: float = 1e-6) -> torch.Tensor:
    """Per-token advantages: GRPO over each group's final rows (one per rollout), given to all rows of the
    rollout. rewards: (rows,), response_mask: (rows, T)."""
    by_group: dict[str, list[int]] = {}
    for i, (group, final) in enumerate(zip(groups, finals)):
        if final:
            by_group.setdefault(group, []).append(i)
    of_rollout: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for rows in by_group.values():
            scores = rewards[rows].float()
            if len(rows) == 1:
                mean, std = torch.tensor(0.0), torch.tensor(1.0)
            else:
                mean, std = scores.mean(), scores.std()
            adv = (scores - mean) / (std + epsilon) if norm_by_std else scores - mean
            for i, a in zip(rows, adv):
                of_rollout[rollouts[i]] = a
        per_row = torch.stack([of_rollout[r] for r in rollouts])
    return per_row.unsqueeze(-1) * response_mask


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    """veRL's `agg_loss` on one data-parallel rank without global batch sizes (checked against it)."""
    mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        return (loss_mat * mask).sum() / mask.sum()
    seq_tokens = mask.sum(dim=-1)
    seq_mask = (seq_tokens > 0).to(loss_mat.dtype)
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        loss = ((loss_mat * mask).sum(dim=-1) * seq_mask).sum() / seq_mask.sum()
        return loss / loss_mask.shape[-1] if loss_agg_mode == "seq-mean-token-sum-norm" else loss
    if loss_agg_mode == "seq-mean-token-mean":
        seq_losses = (loss_mat * mask).sum(dim=-1) / (seq_tokens + 1e-8)
        return (seq_losses * seq_mask).sum() / seq_mask.sum()
    raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, not {loss_agg_mode!r}")


def policy_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor,
                response_mask: torch.Tensor, weights: torch.Tensor | None = None, clip_ratio: float = 0.2,
                clip_ratio_c: float = 3.0, loss_agg_mode: str = "token-mean") -> torch.Tensor:
    """veRL's vanilla (dual-clip) PPO policy loss, each token's loss times its row's weight (`weights`:
    (rows, T), veRL's `rollout_is_weights`)."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    clipped = torch.maximum(-advantages * ratio, -advantages * torch.clamp(ratio, 1 - clip_ratio, 1 + clip_ratio))
    dual = torch.min(-advantages * clip_ratio_c, clipped)
    losses = torch.where(advantages < 0, dual, clipped)
    if weights is not None:
        losses = losses * weights
    return agg_loss(losses, response_mask, loss_agg_mode)


@dataclass
class Batch:
    """Rows as right-padded tensors: prompt and response side by side in one sequence per row."""

    input_ids: torch.Tensor  # (rows, L): prompt + response, right-padded
    attention_mask: torch.Tensor  # (rows, L)
    response_mask: torch.Tensor  # (rows, L): 1 on model tokens of the response
    old_log_probs: torch.Tensor  # (rows, L): at response positions
    advantages: torch.Tensor  # (rows, L)
    weights: torch.Tensor  # (rows, L)


def to_batch(rows: Sequence[Row], pad_id: int, norm_by_std: bool = True) -> Batch:
    """Tensors for `rows`, with the GRPO advantages of their groups (positions are absolute: the response
    of a row starts after its prompt)."""
    length = max(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), length), dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.float32)
    old = torch.zeros((len(rows), length), dtype=torch.float32)
    weights = torch.zeros((len(rows), length), dtype=torch.float32)
    for i, r in enumerate(rows):
        n, m = len(r.prompt_ids), len(r.response_ids)
        ids[i, : n + m] = torch.tensor(r.prompt_ids + r.response_ids)
        attention[i, : n + m] = 1
        mask[i, n: n + m] = torch.tensor(r.response_mask, dtype=torch.float32)
        if r.logprobs:
            old[i, n: n + m] = torch.tensor(r.logprobs, dtype=torch.float32)
        weights[i, n: n + m] = r.weight
    rewards = torch.tensor([r.reward if r.final else 0.0 for r in rows])
    advantages = grpo_advantages(rewards, [r.group for r in rows], [r.rollout for r in rows],
                                 [r.final for r in rows], mask, norm_by_std)
    return Batch(ids, attention, mask, old, advantages, weights)


def rollout_metrics(rows_per_rollout: Sequence[int], infra_masked: int = 0, malformed_tool_calls: int = 0,
                    padding_rows: int | None = None) -> dict[str, float]:
    """The `forgerl/...` metrics of a batch: rows per trained rollout, rollouts dropped for an infrastructure
    failure, tool calls the policy wrote that did not parse (they stayed text), and padding rows where known."""
    counts = list(rows_per_rollout) or [0]
    metrics = {"forgerl/segments_per_rollout/mean": sum(counts) / len(counts),
               "forgerl/segments_per_rollout/max": float(max(counts)),
               "forgerl/infra_masked": float(infra_masked),
               "forgerl/malformed_tool_calls": float(malformed_tool_calls)}
    if padding_rows is not None:
        metrics["forgerl/padding_rows"] = float(padding_rows)
    return metrics


def expansion_metrics(rows: Sequence[Row], infra_failures: int = 0) -> dict[str, float]:
    """`rollout_metrics` of a batch of rows, padding included."""
    per_rollout: dict[str, int] = {}
    for r in rows:
        if not r.padding:
            per_rollout[r.rollout] = per_rollout.get(r.rollout, 0) + 1
    return rollout_metrics(list(per_rollout.values()), infra_failures, padding_rows=sum(r.padding for r in rows))
