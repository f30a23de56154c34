"""Every segment of a rollout reaches veRL: the rows, their rewards and weights, in veRL's own maths.

- `segment_rl.py` (plain torch, what the GPU loop uses) against veRL 0.9.1's
  GRPO, `agg_loss` and vanilla PPO loss;
- the weights: a rollout cut into 12 segments counts once in the baseline and
  in the loss; padding rows get exactly zero gradient (autograd);
- the rows of a rollout whose last call is not the main agent's (a memory
  extractor after the final answer): the graded segment (and call) comes last;
- a served Claude Code session with a subagent and a compaction: the agent
  loop's rows are exactly what `forge-convert --to tokens` cuts (thread and
  per-call), and the manager's worker, run by veRL's own `_run_prompt`,
  stores in veRL's TransferQueue (on a local Ray instance) rows that veRL's
  replay buffer samples and its `compute_advantage_for_multi_trajectories` and
  policy loss turn into the advantages and loss of `segment_rl.py`; the
  sampler's metrics count the rollouts' rows and the masked failure; veRL's
  own padding rows, put next to them, add nothing to that loss and get zero
  gradient.
"""

from __future__ import annotations

import asyncio
import os
from datetime import datetime, timezone

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from forgerl.trainer.segment_rl import (Expansion, Row, agg_loss, expansion_metrics, grpo_advantages,
                                        padding_rows, policy_loss, rollout_rows, row_weights, segment_rewards,
                                        to_batch)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@pytest.fixture(scope="module")
def verl_v1():
    """veRL's PPO maths and its V1 trainer's multi-trajectory GRPO."""
    from verl.trainer.ppo import core_algos
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    return core_algos, compute_advantage_for_multi_trajectories


@pytest.fixture(scope="module")
def transfer_queue():
    """TransferQueue as veRL's V1 trainer starts it (`tq.init`), on a local Ray instance, one storage unit.
    Its controller and storage unit are Ray actors, each holding a CPU while it lives."""
    import ray
    import transfer_queue as tq

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
        yield tq
        tq.close()
    finally:
        ray.shutdown()


def toy_rollout(group: str, name: str, count: int, reward: float, gen: torch.Generator, **how) -> list[Row]:
    segments = []
    for _ in range(count):
        n = int(torch.randint(2, 6, (1,), generator=gen))
        mask = [0] + [1] * (n - 1)
        segments.append(([1, 2, 3], list(range(10, 10 + n)), mask, [-0.5] * n))
    return rollout_rows(group, name, segments, reward, **how)


def test_rewards_and_weights():
    assert segment_rewards(1.0, 3) == [1.0, 1.0, 1.0]
    assert segment_rewards(1.0, 3, "discount", 0.5) == [0.25, 0.5, 1.0]
    assert row_weights(4, weighting="rollout", loss_agg_mode="seq-mean-token-mean") == [0.25] * 4
    assert row_weights(4, weighting="rollout", loss_agg_mode="token-mean") == [1.0] * 4  # tokens count once
    assert row_weights(2, "discount", 0.5, "segment", "seq-mean-token-mean") == [0.5, 1.0]
    with pytest.raises(ValueError, match="weighting must be one of"):
        row_weights(2, weighting="tokens")
    assert Expansion.of({}) == Expansion()
    with pytest.raises(ValueError, match="forgerl.rows must be one of"):
        Expansion.of({"forgerl": {"rows": "all"}})


@pytest.mark.parametrize("mode", MODES)
def test_agg_loss_is_verls(verl_v1, mode):
    core_algos, _ = verl_v1
    gen = torch.Generator().manual_seed(1)
    loss = torch.randn(5, 7, generator=gen)
    mask = (torch.rand(5, 7, generator=gen) > 0.3).float()
    mask[2] = 0  # a fully masked row
    assert agg_loss(loss, mask, mode) == pytest.approx(core_algos.agg_loss(loss, mask, mode).item(), rel=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_policy_loss_is_verls_with_row_weights(verl_v1, mode):
    core_algos, _ = verl_v1
    gen = torch.Generator().manual_seed(2)
    old, new = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)
    adv = torch.randn(4, 6, generator=gen)
    mask = (torch.rand(4, 6, generator=gen) > 0.2).float()
    weights = torch.rand(4, 1, generator=gen).expand(4, 6)
    config = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": None,
                               "clip_ratio_c": 3.0, "global_batch_info": {}})
    theirs, _ = core_algos.compute_policy_loss_vanilla(old, new, adv, mask, mode, config, rollout_is_weights=weights)
    assert policy_loss(new, old, adv, mask, weights, loss_agg_mode=mode).item() == pytest.approx(theirs.item(),
                                                                                               rel=1e-6)


