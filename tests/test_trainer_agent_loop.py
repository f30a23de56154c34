"""The veRL agent loop's `run()` with a real harness (Codex CLI), a real runner, and a real tiny model.

veRL's `server_manager` is replaced by `TinyServerManager`: the same
`generate(request_id, prompt_ids=..., sampling_params=...) -> TokenOutput`
contract, answered by a random-weight Qwen3 model on CPU. The sample that
`run()` returns must be exactly the recorded calls' token ids, with the model's
own logprobs on its tokens and mask 0 on everything the harness added.
"""

from __future__ import annotations

import asyncio
import os

import pyarrow.compute as pc
import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry
from verl.utils.dataset.rl_dataset import RLHFDataset

from forgerl.schema.records import decompress
from forgerl.schema.store import read_table
from forgerl.trainer.agent_loop import HarnessAgentLoop

from convert_fixtures import convert, rows
from runner_fixtures import barriers_asked_now, toml_task
from serve_fixtures import TinyLM, TinyServerManager, tiny_model

pytestmark = pytest.mark.slow
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return TinyLM(tiny_model(tmp_path_factory.mktemp("tiny")))


def agent_loop(lm: TinyLM, tmp_path, prompt_length: int = 65536, response_length: int = 48, **options):
    folder = lm.model.name_or_path
    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": prompt_length,
                                                                 "response_length": response_length}},
                               "data": {}})
    return HarnessAgentLoop(trainer_config=DictConfigWrap(config), server_manager=TinyServerManager(lm),
                            tokenizer=AutoTokenizer.from_pretrained(folder), processor=None,
                            dataset_cls=RLHFDataset, data_config=DictConfigWrap(config.data),
                            harness="codex", dataset=str(tmp_path / "data"), served_model="tiny",
                            policy_version="step-3", timeout_s=120, env={"OPENAI_API_KEY": "sk-test-agentloop"},
                            **options)


def test_registered():
    assert _agent_loop_registry["forgerl_harness"] == {"_target_": "forgerl.trainer.agent_loop.HarnessAgentLoop"}


def test_run_returns_the_recorded_tokens(lm, tmp_path, monkeypatch):
    task = toml_task(tmp_path / "tasks", "touch", "return {'answered': 0.25}", prompt="say hi")
    loop = agent_loop(lm, tmp_path)
    asked = barriers_asked_now(monkeypatch)
    out = asyncio.run(loop.run({"temperature": 1.0}, extra_info={"task_path": str(task)}, raw_prompt=[]))
    assert asked == [True]  # its own recorder: the barrier does not wait for the writer's clock
    served = loop.server_manager.calls
    assert served, "the harness never reached the policy"
    calls = read_table(tmp_path / "data", "calls")
    calls = calls.filter(pc.equal(calls["session_id"], out.extra_fields["forge_session"])).to_pylist()
    recorded = sorted((c for c in calls if c["completion_token_ids"]), key=lambda c: c["t_start"])
    assert [c["completion_token_ids"] for c in recorded] == [s["token_ids"] for s in served]
    assert [c["prompt_token_ids"] for c in recorded] == [s["prompt_ids"] for s in served]
    assert all(c["policy_version"] == "step-3" for c in recorded)
    # The sample is the last segment: its prompt, then generated (mask 1) and harness-added (mask 0) tokens.
    segment_calls = out.extra_fields["forge_segments"]
    assert segment_calls >= 1 and out.extra_fields["forge_infra_error"] == 0
    last = served[-1]
    assert out.prompt_ids + out.response_ids == last["prompt_ids"] + last["token_ids"]
    # the same stored segment, cut the same way, as `forge-convert --to tokens` gives it
    convert(tmp_path / "data", tmp_path / "tokens", "--to", "tokens", "--tokenizer", lm.model.name_or_path)
    row = next(r for r in rows(tmp_path / "tokens") if r["segment_id"] == out.extra_fields["forge_segment_id"])
    assert row["input_ids"] == out.prompt_ids + out.response_ids
    assert row["loss_mask"] == [0] * len(out.prompt_ids) + out.response_mask
    assert out.response_ids[-len(last["token_ids"]):] == last["token_ids"]
    assert out.response_mask[-len(last["token_ids"]):] == [1] * len(last["token_ids"])
    assert out.response_logprobs[-len(last["token_ids"]):] == pytest.approx(last["log_probs"])
    model_positions = [i for i, m in enumerate(out.response_mask) if m]
    assert len(model_positions) == sum(len(s["token_ids"]) for s in served
                                       if (s["prompt_ids"] + s["token_ids"])[:len(out.prompt_ids)] == out.prompt_ids)
    assert all(out.response_logprobs[i] == 0.0 for i, m in enumerate(out.response_mask) if not m)
    assert out.reward_score == 0.25  # the harness's failure (random text) keeps its graded reward
    assert all(len(s["token_ids"]) <= 48 for s in served)  # rollout.response_length caps every turn


