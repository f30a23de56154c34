"""Qwen Code 0.24.4 (npm, pinned) end to end: record, convert, forge-run, serve.

One recording per module (`forge-record run -- qwen ...` against the scripted
upstream: write_file, read_file, answer) feeds the record and convert tests.
Every run has its proxies aimed at a trap (qwen_pi_fixtures.ProxyTrap), so a
request to anywhere but the recorder fails the test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from forgerl.recorder.apis import codec_for
from forgerl.recorder.harness import identify
from forgerl.runners.harnesses import RunContext, get_harness

from conftest import session_calls
from convert_fixtures import TOKENIZER_DIR
from qwen_pi_fixtures import (ANSWER, PROOF, ProxyTrap, check_served, check_sft, files_holding, forge_run_sparql,
                              loop_script, serve_turns, sparql_script, tool_names)
from runner_fixtures import SPARQL_SCORE
from scripted_upstream import ScriptedUpstream, ToolCall
from test_harnesses import needs, run_recorded, tool_exchange

pytestmark = pytest.mark.slow
KEY = "sk-proj-qwenqwenqwenqwenqwenqwen1234"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    qwen = needs("qwen")
    base = tmp_path_factory.mktemp("qwen")
    proof = base / "work" / "proof.txt"  # Qwen Code's file tools take absolute paths
    script = loop_script(ToolCall("write_file", {"file_path": str(proof), "content": PROOF}),
                         ToolCall("read_file", {"file_path": str(proof)}))
    trap = ProxyTrap()
    try:
        with ScriptedUpstream(script) as up:
            r = run_recorded(base, "qw", up.url, [str(qwen), "--yolo", "--output-format", "json", "-m", "qwen3",
                                                  "Write proof.txt, then read it back."],
                             {"OPENAI_API_KEY": KEY, **trap.env()})
    finally:
        trap.close()
    return {"run": r, "base": base, "data": base / "data", "hits": trap.hits}


def test_record_tool_loop(recorded):
    r, base = recorded["run"], recorded["base"]
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert recorded["hits"] == [], "Qwen Code reached past the recorder"
    assert get_harness("qwen-code").final_answer(r.stdout, RunContext("", base, base, "", "qw")) == ANSWER
    assert (base / "work" / "proof.txt").read_text() == PROOF
    calls = [c for c in session_calls(recorded["data"], "qw", 3) if c["api"] == "chat"]
    assert len(calls) == 3 and all(c["complete"] and c["error"] is None and c["streamed"] for c in calls)
    assert all(c["path"] == "/v1/chat/completions" for c in calls)
    assert tool_names(calls) == ["write_file", "read_file"]
    made, result = tool_exchange(recorded["data"], "qw", calls[1:], "read_file")
    assert "forgerl proof" in json.dumps(result), result
    tools = {t["name"] for t in json.loads(calls[0]["tools"])}
    assert {"run_shell_command", "read_file", "write_file", "edit", "agent"} <= tools
    # without its system prompt, the real tool set alone still names it (not Gemini CLI)
    offered = [{"type": "function", "function": {"name": n}} for n in sorted(tools)]
    bare = codec_for("/v1/chat/completions").parse_request(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": offered})
    assert identify({}, bare).name == "qwen-code"
    assert "session qw (qwen-code)" in r.stderr and "write_file x1" in r.stderr
    assert not files_holding([base], KEY[8:]), "the API key reached the disk"
    assert list((base / "home" / ".qwen" / "projects").glob("*/chats/*.jsonl")), "no Qwen Code transcript"


def test_tokens_and_verl_sft(recorded, tmp_path):
    check_sft(recorded["data"], tmp_path, "qwen-code", "qw", ("write_file", "read_file"))


def test_forge_run_grades_a_qwenclawbench_task(scripted, tmp_path):
    up = scripted(sparql_script("run_shell_command"))
    outcome = forge_run_sparql(up.url, tmp_path / "data", "qwen-code")
    assert outcome["harness"] == "qwen-code" and outcome["reward"] == pytest.approx(SPARQL_SCORE)
    extra = json.loads(outcome["extra"])
    assert extra["final_answer"] == "Wrote query_output.sparql."
    assert '"run_shell_command"' in extra["harness_transcript"]


QWEN_TURNS = ['I\'ll write the file.\n<tool_call>\n{"name": "run_shell_command", "arguments": {"command": '
              '"echo forgerl > proof.txt"}}\n</tool_call>', "<think>\nIt worked.\n</think>\n\nDone."]


def test_served_by_the_policy(tmp_path):
    needs("qwen")
    trap = ProxyTrap()
    try:
        r, calls = serve_turns(tmp_path, "qwen-code", QWEN_TURNS, trap)
    finally:
        trap.close()
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert trap.hits == []
    assert (tmp_path / "work" / "proof.txt").read_text() == "forgerl\n"
    ctx = RunContext("", tmp_path / "work", tmp_path / "home", "", "sv")
    assert get_harness("qwen-code").final_answer(r.stdout, ctx) == "Done."
    check_served(calls, QWEN_TURNS, AutoTokenizer.from_pretrained(TOKENIZER_DIR))


def test_adapter_points_at_the_recorder(tmp_path):
    ctx = RunContext("fix it", tmp_path / "ws", tmp_path / "home", "http://127.0.0.1:8787", "s1", "qwen3",
                     {"OPENAI_API_KEY": KEY})
    argv, env = get_harness("qwen-code").command("/bin/qwen", ctx)
    assert argv == ["/bin/qwen", "--auth-type", "openai", "--yolo", "--output-format", "json", "-m", "qwen3", "fix it"]
    assert env["OPENAI_BASE_URL"] == "http://127.0.0.1:8787/s/s1/v1" and env["OPENAI_API_KEY"] == KEY
    assert env["QWEN_USAGE_STATISTICS_ENABLED"] == "false" and env["HOME"] == str(ctx.home)
    assert not Path(ctx.home).exists() or not files_holding([ctx.home], KEY)