def test_grpo_is_verls_multi_trajectory_grpo(verl_v1):
    """Baseline over each rollout's final row, its advantage on every row: veRL V1's own GRPO."""
    core_algos, multi = verl_v1
    from verl import DataProto

    gen = torch.Generator().manual_seed(3)
    rows = [*toy_rollout("g1", "a", 12, 1.0, gen), *toy_rollout("g1", "b", 1, 0.0, gen),
            *toy_rollout("g1", "c", 3, 1.0, gen), *toy_rollout("g2", "d", 2, 0.5, gen),
            *toy_rollout("g2", "e", 1, 0.0, gen)]
    batch = to_batch(rows, pad_id=0)
    keys, counter = [], {}
    for r in rows:
        keys.append(f"{r.group}_{r.rollout}_{counter.setdefault(r.rollout, 0)}")
        counter[r.rollout] += 1
    rewards = torch.zeros_like(batch.response_mask)
    for i, r in enumerate(rows):
        rewards[i, int(batch.attention_mask[i].sum()) - 1] = r.reward
    data = DataProto.from_dict({"response_mask": batch.response_mask, "token_level_rewards": rewards},
                               non_tensors={"uid": np.array([r.group for r in rows], dtype=object)})
    theirs = multi(data, keys, core_algos.AdvantageEstimator.GRPO).batch["advantages"]
    assert torch.allclose(batch.advantages, theirs, atol=1e-6)
    # the 12-segment rollout pulled the baseline once: its advantage is the one of 3 rollouts (1, 0, 1)
    a = batch.advantages[0][batch.response_mask[0] > 0][0]
    assert a.item() == pytest.approx((1 - 2 / 3) / (torch.tensor([1.0, 0.0, 1.0]).std().item() + 1e-6), rel=1e-5)
    # veRL's plain GRPO over the expanded rows counts it 12 times: a different, wrong baseline
    plain, _ = core_algos.compute_grpo_outcome_advantage(rewards, batch.response_mask, data.non_tensor_batch["uid"])
    assert not torch.allclose(plain, theirs, atol=1e-3)


def test_a_rollout_cut_in_12_counts_once():
    """Rollout a cut into 12 equal segments, next to an uncut rollout b. GRPO: every segment gets a's uncut
    advantage. Loss (seq-mean-token-mean): with weighting=rollout a and b keep equal shares -- the loss is the
    uncut one scaled by 2/13, as seq-mean divides by 13 rows instead of 2; weighting=segment gives a 12 shares."""
    mode = "seq-mean-token-mean"
    seg = ([1, 2], [5, 6, 7], [1, 1, 1], [-1.0, -1.0, -1.0])
    b = rollout_rows("g", "b", [([1, 2], [8, 9], [1, 1], [-1.0, -1.0])], 0.0, loss_agg_mode=mode)

    def losses(rows: list[Row]) -> tuple[torch.Tensor, list[float]]:
        """The batch loss, and each row's own unweighted loss with the batch's advantages."""
        batch = to_batch(rows, pad_id=0)
        log_prob = -0.1 * batch.input_ids.float()  # a "policy" that depends on the tokens only
        args = (batch.old_log_probs, batch.advantages, batch.response_mask)
        per_row = [policy_loss(log_prob[i:i + 1], *(t[i:i + 1] for t in args), loss_agg_mode=mode).item()
                   for i in range(len(rows))]
        return policy_loss(log_prob, *args, batch.weights, loss_agg_mode=mode), per_row

    uncut, (l_a, l_b) = losses(rollout_rows("g", "a", [seg], 1.0, loss_agg_mode=mode) + b)
    assert uncut.item() == pytest.approx((l_a + l_b) / 2, rel=1e-6)
    for weighting, shares in (("rollout", 1), ("segment", 12)):
        cut_rows = rollout_rows("g", "a", [seg] * 12, 1.0, weighting=weighting, loss_agg_mode=mode) + b
        cut, per_row = losses(cut_rows)
        assert per_row[:12] == pytest.approx([l_a] * 12) and per_row[12] == pytest.approx(l_b)
        assert cut.item() == pytest.approx((shares * l_a + l_b) / 13, rel=1e-5)
    assert losses(rollout_rows("g", "a", [seg] * 12, 1.0, loss_agg_mode=mode) + b)[0].item() == pytest.approx(
        uncut.item() * 2 / 13, rel=1e-5)


