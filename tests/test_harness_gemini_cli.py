"""Gemini CLI 0.61.0 (npm, pinned) end to end over the Gemini API: record, convert, forge-run, serve.

One recording per module (`forge-record run -- gemini ...` against the
scripted upstream speaking the Gemini API: write_file, read_file, answer)
feeds the record and convert tests. Every run has its proxies aimed at a
trap (qwen_pi_fixtures.ProxyTrap), so a request to anywhere but the recorder
(Clearcut usage statistics, the npm update check) fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from forgerl.analysis.kinds import TOOL_KINDS
from forgerl.runners.harnesses import RunContext, get_harness

from conftest import FORGE_RECORD, session_calls
from convert_fixtures import TOKENIZER_DIR, convert
from qwen_pi_fixtures import ANSWER, PROOF, ProxyTrap, check_sft, files_holding, forge_run_sparql, serve_turns
from runner_fixtures import SPARQL_QUERY, SPARQL_SCORE
from scripted_upstream import Request, Script, ScriptedUpstream, ToolCall, Turn
from test_harnesses import needs, tool_exchange

pytestmark = pytest.mark.slow
KEY = "AIzaSyForgeGeminiTestKeyGeminiTestKey12"
MODEL = "gemini-2.5-pro"


def results_seen(request: Request) -> int:
    """How many tool results (functionResponse parts) the conversation holds."""
    return sum("functionResponse" in part for content in request.body.get("contents") or []
               for part in content.get("parts") or [])


def steps(*acts: ToolCall, answer: str) -> Script:
    """One tool call per turn, in order, then `answer`."""
    def script(request: Request) -> Turn:
        done = results_seen(request)
        return Turn(text=answer) if done >= len(acts) else Turn(tool_calls=[acts[done]])
    return script


def called(calls: list[dict]) -> list[str]:
    """The functions the model called, in order, from the recorded (reassembled) responses."""
    return [part["functionCall"]["name"] for call in calls for candidate in json.loads(call["response"])["candidates"]
            for part in candidate["content"]["parts"] if "functionCall" in part]


def run_recorded(base: Path, session: str, upstream: str, cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    """`forge-record run` with one `--upstream` for every API (test_harnesses' helper sets only two of three)."""
    (base / "work").mkdir()
    (base / "home").mkdir()
    return subprocess.run([FORGE_RECORD, "run", "--out", str(base / "data"), "--session", session, "--upstream",
                           upstream, "--", *cmd], cwd=base / "work", env={**os.environ, "HOME": str(base / "home"),
                                                                         **env},
                          capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    gemini = needs("gemini")
    base = tmp_path_factory.mktemp("gemini")
    proof = base / "work" / "proof.txt"
    script = steps(ToolCall("write_file", {"file_path": str(proof), "content": PROOF}),
                   ToolCall("read_file", {"file_path": str(proof)}), answer=ANSWER)
    trap = ProxyTrap()
    try:
        with ScriptedUpstream(script) as up:
            r = run_recorded(base, "gm", up.url, [str(gemini), "--yolo", "--output-format", "json", "-m", MODEL,
                                                  "-p", "Write proof.txt, then read it back."],
                             {"GEMINI_API_KEY": KEY, **trap.env()})
            paths = [e.path for e in up.log]
    finally:
        trap.close()
    return {"run": r, "base": base, "data": base / "data", "hits": trap.hits, "paths": paths}


def test_record_tool_loop(recorded):
    r, base = recorded["run"], recorded["base"]
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert recorded["hits"] == [], "Gemini CLI reached past the recorder"
    assert recorded["paths"] == [f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse"] * 3
    assert get_harness("gemini-cli").final_answer(r.stdout, RunContext("", base, base, "", "gm")) == ANSWER
    assert (base / "work" / "proof.txt").read_text() == PROOF
    calls = [c for c in session_calls(recorded["data"], "gm", 3) if c["api"] == "gemini"]
    assert len(calls) == 3 and all(c["complete"] and c["error"] is None and c["streamed"] for c in calls)
    assert all(c["path"] == f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse" for c in calls)
    assert {c["model_requested"] for c in calls} == {MODEL}
    assert called(calls) == ["write_file", "read_file"]
    made, result = tool_exchange(recorded["data"], "gm", calls[1:], "read_file")
    assert made["call_id"] and result["tool_name"] == "read_file" and "forgerl proof" in result["text"]
    tools = {t["name"] for t in json.loads(calls[0]["tools"])}
    assert {"run_shell_command", "read_file", "write_file", "replace", "grep_search"} <= tools
    assert tools - TOOL_KINDS.keys() <= {"activate_skill"}, "a Gemini CLI tool without a kind"
    assert TOOL_KINDS["invoke_agent"] == "subagent" and TOOL_KINDS["write_todos"] == "plan"
    assert "session gm (gemini-cli)" in r.stderr and "write_file x1" in r.stderr
    assert "[REDACTED]" in json.loads(calls[0]["request_headers"])["x-goog-api-key"]
    assert not files_holding([base], KEY[6:]), "the API key reached the disk"


def test_tokens_and_verl_sft(recorded, tmp_path):
    check_sft(recorded["data"], tmp_path, "gemini-cli", "gm", ("write_file", "read_file"))


def test_atif(recorded, tmp_path):
    convert(recorded["data"], tmp_path, "--to", "atif", "--harness", "gemini-cli")
    (path,) = (tmp_path / "train").glob("*.json")
    trajectory = json.loads(path.read_text())
    assert trajectory["agent"]["name"] == "gemini-cli" and trajectory["agent"]["model_name"] == MODEL
    agent = [step for step in trajectory["steps"] if step["source"] == "agent"]
    assert [c["function_name"] for step in agent for c in step.get("tool_calls") or []] == ["write_file", "read_file"]
    assert "forgerl proof" in json.dumps(agent[1]["observation"]) and agent[-1]["message"] == ANSWER


def sparql_script(request: Request) -> Turn:
    """task_00067 through run_shell_command: 14 of the 15 checks pass (see runner_fixtures)."""
    if results_seen(request):
        return Turn(text="Wrote query_output.sparql.")
    command = f"cat > query_output.sparql <<'EOF'\n{SPARQL_QUERY}EOF"
    return Turn(text="Writing the query.", tool_calls=[ToolCall("run_shell_command", {"command": command})])


def test_forge_run_grades_a_qwenclawbench_task(scripted, tmp_path):
    needs("gemini")
    outcome = forge_run_sparql(scripted(sparql_script).url, tmp_path / "data", "gemini-cli")
    assert outcome["harness"] == "gemini-cli" and outcome["reward"] == pytest.approx(SPARQL_SCORE)
    extra = json.loads(outcome["extra"])
    assert extra["final_answer"] == "Wrote query_output.sparql."
    assert '"run_shell_command"' in extra["harness_transcript"]


SERVED_TURNS = ['I\'ll write the file.\n<tool_call>\n{"name": "run_shell_command", "arguments": {"command": '
                '"echo forgerl > proof.txt"}}\n</tool_call>', "<think>\nIt worked.\n</think>\n\nDone."]


def test_served_by_the_policy(tmp_path):
    """The runner adapter against `forge-record serve --policy script:FILE`: the policy's tokens drive the
    real CLI over the Gemini API, and the second prompt continues the first call's token ids."""
    needs("gemini")
    trap = ProxyTrap()
    try:
        r, calls = serve_turns(tmp_path, "gemini-cli", SERVED_TURNS, trap, "gemini", {"GEMINI_API_KEY": KEY})
    finally:
        trap.close()
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert trap.hits == []
    work = tmp_path / "work"
    ctx = RunContext("", work, tmp_path / "home", "", "sv")
    assert (work / "proof.txt").read_text() == "forgerl\n"
    assert get_harness("gemini-cli").final_answer(r.stdout, ctx) == "Done."
    assert get_harness("gemini-cli").transcript_files(ctx), "no Gemini CLI transcript"
    assert len(calls) == 2 and all(c["policy_version"] == "qwen3-policy" and c["error"] is None for c in calls)
    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    for call, text in zip(calls, SERVED_TURNS):
        assert tok.decode(call["completion_token_ids"][:-1], skip_special_tokens=False) == text
    assert called(calls) == ["run_shell_command"]
    held = calls[0]["prompt_token_ids"] + calls[0]["completion_token_ids"]
    assert calls[1]["prompt_token_ids"][:len(held)] == held, "the second turn re-tokenised the history"
    assert not files_holding([tmp_path], KEY[6:]), "the API key reached the disk"


def test_adapter_points_at_the_recorder(tmp_path):
    ctx = RunContext("fix it", tmp_path / "ws", tmp_path / "home", "http://127.0.0.1:8787", "s1", "",
                     {"GEMINI_API_KEY": KEY})
    argv, env = get_harness("gemini-cli").command("/bin/gemini", ctx)
    assert argv == ["/bin/gemini", "--yolo", "--output-format", "json", "-m", MODEL, "-p", "fix it"]
    assert env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:8787/s/s1" and env["GEMINI_API_KEY"] == KEY
    assert env["GEMINI_CLI_HOME"] == env["HOME"] == str(ctx.home)
    settings = json.loads((ctx.home / ".gemini" / "settings.json").read_text())
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert settings["privacy"]["usageStatisticsEnabled"] is False and settings["telemetry"]["enabled"] is False
    assert not files_holding([Path(ctx.home)], KEY)
