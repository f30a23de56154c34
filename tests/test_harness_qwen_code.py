"""Qwen Code 0.24.4 (npm, pinned) end to end: record, convert (tokens, verl-sft, ATIF), analyse, forge-run, serve.

One recording per module (`forge-record run -- qwen ...` against the scripted
upstream: write_file, read_file, answer) feeds the record and convert tests.
Every run has its proxies aimed at a trap (harness_checks.ProxyTrap), so a
request to anywhere but the recorder fails the test.
"""

from __future__ import annotations

import json

import pytest

from forgerl.recorder.apis import codec_for
from forgerl.recorder.harness import identify
from forgerl.harnesses import RunContext, get_harness

from harness_checks import files_holding, graded_sparql, needs, sparql_script
from qwen_pi_fixtures import (PROOF, check_atif_and_analysis, check_recorded, check_served_loop, check_sft, proof_loop,
                              record_loop)
from scripted_upstream import ToolCall

pytestmark = pytest.mark.slow
KEY = "sk-proj-qwenqwenqwenqwenqwenqwen1234"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    qwen = needs("qwen")
    base = tmp_path_factory.mktemp("qwen")
    proof = base / "work" / "proof.txt"  # Qwen Code's file tools take absolute paths
    script = proof_loop(ToolCall("write_file", {"file_path": str(proof), "content": PROOF}),
                         ToolCall("read_file", {"file_path": str(proof)}))
    cmd = [str(qwen), "--yolo", "--output-format", "json", "-m", "qwen3", "Write proof.txt, then read it back."]
    return record_loop(cmd, base, "qw", script, KEY)


def test_record_tool_loop(recorded):
    calls = check_recorded(recorded, "qwen-code", ("write_file", "read_file"), KEY)
    tools = {t["name"] for t in json.loads(calls[0]["tools"])}
    assert {"run_shell_command", "read_file", "write_file", "edit", "agent"} <= tools
    # without its system prompt, the real tool set alone still names it (not Gemini CLI)
    offered = [{"type": "function", "function": {"name": n}} for n in sorted(tools)]
    bare = codec_for("/v1/chat/completions").parse_request(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": offered})
    assert identify({}, bare).name == "qwen-code"
    assert list((recorded["base"] / "home" / ".qwen" / "projects").glob("*/chats/*.jsonl")), "no transcript"


def test_tokens_and_verl_sft(recorded, tmp_path):
    check_sft(recorded["data"], tmp_path, "qwen-code", "qw", ("write_file", "read_file"))


def test_atif_and_analysis(recorded, tmp_path):
    check_atif_and_analysis(recorded["data"], tmp_path, "qwen-code", "qw", ("write_file", "read_file"))


def test_forge_run_grades_a_qwenclawbench_task(scripted, tmp_path):
    _, extra, _ = graded_sparql("qwen-code", scripted(sparql_script("run_shell_command")).url, tmp_path / "data",
                                "--model", "qwen3")
    assert '"run_shell_command"' in extra["harness_transcript"]


def test_served_by_the_policy(tmp_path):
    needs("qwen")
    check_served_loop(tmp_path, "qwen-code", "run_shell_command")


def test_adapter_points_at_the_recorder(tmp_path):
    ctx = RunContext("fix it", tmp_path / "ws", tmp_path / "home", "http://127.0.0.1:8787", "s1", "qwen3",
                     {"OPENAI_API_KEY": KEY})
    argv, env = get_harness("qwen-code").command("/bin/qwen", ctx)
    assert argv == ["/bin/qwen", "--auth-type", "openai", "--yolo", "--output-format", "json", "-m", "qwen3", "fix it"]
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:8787/s/s1/v1" and env["OPENAI_API_KEY"] == KEY
    assert env["QWEN_USAGE_STATISTICS_ENABLED"] == "false" and env["HOME"] == str(ctx.home)
    assert not ctx.home.exists() or not files_holding(KEY[8:], ctx.home)
