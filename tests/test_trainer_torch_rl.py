"""Serving checkpoints and the torch RL iterations (issue 35, steps 4-6).

- The project's policy server (`trainer/policy_server.py`) answers the token
  protocol with the checkpoint's own logprobs, reports its `policy_version`,
  and serves new weights after a reload.
- `forge-train rl --engine torch`: a real pi rollout per task through
  `forge-run --policy` against that server, converted, GRPO'd, saved as v1
  with parent v0, every rollout tagged v0; a GRPO step on those rows moves
  the log-probability toward the rewarded rollout; a reward that does not
  join exactly its session is refused.
- `forge-train check-serve` against real vLLM (`.venv-vllm`) serving a float32
  checkpoint in float32: its recorded logprobs match the checkpoint's, and
  another checkpoint is refused with one line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import torch
import transformers

from forgerl.errors import UserError
from forgerl.recorder.proxy import free_port
from forgerl.runners.policy import PolicyVersionSource
from forgerl.schema.store import read_table
from forgerl.schema.writer import DatasetWriter
from forgerl.schema.templates import folder_template_sha256
from forgerl.trainer.policy_server import load_checkpoint, serving
from forgerl.trainer.rl_loop import rl_step
from forgerl.trainer.segment_rl import padding_rows
from forgerl.trainer.torch_model import token_logprobs
from forgerl.trainer.torch_rl import session_rewards, training_rows

from serve_fixtures import VLLM_PYTHON, start_vllm, tiny_model

TASKS = Path(__file__).parent / "fixtures" / "rl_tasks"
BIN = Path(sys.executable).parent
PROMPT = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]  # <|im_start|>user\nHello<|im_end|>...assistant\n


def checkpoint(folder: Path, version: str, noise_seed: int | None = None) -> Path:
    """The tiny Qwen3 in float32 as forge-train writes a checkpoint; `noise_seed` perturbs its weights (another
    policy)."""
    tiny_model(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if noise_seed is not None:
        gen = torch.Generator().manual_seed(noise_seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=gen) * 0.5)
    model.save_pretrained(folder)
    (folder / "forgerl_policy.json").write_text(json.dumps(
        {"policy_version": version, "parent": None, "engine": "torch", "dtype": "float32", "seed": 0,
         "base": "random-qwen3 64/2"}))
    return folder


def complete(url: str, **body) -> dict:
    request = urllib.request.Request(f"{url}/v1/completions", json.dumps(
        {"model": "policy", "prompt": PROMPT, "max_tokens": 12, "logprobs": 1, "return_token_ids": True, **body}
    ).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.load(r)["choices"][0]


def own_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """The model's log-probabilities of `completion` after `prompt` (a folder: its checkpoint's)."""
    model = load_checkpoint(model) if isinstance(model, Path) else model
    ids = torch.tensor([prompt + completion])
    mask = torch.zeros_like(ids)
    mask[0, len(prompt):] = 1
    with torch.no_grad():
        return token_logprobs(model, ids, torch.ones_like(ids), mask)[0, len(prompt):]


def forge(verb: str, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / verb), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def policies(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("policies")
    return checkpoint(root / "v0", "v0"), checkpoint(root / "other", "v1", noise_seed=1)


def test_policy_server_answers_with_its_checkpoints_logprobs_and_reloads(policies):
    v0, other = policies
    with serving(v0) as server:
        assert PolicyVersionSource(server.url).current() == "v0"
        greedy = complete(server.url, temperature=0)
        assert len(greedy["token_ids"]) == 12 and greedy["finish_reason"] == "length"
        mine = own_logprobs(v0, PROMPT, greedy["token_ids"])
        assert torch.allclose(mine, torch.tensor(greedy["logprobs"]["token_logprobs"]), atol=1e-5)
        sampled = [complete(server.url, temperature=1.0, seed=7)["token_ids"] for _ in range(2)]
        assert sampled[0] == sampled[1] != greedy["token_ids"]  # seeded sampling repeats, and is not greedy
        assert server.reload(other) == "v1"
        assert PolicyVersionSource(server.url).current() == "v1"
        after = complete(server.url, temperature=0)
        assert after["token_ids"] != greedy["token_ids"]
        theirs = own_logprobs(other, PROMPT, after["token_ids"])
        assert torch.allclose(theirs, torch.tensor(after["logprobs"]["token_logprobs"]), atol=1e-5)


def test_policy_version_from_a_checkpoint_folder(policies, tmp_path):
    assert PolicyVersionSource(version_from=str(policies[0])).current() == "v0"
    shutil.copytree(policies[0], tmp_path / "bare")
    (tmp_path / "bare" / "forgerl_policy.json").unlink()
    with pytest.raises(UserError, match="no policy_version"):
        PolicyVersionSource(version_from=str(tmp_path / "bare")).current()


@pytest.fixture(scope="module")
def rl_run(policies, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("rl") / "out"
    done = forge("forge-train", "rl", "--engine", "torch", "--tasks", str(TASKS), "--harness", "pi", "--model",
                 str(policies[0]), "--iterations", "1", "--attempts", "1", "--max-tokens", "24", "--out", str(out))
    return out, done


@pytest.mark.slow
def test_one_torch_rl_iteration_writes_v1_from_v0_rollouts(rl_run):
    out, done = rl_run
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("iteration ")]
    assert line.startswith("iteration 1 v0 -> v1: pass rate 0.000 over 2 rollouts") and "rows 2" in line
    meta = json.loads((out / "checkpoints" / "v1" / "forgerl_policy.json").read_text())
    assert (meta["policy_version"], meta["parent"], meta["engine"], meta["dtype"]) == ("v1", "v0", "torch", "float32")
    assert meta["base"] == "random-qwen3 64/2" and meta["steps"] == 1 and Path(meta["shards"][0]).is_file()
    manifest = json.loads(Path(meta["shards"][0]).read_text())
    assert meta["tokenizer_sha256"] == manifest["tokenizer"]["sha256"]
    assert meta["chat_template_sha256"] == folder_template_sha256(out / "checkpoints" / "v1") is not None
    outcomes = read_table(out / "data", "outcomes", ["task_id", "policy_version", "harness"]).to_pylist()
    assert sorted(o["task_id"] for o in outcomes) == ["rl-create-notes", "rl-create-todo"]
    calls = read_table(out / "data", "calls", ["policy_version", "completion_token_ids"]).to_pylist()
    assert calls and {o["policy_version"] for o in outcomes} == {c["policy_version"] for c in calls} == {"v0"}
    assert all(len(c["completion_token_ids"]) == 24 for c in calls)  # the server's cap, sampled by the tiny model
    assert PolicyVersionSource(version_from=str(out / "checkpoints" / "v1")).current() == "v1"


@pytest.mark.slow
def test_grpo_step_raises_the_rewarded_rollouts_logprobs(rl_run, policies):
    out, done = rl_run
    assert done.returncode == 0, done.stderr[-3000:]
    sessions = sorted(r["session_id"] for r in read_table(out / "data", "outcomes", ["session_id"]).to_pylist())
    rewards = {sessions[0]: ("g", 1.0), sessions[1]: ("g", 0.0)}  # one group: advantages +1 and -1
    rows = training_rows(out / "tokens" / "v0", "v0", rewards, 8192)
    model = transformers.AutoModelForCausalLM.from_pretrained(policies[0], dtype=torch.float32).train()

    def response_logprob(row) -> float:
        return float(own_logprobs(model, row.prompt_ids, row.response_ids).sum())

    before = [response_logprob(r) for r in rows]
    torch.manual_seed(0)
    rl_step(model, rows + padding_rows(len(rows), 4, 0), "cpu", 1e-3, 4, "seq-mean-token-mean", 1)
    after = [response_logprob(r) for r in rows]
    rewarded = [r.rollout == sessions[0] for r in rows]
    assert [a > b for a, b in zip(after, before)] == rewarded


@pytest.mark.slow
def test_rewards_that_do_not_join_their_session_are_refused(rl_run, tmp_path):
    out, done = rl_run
    assert done.returncode == 0, done.stderr[-3000:]
    rewards, rate = session_rewards(out / "data", "pi", "v0")
    assert len(rewards) == 2 and rate == 0.0
    wrong = {f"{session}-elsewhere": joined for session, joined in rewards.items()}
    with pytest.raises(UserError, match="have no outcome"):
        training_rows(out / "tokens" / "v0", "v0", wrong, 8192)
    data = tmp_path / "data"
    shutil.copytree(out / "data", data)
    first = read_table(data, "outcomes").to_pylist()[0]
    with DatasetWriter(data, source="runner") as writer:  # the same session graded twice
        writer.add_outcome({**first, "attempt": first["attempt"] + 1})
    with pytest.raises(UserError, match="more than one outcome"):
        session_rewards(data, "pi", "v0")


@pytest.mark.parametrize("change, said", [
    ("no-policy-file", "no policy_version in forgerl_policy.json"),
    ("not-numbered", "is not vN"),
    ("no-tasks", "no such task file or folder"),
    ("unknown-task", "--task-filter: no such task: rl-nope"),
])
def test_torch_rl_bad_input_is_one_line(policies, tmp_path, change, said):
    model, tasks = tmp_path / "model", str(TASKS)
    shutil.copytree(policies[0], model)
    if change == "no-policy-file":
        (model / "forgerl_policy.json").unlink()
    elif change == "not-numbered":
        (model / "forgerl_policy.json").write_text(json.dumps({"policy_version": "sft-final"}))
    elif change == "no-tasks":
        tasks = str(tmp_path / "missing")
    done = forge("forge-train", "rl", "--engine", "torch", "--tasks", tasks, "--harness", "pi", "--model",
                 str(model), "--out", str(tmp_path / "out"), "--task-filter", "rl-nope" if change == "unknown-task"
                 else "rl-create-notes", timeout=120)
    assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "out").exists()


def test_check_serve_bad_input_is_one_line(policies, tmp_path):
    done = forge("forge-train", "check-serve", "--data", str(tmp_path), "--model", str(policies[0]), timeout=120)
    assert done.returncode == 2 and "not a forgerl dataset" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="the vLLM venv is not built (make test builds it)")
def test_check_serve_against_real_vllm_in_float32(policies, tmp_path):
    v0, other = policies
    port = free_port()  # vLLM caps every generation at 32 tokens: the random model never ends its turn
    vllm = start_vllm(v0, port, tmp_path / "vllm.log", "float32", "--override-generation-config",
                      '{"max_new_tokens": 32}')
    try:
        url = f"http://127.0.0.1:{port}"
        assert PolicyVersionSource(url).current() == "v0"  # its /v1/models root is the folder: its version file
        run = forge("forge-run", str(TASKS), "--task", "rl-create-notes", "--harness", "pi", "--policy", url,
                    "--tokenizer", str(v0), "--served-model", "tiny", "--temperature", "1", "--out",
                    str(tmp_path / "data"), "--watch", "--rounds", "1", "--watch-interval", "1", timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
    finally:
        vllm.terminate()
        vllm.wait(60)
    calls = read_table(tmp_path / "data", "calls", ["policy_version", "completion_logprobs"]).to_pylist()
    assert calls and {c["policy_version"] for c in calls} == {"v0"} and all(c["completion_logprobs"] for c in calls)
    same = forge("forge-train", "check-serve", "--data", str(tmp_path / "data"), "--model", str(v0))
    assert same.returncode == 0, same.stderr[-2000:]
    summary = same.stdout.strip().splitlines()[-1].split()
    assert summary[0] == "calls" and float(summary[summary.index("max_abs") + 1]) < 1e-4, same.stdout
    wrong = forge("forge-train", "check-serve", "--data", str(tmp_path / "data"), "--model", str(other))
    assert wrong.returncode == 2 and "served logprobs differ" in wrong.stderr, wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flags, says", [(("--temperature", "-1"), "--temperature must be >= 0"),
                                         (("--max-tokens", "0"), "--max-tokens must be at least 1")])
def test_forge_run_refuses_bad_sampling_in_one_line(tmp_path, flags, says):
    done = forge("forge-run", str(TASKS), "--harness", "pi", "--policy", "http://127.0.0.1:9", "--tokenizer",
                 str(tmp_path), "--served-model", "p", *flags, "--out", str(tmp_path / "d"), timeout=120)
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "d").exists()