def test_padding_rows_carry_no_gradient():
    gen = torch.Generator().manual_seed(5)
    rows = [*toy_rollout("g", "a", 3, 1.0, gen), *toy_rollout("g", "b", 2, 0.0, gen)]
    pads = padding_rows(len(rows), 4, pad_id=0)
    assert len(rows) + len(pads) == 8 and all(p.padding for p in pads)
    for mode in MODES:
        batch = to_batch(rows + pads, pad_id=0)
        logits = torch.randn(batch.input_ids.shape, generator=gen, requires_grad=True)
        loss = policy_loss(torch.log_softmax(logits, -1), batch.old_log_probs, batch.advantages,
                           batch.response_mask, batch.weights, loss_agg_mode=mode)
        loss.backward()
        assert torch.count_nonzero(logits.grad[len(rows):]) == 0, mode
        assert torch.count_nonzero(logits.grad[: len(rows)]) > 0, mode
        alone = to_batch(rows, pad_id=0)
        width = alone.input_ids.shape[1]
        same = policy_loss(torch.log_softmax(logits[: len(rows), :width], -1), alone.old_log_probs,
                           alone.advantages, alone.response_mask, alone.weights, loss_agg_mode=mode)
        assert same.item() == pytest.approx(loss.item(), rel=1e-6), mode
    assert expansion_metrics(rows + pads, infra_failures=1) == {
        "forgerl/segments_per_rollout/mean": 2.5, "forgerl/segments_per_rollout/max": 3.0,
        "forgerl/padding_rows": 3.0, "forgerl/infra_masked": 1.0, "forgerl/malformed_tool_calls": 0.0}
    assert grpo_advantages(torch.tensor([0.0]), ["pad0"], ["pad0"], [True], torch.zeros(1, 3)).abs().sum() == 0


def test_the_graded_segment_is_the_last_row_even_when_a_subagent_calls_last():
    from forgerl.trainer.trajectory import per_call, segments

    t = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def call(k: int, index: int, reason: str, parent: int | None, prompt: list[int], completion: list[int]) -> dict:
        return {"call_id": f"c{k}", "session_id": "s", "seq": k, "t_start": t, "prompt_token_ids": prompt,
                "completion_token_ids": completion, "completion_logprobs": [-0.5] * len(completion),
                "segment_index": index, "segment_reason": reason, "parent_segment": parent,
                "parent_position": None if parent is None else 2}

    calls = [call(0, 0, "start", None, [1, 2], [3]), call(1, 0, "start", None, [1, 2, 3, 4], [5]),
             call(2, 1, "subagent", 0, [9, 2, 3, 4, 5, 6], [7])]  # the memory extractor, after the answer
    thread = segments(calls)
    assert [(s.index, s.sample_id("s")) for s in thread] == [(1, "s:1"), (0, "s:0")]
    assert (thread[-1].prompt_ids, thread[-1].response_ids, thread[-1].response_mask) == ([1, 2], [3, 4, 5],
                                                                                          [1, 0, 1])
    assert thread[-1].response_logprobs == [-0.5, 0.0, -0.5] and thread[-1].calls == 2
    assert [s.sample_id("s") for s in per_call(calls)] == ["s:0/0", "s:1/0", "s:0/1"]


# ---- a served Claude Code rollout with a subagent and a compaction ----

@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The recorded rollout, its `forge-convert --to tokens` rows (thread and per-call), a tiny policy."""
    from convert_fixtures import convert, rows
    from convert_harness_fixtures import SERVED_CLAUDE_TURNS, record_served_claude
    from harness_checks import needs
    from serve_fixtures import TOKENIZER_DIR, tiny_model

    from conftest import session_calls

    base = tmp_path_factory.mktemp("served")
    data = record_served_claude(needs("claude"), base)
    calls = [c for c in session_calls(data, "cc", len(SERVED_CLAUDE_TURNS)) if c["api"] == "anthropic"]
    tokens = {}
    for mode in ("thread", "per-call"):
        convert(data, base / mode, "--to", "tokens", "--tokenizer", str(TOKENIZER_DIR), "--mode", mode)
        tokens[mode] = {r["sample_id"]: r for r in rows(base / mode)}
    return {"base": base, "calls": calls, "tokens": tokens, "model": tiny_model(base / "tiny")}


def ppo_config(served, **forgerl):
    """veRL's own composed PPO config (as `forge-train rl` composes it) with a `forgerl` section."""
    from forgerl.trainer.launch import compose

    text = compose("ppo_trainer", [f"actor_rollout_ref.model.path={served['model']}",
                                   "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
                                   "actor_rollout_ref.rollout.name=vllm",
                                   "actor_rollout_ref.rollout.prompt_length=65536",
                                   "actor_rollout_ref.rollout.response_length=4096",
                                   *(f"+forgerl.{k}={v}" for k, v in forgerl.items())])
    return OmegaConf.create(text)