def test_the_users_redaction_rules_mask_what_the_rollouts_recorder_stores(lm, tmp_path):
    """`forge-train rl --redact-rules`: each rollout's recorder masks the user's regexes (here a name in the
    prompt) as well as the key patterns, before anything is written."""
    name = b"Marvin Quell"
    task = toml_task(tmp_path / "tasks", "greet", "return {'a': 1.0}", prompt="say hi to Marvin Quell")
    rules = tmp_path / "rules"
    rules.write_text("Marvin\\s+Quell\n")
    loop = agent_loop(lm, tmp_path, redact_rules=str(rules))
    out = asyncio.run(loop.run({"temperature": 1.0}, extra_info={"task_path": str(task)}, raw_prompt=[]))
    assert loop.server_manager.calls, "the harness never reached the policy"
    calls = read_table(tmp_path / "data", "calls", ["session_id", "request_raw"]).to_pylist()
    bodies = [decompress(c["request_raw"]) for c in calls if c["session_id"] == out.extra_fields["forge_session"]]
    assert any(b"say hi to [REDACTED]" in body for body in bodies) and not any(name in body for body in bodies)


def test_infra_failure_is_fully_masked(lm, tmp_path):
    task = toml_task(tmp_path / "tasks", "broken", "return {'a': 1.0}")
    (tmp_path / "tasks" / "seed.txt").unlink()  # the workspace cannot be prepared
    loop = agent_loop(lm, tmp_path)
    out = asyncio.run(loop.run({}, extra_info={"task_path": str(task)}, raw_prompt=[]))
    assert out.extra_fields["forge_infra_error"] == 1
    assert out.response_mask == [0] and out.reward_score == 0.0
    assert loop.server_manager.calls == []


def test_overlong_is_masked_not_truncated(lm, tmp_path):
    task = toml_task(tmp_path / "tasks", "long", "return {'a': 1.0}", prompt="say hi")
    loop = agent_loop(lm, tmp_path, prompt_length=512)
    out = asyncio.run(loop.run({}, extra_info={"task_path": str(task)}, raw_prompt=[]))
    assert loop.server_manager.calls, "the rollout ran"
    assert out.extra_fields["forge_overlong"] == 1 and out.response_mask == [0]
    assert out.reward_score == 1.0


def test_the_looting_agent_finds_nothing_through_the_agent_loop(lm, tmp_path):
    """The adversarial task (tests/test_jail_secrets.py) as an RL rollout: the harness's key variable holds a token
    of its rollout's recorder, never the key the loop was configured with, and nothing real reaches the dataset."""
    from forgerl.recorder.credentials import PREFIX
    from test_jail_secrets import LOOT_GRADER, VENDOR, LootingHarness, nothing_real_reached
    from test_recorder_durability import every_value_on_disk

    task = toml_task(tmp_path / "tasks", "loot", LOOT_GRADER)
    loop = agent_loop(lm, tmp_path)
    loop.env = {"OPENAI_API_KEY": VENDOR}
    loop.harness = LootingHarness()
    graded, output = [], loop.output
    loop.output = lambda outcome, *rest: graded.append(outcome) or output(outcome, *rest)  # the rollout's outcome
    out = asyncio.run(loop.run({"temperature": 1.0}, extra_info={"task_path": str(task)}, raw_prompt=[]))
    [outcome] = graded
    assert out.extra_fields["forge_infra_error"] == 0 and outcome.error is None, outcome.error
    sent = b"".join(data for _, data in every_value_on_disk(tmp_path / "data"))  # its call, as the gateway got it
    assert nothing_real_reached(tmp_path / "data", sent, outcome.scores).startswith(PREFIX)
