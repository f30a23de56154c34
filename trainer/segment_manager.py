"""veRL agent loop manager that trains every segment of a harness rollout (`agent_loop_manager_class`).

veRL 0.9.1's V1 trainer (`trainer.use_v1`, its default) takes any number of
outputs per rollout: its TransferQueue worker stores each as
`{uid}_{session}_{index}` under the prompt's uid, its GRPO
(`compute_advantage_for_multi_trajectories`) takes each rollout's last output
for the group baseline and gives that advantage to all its outputs, and its
trainer pads a batch with fully masked rows (`upsample_batch_to_divisible_size`,
tagged `is_padding`) until it divides by the data-parallel size and the PPO
mini-batch. The `forgerl_harness` loop, with `forgerl.rows` set to `thread`
or `per_call`, returns every segment (or call) of the rollout, last segment
last; this manager's workers turn them into training rows:

- each row carries the rollout's reward, copied or discounted by position
  (`forgerl.segment_reward`, `forgerl.gamma`), in its `rm_scores`;
- each row's loss weight (`forgerl.weighting`: a rollout counts once, or each
  segment does) goes to veRL's `rollout_is_weights`, which its policy loss
  multiplies in; the maths, and why, are in `segment_rl.py`;
- an infrastructure failure (the loop's fully masked output) is dropped, so
  that it neither trains nor pulls its group's baseline to 0 (veRL's GRPO
  skips rollouts that returned nothing), and is counted;
- each finished rollout's counts (rows, whether it was an infrastructure
  failure, the tool calls the policy wrote that did not parse) go into its
  prompt's TransferQueue tag (`forgerl_{session}`), next to veRL's status.

veRL's V1 trainer gives an agent loop manager no way back into its metrics
(`generate_sequences` only dispatches; the rows reach the trainer through
TransferQueue). What it does log is what its replay buffer's `sample`
returns beside the batch, so `SegmentReplayBuffer` (set as
`trainer.v1.sampler.custom_sampler`) reads the sampled prompts' tags and adds
`forgerl/segments_per_rollout/{mean,max}`, `forgerl/infra_masked` and
`forgerl/malformed_tool_calls` (`segment_rl.rollout_metrics`) to the step's
metrics dict. Padding rows are added by the trainer after sampling, with no
hook to count them there; they are tagged `is_padding` and the trainer leaves
them out of its own metrics.

`forge-train rl` writes the `forgerl` section and points
`actor_rollout_ref.rollout.agent.agent_loop_manager_class` and the sampler here.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray
import torch
import transfer_queue as tq
from omegaconf import DictConfig
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

from .segment_rl import LOSS_AGG_MODES, Expansion, rollout_metrics, rollout_rows

log = logging.getLogger(__name__)
STATS_TAG = "forgerl_"  # + session id: a prompt tag holding [rows, infrastructure failure, malformed tool calls]


class SegmentOutput(AgentLoopOutput):
    """A training row: veRL's output plus the row's own reward and loss weight, written into the fields
    veRL stores (`rm_scores` at the last response token, `rollout_is_weights` on every response token).
    veRL's worker copies the final output's reward onto earlier ones; `row_reward` is what is stored."""

    row_reward: float = 0.0
    loss_weight: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        out.pop("row_reward", None)
        out.pop("loss_weight", None)
        scores = torch.zeros_like(out["response_mask"], dtype=torch.float32)
        scores[-1] = self.row_reward
        out["rm_scores"] = scores
        out["rollout_is_weights"] = torch.full_like(out["response_mask"], self.loss_weight, dtype=torch.float32)
        return out


def expand(outputs: list[AgentLoopOutput], expansion: Expansion, loss_agg_mode: str, group: str = "",
           rollout: str = "") -> list[SegmentOutput]:
    """A finished rollout's outputs (last segment last, each with the rollout's reward) as training rows."""
    reward = outputs[-1].reward_score or 0.0
    segments = [(o.prompt_ids, o.response_ids, o.response_mask, o.response_logprobs or []) for o in outputs]
    rows = rollout_rows(group, rollout, segments, reward, expansion.segment_reward, expansion.gamma,
                        expansion.weighting, loss_agg_mode)
    expanded = []
    for out, row in zip(outputs, rows):
        fields = {name: getattr(out, name) for name in out.model_fields_set}  # veRL stores what was set
        fields["reward_score"] = reward  # veRL's copy for earlier rows; the stored reward is row_reward
        fields["extra_fields"] = {**out.extra_fields, "reward_extra_info": {}, "forge_row_weight": row.weight}
        expanded.append(SegmentOutput(**fields, row_reward=row.reward, loss_weight=row.weight))
    return expanded


class SegmentAgentLoopWorker(AgentLoopWorkerTQ.__ray_actor_class__):  # veRL's TQ worker, before ray.remote
    """veRL's TransferQueue agent loop worker, with each rollout expanded into its rows."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.expansion = Expansion.of(self.config)
        self.loss_agg_mode = self.config.actor_rollout_ref.actor.loss_agg_mode
        self.infra_failures = 0
        # TransferQueue merges a tag on the client (read, update, write back): a prompt's sessions finish
        # concurrently on this worker, so their tag writes take turns or one overwrites another
        self.tag_writes = asyncio.Lock()

    async def _agent_loop_postprocess(self, output: AgentLoopOutput | list[AgentLoopOutput], validate: bool,
                                      **kwargs: Any) -> None:
        outputs = output if isinstance(output, list) else [output]
        kept = [o for o in outputs if not o.extra_fields.get("forge_infra_error")]
        failed = len(kept) < len(outputs)
        if failed:
            self.infra_failures += 1
            log.warning("uid %s session %s: infrastructure failure, dropped (%d so far on this worker)",
                        kwargs.get("uid"), kwargs.get("session_id"), self.infra_failures)
        rows = expand(kept, self.expansion, self.loss_agg_mode, str(kwargs.get("uid")),
                      str(kwargs.get("session_id"))) if kept else []
        malformed = int(outputs[-1].extra_fields.get("forge_malformed_tool_calls", 0)) if outputs else 0
        counts = [len(rows), int(failed), malformed]
        async with self.tag_writes:
            await tq.async_kv_put(key=kwargs["uid"], partition_id="val" if validate else "train",
                                  tag={f"{STATS_TAG}{kwargs['session_id']}": counts})
        await super()._agent_loop_postprocess(rows, validate, **kwargs)