def harness_loop(served, config):
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from forgerl.trainer.agent_loop import HarnessAgentLoop

    return HarnessAgentLoop(trainer_config=DictConfigWrap(config), server_manager=None,
                            tokenizer=AutoTokenizer.from_pretrained(served["model"]), processor=None,
                            dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data), harness="claude-code",
                            dataset=str(served["base"] / "data"))


def outcome(served, status: str = "success", score: float = 1.0):
    from forgerl.runners.rollout import Outcome, Rollout
    from forgerl.runners.loader import load_task
    from runner_fixtures import toml_task

    task = load_task(toml_task(served["base"] / "tasks", "count", "return {'a': 1.0}"))
    t = datetime.now(timezone.utc)
    return Outcome(Rollout(task, attempt=0), "cc", "claude-code", "local", status, t, t,
                   scores=None if status == "infra_error" else {"a": score})


@pytest.mark.slow
@pytest.mark.parametrize("rows_mode, convert_mode", [("thread", "thread"), ("per_call", "per-call")])
def test_rows_are_what_forge_convert_cuts(served, rows_mode, convert_mode):
    loop = harness_loop(served, ppo_config(served, rows=rows_mode))
    out = loop.output(outcome(served), served["calls"], len(served["calls"]))
    token_rows = served["tokens"][convert_mode]
    assert sorted(o.extra_fields["forge_segment_id"] for o in out) == sorted(token_rows)
    assert {c["segment_reason"] for c in served["calls"]} >= {"start", "subagent", "compaction"}
    for o in out:
        row = token_rows[o.extra_fields["forge_segment_id"]]
        assert o.prompt_ids + o.response_ids == row["input_ids"]
        assert [0] * len(o.prompt_ids) + o.response_mask == row["loss_mask"]
        model = [i for i, m in enumerate(o.response_mask) if m]
        recorded = row["logprobs"][len(o.prompt_ids):]
        assert [o.response_logprobs[i] for i in model] == pytest.approx([recorded[i] for i in model], abs=1e-6)
        assert o.reward_score == 1.0
    last = max(served["calls"], key=lambda c: c["t_start"])
    assert out[-1].response_ids[-len(last["completion_token_ids"]):] == list(last["completion_token_ids"])
    expected = len(served["calls"]) if rows_mode == "per_call" else len({c["segment_index"] for c in served["calls"]})
    assert len(out) == expected and expected >= 3


