"""forge-train: SFT and RL launch configs veRL really reads, the reward function, the torch SFT loop.

The data is recorded for real: an OpenAI SDK tool loop through
`forge-record serve --policy script:...` (served token ids), then
`forge-convert` makes the verl-sft and tokens shards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import openai
import pyarrow.parquet as pq
import pytest
import yaml
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from forgerl.schema.toolcalls import parse_generation
from forgerl.trainer.reward import compute_score

from conftest import REPO, RecorderProcess, session_calls
from runner_fixtures import toml_task
from serve_fixtures import TOKENIZER_DIR, tiny_model

BIN = Path(sys.executable).parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")
TURNS = ['<tool_call>\n{"name": "add", "arguments": {"a": 40, "b": 2}}\n</tool_call>',
         "<think>\nThe tool said 42.\n</think>\n\nThe answer is 42."]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two numbers", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}]


def forge(tool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / tool), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    script = root / "script.json"
    script.write_text(json.dumps(TURNS))
    served = RecorderProcess(root / "data", None, "--policy", f"script:{script}", "--tokenizer", str(TOKENIZER_DIR),
                             "--served-model", "tiny").start()
    try:
        client = openai.OpenAI(base_url=served.base("s1") + "/v1", api_key="sk-proj-traintraintraintraintrain")
        messages = [{"role": "user", "content": "What is 40 + 2?"}]
        first = client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS).choices[0].message
        call = first.tool_calls[0]
        messages += [first.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "42"}]
        client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS)
        session_calls(root / "data", "s1", 2)
    finally:
        served.stop()
    out = {}
    for target in ("verl-sft", "tokens"):
        r = forge("forge-convert", str(root / "data"), "--to", target, "--out", str(root / target), "--tokenizer",
                  str(TOKENIZER_DIR), "--no-progress", "--val-fraction", "0")
        assert r.returncode == 0, r.stderr
        out[target] = root / target
    out["model"] = tiny_model(root / "tiny")
    out["root"] = root
    return out


def test_sft_dry_run_writes_a_config_veRL_loads(shards, tmp_path):
    r = forge("forge-train", "sft", "--data", str(shards["verl-sft"]), "--model", str(shards["model"]),
              "--out", str(tmp_path / "run"), "--dry-run")
    assert r.returncode == 0, r.stderr
    command = r.stdout.strip().splitlines()[-1]
    assert "torch.distributed.run" in command and "-m verl.trainer.sft_trainer" in command
    assert f"--config-path={(tmp_path / 'run').resolve()}" in command and "--config-name=sft_config" in command
    config = OmegaConf.load(tmp_path / "run" / "sft_config.yaml")
    assert config.model.path == str(shards["model"].resolve()) and config.data.truncation == "error"
    assert list(config.data.train_files) == [str(p.resolve()) for p in (shards["verl-sft"] / "train").glob("*.parquet")]
    assert config.data.ignore_input_ids_mismatch is False
    from verl.trainer.sft_trainer import create_sft_dataset

    tok = AutoTokenizer.from_pretrained(shards["model"])
    with pytest.raises(AssertionError, match="ignore_input_ids_mismatch"):  # veRL's own check, kept on
        create_sft_dataset(list(config.data.train_files), config.data, tok, None)[0]
    r = forge("forge-train", "sft", "--data", str(shards["verl-sft"]), "--model", str(shards["model"]),
              "--out", str(tmp_path / "lax"), "--dry-run", "--accept-template-mismatch")
    assert "without the reasoning" in r.stdout
    lax = OmegaConf.load(tmp_path / "lax" / "sft_config.yaml")
    dataset = create_sft_dataset(list(lax.data.train_files), lax.data, tok, None)  # data.custom_cls decodes tools
    assert dataset.tools == [TOOLS] * len(dataset)
    row = dataset[0]
    trained = tok.decode(row["input_ids"][row["loss_mask"].bool()])
    assert TURNS[0] in trained and parse_generation(TURNS[1]).text in trained
    assert "<think>" not in trained  # what the flag costs: veRL's per-turn render drops reasoning


def rl_args(shards, tmp_path, *extra):
    task = toml_task(tmp_path / "tasks", "add", "return {'said_42': 1.0 if '42' in str(transcript) else 0.0}",
                     prompt="What is 40 + 2?")
    return ["rl", "--tasks", str(task), "--harness", "codex", "--model", str(shards["model"]),
            "--out", str(tmp_path / "rl"), "--dry-run", *extra]


def test_rl_dry_run_sizes_lengths_from_recorded_tokens(shards, tmp_path):
    r = forge("forge-train", *rl_args(shards, tmp_path, "--lengths-from", str(shards["tokens"])))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].endswith("--config-name=rl_config")
    row = pq.read_table(shards["tokens"] / "train").to_pylist()[0]
    prompt = row["loss_mask"].index(1)
    config = OmegaConf.load(tmp_path / "rl" / "rl_config.yaml")
    rollout = config.actor_rollout_ref.rollout
    assert (rollout.prompt_length, rollout.response_length) == (prompt, len(row["loss_mask"]) - prompt)
    assert rollout.agent.default_agent_loop == "forgerl_harness" and config.algorithm.adv_estimator == "grpo"
    [entry] = yaml.safe_load(Path(rollout.agent.agent_loop_config_path).read_text())
    assert entry["_target_"] == "forgerl.trainer.agent_loop.HarnessAgentLoop" and entry["harness"] == "codex"
    [task_row] = pq.read_table(config.data.train_files[0]).to_pylist()
    assert task_row["extra_info"]["task_id"] == "add" and task_row["prompt"][0]["content"] == "What is 40 + 2?"
    assert config.reward.custom_reward_function.reward_kwargs.tasks == entry["tasks"]


def test_rl_config_trains_every_segment(shards, tmp_path, capsys):
    r = forge("forge-train", *rl_args(shards, tmp_path, "--lengths-from", str(shards["tokens"]),
                                      "--segment-reward", "discount", "--gamma", "0.8"))
    assert r.returncode == 0, r.stderr
    config = OmegaConf.load(tmp_path / "rl" / "rl_config.yaml")
    assert OmegaConf.to_container(config.forgerl) == {"rows": "thread", "segment_reward": "discount", "gamma": 0.8,
                                                      "weighting": "rollout"}
    assert config.trainer.use_v1 is True
    manager = config.actor_rollout_ref.rollout.agent.agent_loop_manager_class
    assert manager == "forgerl.trainer.segment_manager.SegmentAgentLoopManager"
    from verl.utils.import_utils import load_extern_type

    from forgerl.trainer.segment_manager import segment_sampler

    sampler = config.trainer.v1.sampler.custom_sampler  # veRL's trainer loads it so; its sample() adds the metrics
    assert load_extern_type(sampler.path, sampler.name) is segment_sampler
    from forgerl.trainer.segment_rl import Expansion

    assert Expansion.of(config) == Expansion("thread", "discount", 0.8, "rollout")  # what the loop and workers read
    from forgerl.trainer.cli import build_parser, main
    from forgerl.trainer.rl import expansion_overrides

    last = expansion_overrides(build_parser().parse_args(rl_args(shards, tmp_path, "--rows", "last")))
    assert last[0] == "+forgerl.rows=last" and not any("agent_loop_manager_class" in o for o in last)
    assert main(rl_args(shards, tmp_path, "--lengths-from", str(shards["tokens"]), "--segment-reward", "discount",
                        "--gamma", "1.5")) == 2
    assert capsys.readouterr().err.strip() == "forge-train: --segment-reward discount needs 0 < --gamma < 1, not 1.5"


def test_rl_refuses_to_truncate(shards, tmp_path):
    r = forge("forge-train", *rl_args(shards, tmp_path, "--lengths-from", str(shards["tokens"]), "--prompt-length", "8"))
    assert r.returncode == 2 and "recorded samples need prompt_length >=" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = forge("forge-train", *rl_args(shards, tmp_path))
    assert r.returncode == 2 and "veRL's default 512 would truncate" in r.stderr
    r = forge("forge-train", "sft", "--data", str(tmp_path), "--model", str(shards["model"]), "--dry-run")
    assert r.returncode == 2 and "no train/*.parquet" in r.stderr


def test_rl_hands_the_users_redaction_rules_to_each_rollouts_recorder(shards, tmp_path):
    rules = tmp_path / "rules"
    rules.write_text("# our internal hosts\ncorp-[a-z]+\\.internal\n")
    r = forge("forge-train", *rl_args(shards, tmp_path, "--lengths-from", str(shards["tokens"]),
                                      "--redact-rules", str(rules)))
    assert r.returncode == 0, r.stderr
    [entry] = yaml.safe_load((tmp_path / "rl" / "agent_loop.yaml").read_text())
    assert entry["redact_rules"] == str(rules.resolve())
    rules.write_text("corp-[a-z+\n")
    r = forge("forge-train", *rl_args(shards, tmp_path, "--lengths-from", str(shards["tokens"]),
                                      "--redact-rules", str(rules), "--out", str(tmp_path / "bad")))
    assert r.returncode == 2 and "bad redaction rule 'corp-[a-z+'" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "bad").exists()


def test_compute_score_grades_with_the_task(tmp_path):
    task = toml_task(tmp_path / "tasks", "add", "return {'said_42': 1.0 if '42' in str(transcript) else 0.0}")
    kwargs = {"data_source": "forgerl/codex", "ground_truth": "add", "extra_info": {}, "tasks": str(task)}
    assert compute_score(solution_str="It is 42.", **kwargs) == 1.0
    assert compute_score(solution_str="It is 41.", **kwargs) == 0.0
    with pytest.raises(ValueError, match="no task 'nope'"):
        compute_score(**{**kwargs, "ground_truth": "nope"}, solution_str="")


def test_torch_sft_loop_learns_on_cpu(shards):
    """The SFT half of trainer/gpu_check.sh, run as a file (no forgerl import), on the tiny model."""
    r = subprocess.run([sys.executable, str(REPO / "trainer" / "sft_loop.py"), "--tokens", str(shards["tokens"]),
                        "--model", str(shards["model"]), "--steps", "4", "--device", "cpu"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    losses = [float(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("step ")]
    assert len(losses) == 4 and losses[-1] < losses[0]