class SegmentMetrics:
    """veRL's replay buffer, whose `sample` also returns the sampled prompts' `forgerl/...` metrics."""

    _forgerl_metrics: dict[str, float] = {}

    def _materialize_batch(self, partition_id: str, selected_prompt_uids: list[str], partition_snapshot: dict) -> Any:
        tags = tq.kv_list(partition_id).get(partition_id, {})  # read before veRL clears the prompts' tags
        self._forgerl_metrics = group_metrics([tags.get(uid, {}) for uid in selected_prompt_uids])
        return super()._materialize_batch(partition_id, selected_prompt_uids, partition_snapshot)  # type: ignore[misc]

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        batch, metrics = super().sample(global_steps, partition_id, batch_size)  # type: ignore[misc]
        return batch, {**metrics, **self._forgerl_metrics}


class SegmentReplayBuffer(SegmentMetrics, ReplayBuffer):
    """`trainer.v1.sampler.custom_sampler` for veRL's `sync` trainer."""


class SegmentReplayBufferAsync(SegmentMetrics, ReplayBufferAsync):
    """`trainer.v1.sampler.custom_sampler` for veRL's asynchronous trainers."""


def group_metrics(prompt_tags: list[dict[str, Any]]) -> dict[str, float]:
    """`rollout_metrics` of the rollouts whose counts the workers put into their prompts' tags."""
    counts = [tag[key] for tag in prompt_tags for key in tag if key.startswith(STATS_TAG)]
    return rollout_metrics([rows for rows, failed, _ in counts if not failed], sum(failed for _, failed, _ in counts),
                           sum(malformed for _, _, malformed in counts))


def segment_sampler(**kwargs: Any) -> SegmentMetrics:
    """`trainer.v1.sampler.custom_sampler.name`: the buffer veRL would build for the trainer mode, with metrics."""
    return (SegmentReplayBuffer if kwargs["trainer_mode"] == "sync" else SegmentReplayBufferAsync)(**kwargs)


class SegmentAgentLoopManager(AgentLoopManagerTQ):
    """`actor_rollout_ref.rollout.agent.agent_loop_manager_class` for forgerl: workers that expand rollouts."""

    def __init__(self, config: DictConfig, *args: Any, **kwargs: Any):
        check_config(config)
        super().__init__(config, *args, **kwargs)
        self.agent_loop_workers_class = ray.remote(SegmentAgentLoopWorker)


def check_config(config: DictConfig) -> None:
    """The settings under which every row trains as `segment_rl.py` says, or a ValueError naming the key."""
    Expansion.of(config)
    if not config.trainer.get("use_v1", False):
        raise ValueError("trainer.use_v1=False: veRL's legacy trainer takes one output per rollout")
    if config.actor_rollout_ref.actor.loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"actor.loss_agg_mode must be one of {LOSS_AGG_MODES}")
    if (config.algorithm.get("filter_groups") or {}).get("enable"):
        raise ValueError("algorithm.filter_groups: veRL leaves group filtering to a custom sampler, and forgerl's "
                         "(segment_sampler, for the forgerl/... metrics) does not filter")
    correction = config.algorithm.get("rollout_correction") or {}
    if correction.get("rollout_is"):
        raise ValueError("algorithm.rollout_correction.rollout_is would replace the rows' loss weights "
                         "(rollout_is_weights); leave it null")