@pytest.mark.slow
def test_manager_rows_go_through_verls_grpo_and_loss(served, verl_v1, transfer_queue, monkeypatch):
    """Three rollouts of one prompt through the manager's worker (veRL's TQ worker underneath, run by veRL's
    `_run_prompt`): the whole served rollout (reward 1), its first segment alone (reward 0), an infrastructure
    failure. What veRL's replay buffer samples from TransferQueue, fed to veRL's GRPO and PPO loss, is
    `segment_rl.py`'s advantages and loss; the sampler's metrics count each rollout's rows, the failure and the
    tool calls the policy wrote that did not parse."""
    core_algos, multi = verl_v1
    tq = transfer_queue
    from tensordict import TensorDict
    from verl import DataProto
    from verl.utils.import_utils import load_class_from_fqn, load_extern_type

    from forgerl.trainer.rl import MANAGER, SAMPLER
    from forgerl.trainer.segment_manager import SegmentAgentLoopWorker, check_config

    config = ppo_config(served, rows="thread", segment_reward="discount", gamma=0.5, weighting="rollout")
    manager = load_class_from_fqn(MANAGER, "AgentLoopManager")(config, llm_client=None)  # as veRL's runner does
    assert manager.agent_loop_workers_class.__ray_actor_class__ is SegmentAgentLoopWorker
    for bad, message in (({"trainer": {"use_v1": False}}, "legacy trainer"),
                         ({"algorithm": {"rollout_correction": {"rollout_is": "token"}}}, "rollout_is"),
                         ({"algorithm": {"filter_groups": {"enable": True}}}, "filter_groups"),
                         ({"forgerl": {"weighting": "tokens"}}, "forgerl.weighting")):
        with pytest.raises(ValueError, match=message):
            check_config(OmegaConf.merge(config, bad))
    loop = harness_loop(served, config)
    # the policy's first call held a tool call that did not parse (test_malformed_calls.py records such a call)
    calls = [dict(c, malformed_tool_calls=int(i == 0)) for i, c in enumerate(served["calls"])]
    first = [c for c in calls if c["segment_index"] == 0]
    rollouts = [loop.output(outcome(served), calls, len(calls)),
                loop.output(outcome(served, score=0.0), first, len(first)),
                loop.output(outcome(served, "infra_error"), [], 0)]
    worker = SegmentAgentLoopWorker(config, None)  # its tq.init() joins the running TransferQueue

    async def session(sampling_params, trajectory, trace, session_id, **prompt):  # the agent loop's part, done
        return await worker._agent_loop_postprocess(rollouts[session_id], trajectory["validate"],
                                                    session_id=session_id, **prompt)

    monkeypatch.setattr(worker, "_run_agent_loop", session)
    # the trainer registers the prompt; veRL's _run_prompt runs its sessions and marks it finished
    tq.kv_batch_put(keys=["u1"], partition_id="train", tags=[{"is_prompt": True, "status": "pending",
                                                              "global_steps": 1}])
    asyncio.run(worker._run_prompt({"uid": "u1", "global_steps": 1, "__rollout_n__": 3}, {}, {"validate": False}))
    assert worker.infra_failures == 1
    sampler = load_extern_type(f"pkg://{SAMPLER[0]}", SAMPLER[1])(
        trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None, max_off_policy_strategy="drop",
        sampler_kwargs={}, refill_fn=None)  # as veRL's trainer builds a custom sampler
    batch, metrics = sampler.sample(global_steps=1, partition_id="train", batch_size=1)
    k = len(rollouts[0])
    assert {key: v for key, v in metrics.items() if key.startswith("forgerl/")} == {
        "forgerl/segments_per_rollout/mean": (k + 1) / 2, "forgerl/segments_per_rollout/max": float(k),
        "forgerl/infra_masked": 1.0, "forgerl/malformed_tool_calls": 2.0}
    order = sorted(range(len(batch.keys)), key=lambda i: tuple(int(x) for x in batch.keys[i].split("_")[1:]))
    keys, tags = [batch.keys[i] for i in order], [batch.tags[i] for i in order]
    assert keys == [f"u1_0_{i}" for i in range(k)] + ["u1_1_0"]  # the failure stored nothing

    def stored(keys: list[str]) -> list[dict]:
        """Each key's row as veRL stored it in TransferQueue."""
        data = tq.kv_batch_get(keys=keys, partition_id="train")
        columns = {name: list(data[name].unbind(0)) if isinstance(data[name], torch.Tensor) else list(data[name])
                   for name in ("uid", "responses", "response_mask", "rm_scores", "rollout_is_weights",
                                "rollout_log_probs")}
        return [dict(zip(columns, values)) for values in zip(*columns.values())]

    fields = stored(keys)
    width = max(len(f["responses"]) for f in fields)

    def padded(name: str) -> torch.Tensor:
        return torch.stack([torch.nn.functional.pad(f[name].float(), (0, width - len(f[name]))) for f in fields])

    mask, scores, weights = padded("response_mask"), padded("rm_scores"), padded("rollout_is_weights")
    assert [f["rm_scores"].sum().item() for f in fields] == pytest.approx([0.5 ** (k - 1 - i) for i in range(k)] + [0])
    assert [f["rollout_is_weights"][0].item() for f in fields] == pytest.approx(
        [0.5 ** (k - 1 - i) / k for i in range(k)] + [1.0])
    data = DataProto(batch=TensorDict({"response_mask": mask, "token_level_rewards": scores}, batch_size=len(keys)),
                     non_tensor_batch={"uid": np.array([f["uid"] for f in fields], dtype=object)})
    theirs = multi(data, keys, core_algos.AdvantageEstimator.GRPO).batch["advantages"]

    ours = [*rollout_rows("u1", "0", [(o.prompt_ids, o.response_ids, o.response_mask, o.response_logprobs)
                                      for o in rollouts[0]], 1.0, "discount", 0.5, "rollout", "seq-mean-token-mean"),
            *rollout_rows("u1", "1", [(o.prompt_ids, o.response_ids, o.response_mask, o.response_logprobs)
                                      for o in rollouts[1]], 0.0, "discount", 0.5, "rollout", "seq-mean-token-mean")]
    batch = to_batch(ours, pad_id=0)
    starts = [len(r.prompt_ids) for r in ours]
    response_view = torch.stack([torch.nn.functional.pad(batch.advantages[i, s:s + len(r.response_ids)],
                                                         (0, width - len(r.response_ids)))
                                 for i, (r, s) in enumerate(zip(ours, starts))])
    assert torch.allclose(theirs, response_view, atol=1e-6)
    assert (theirs[:k][mask[:k] > 0] > 0).all() and (theirs[k][mask[k] > 0] < 0).all()

    old = padded("rollout_log_probs")
    new = old + 0.1 * torch.randn(old.shape, generator=torch.Generator().manual_seed(7))
    actor = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": None,
                              "clip_ratio_c": 3.0, "global_batch_info": {}})
    their_loss, _ = core_algos.compute_policy_loss_vanilla(old, new, theirs, mask, "seq-mean-token-mean", actor,
                                                           rollout_is_weights=weights)
    assert policy_loss(new, old, response_view, mask, weights, loss_agg_mode="seq-mean-token-mean").item() == \
        pytest.approx(their_loss.item(), rel=1e-6)

    # veRL's own padding row, put into TransferQueue as its trainer does: fully masked, no gradient
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size

    grown = upsample_batch_to_divisible_size(KVBatchMeta(keys=keys, tags=tags, partition_id="train"), len(keys) + 1,
                                             eos_token_id=0)
    assert grown.keys[:-1] == keys and grown.tags[-1]["is_padding"]
    [pad] = stored(grown.keys[-1:])
    assert pad["response_mask"].sum() == 0 and pad["rm_scores"].sum() == 0

    def grow(t: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        row = torch.nn.functional.pad(value.float(), (0, t.shape[1] - len(value)))
        return torch.cat([t, row[None]])

    log_prob = grow(new, torch.zeros(1)).requires_grad_()
    with_pad = core_algos.compute_policy_loss_vanilla(
        grow(old, pad["rollout_log_probs"]), log_prob, grow(theirs, torch.zeros(1)), grow(mask, pad["response_mask"]),
        "seq-mean-token-mean", actor, rollout_is_weights=grow(weights, pad["rollout_is_weights"]))[0]
    with_pad.backward()
    assert with_pad.item() == pytest.approx(their_loss.item(), rel=1e-6)
    assert torch.count_nonzero(log_prob.grad[-1]) == 0 and torch.count_nonzero(log_prob.grad[:-1]) > 0


@pytest.mark.slow
def test_gpu_check_runs_on_cpu(served):
    """trainer/gpu_check.sh as the GPU machine runs it (files only, a random Qwen3), on CPU with 2 SFT steps:
    per-call rows (5) padded to whole mini-batches of 4, one GRPO step."""
    import subprocess
    import sys

    from conftest import REPO

    r = subprocess.run(["bash", str(REPO / "trainer" / "gpu_check.sh"), str(served["base"] / "per-call"),
                        "--device", "cpu", "--steps", "2", "--max-length", "128", "--hidden", "32", "--layers", "1"],
                       env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    sft = [line.split() for line in lines if line.startswith("step ")]
    assert len(sft) == 2 and all(float(s[3]) > 0 and float(s[-1]) > 0 for s in sft)  # loss, tok/s
    [summary] = [line for line in lines if line.startswith("rows ")]
    assert summary.startswith("rows 5 rewards stand-in") and "'forgerl/padding_rows': 3.0" in summary
    rl = [line.split() for line in lines if line.startswith("rl step 1 ")]
    assert [int(s[8]) for s in rl] == [4, 4] and all(float(s[-1]) > 0 for s in rl)
    assert float(rl[0][6]) != 0.0  # the lone rollout's advantage is its reward: the loss moves
    assert lines[-1] == "rl done on cpu"
