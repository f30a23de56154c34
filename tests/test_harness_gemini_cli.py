"""Gemini CLI 0.61.0 (npm, pinned) end to end over the Gemini API: record, convert, forge-run, serve.

One recording per module (`forge-record run -- gemini ...` against the
scripted upstream speaking the Gemini API: write_file, read_file, answer)
feeds the record and convert tests. Every run has its proxies aimed at a
trap (harness_checks.ProxyTrap), so a request to anywhere but the recorder
(Clearcut usage statistics, the npm update check) fails the test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forgerl.analysis.kinds import TOOL_KINDS
from forgerl.harnesses import RunContext, get_harness
from forgerl.harnesses import node_path

from conftest import session_calls
from harness_checks import (atif_doc, check_served_ids, files_holding, graded_sparql, needs, record_trapped,
                            served_turns, sparql_script, tool_exchange, tool_results)
from qwen_pi_fixtures import ANSWER, PROOF, check_sft, serve_turns
from scripted_upstream import Request, Script, ToolCall, Turn

pytestmark = pytest.mark.slow
KEY = "AIzaSyForgeGeminiTestKeyGeminiTestKey12"
MODEL = "gemini-2.5-pro"


def steps(*acts: ToolCall, answer: str) -> Script:
    """One tool call per turn, in order, then `answer`."""
    def script(request: Request) -> Turn:
        done = tool_results(request)
        return Turn(text=answer) if done >= len(acts) else Turn(tool_calls=[acts[done]])
    return script


def called(calls: list[dict]) -> list[str]:
    """The functions the model called, in order, from the recorded (reassembled) responses."""
    return [part["functionCall"]["name"] for call in calls for candidate in json.loads(call["response"])["candidates"]
            for part in candidate["content"]["parts"] if "functionCall" in part]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    gemini = needs("gemini")
    base = tmp_path_factory.mktemp("gemini")
    proof = base / "work" / "proof.txt"
    script = steps(ToolCall("write_file", {"file_path": str(proof), "content": PROOF}),
                   ToolCall("read_file", {"file_path": str(proof)}), answer=ANSWER)
    return record_trapped(base, "gm", script, [str(gemini), "--yolo", "--output-format", "json", "-m", MODEL, "-p",
                                               "Write proof.txt, then read it back."],
                          {"GEMINI_API_KEY": KEY, "PATH": node_path()})


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
    assert not files_holding(KEY[6:], base), "the API key reached the disk"


def test_tokens_and_verl_sft(recorded, tmp_path):
    check_sft(recorded["data"], tmp_path, "gemini-cli", "gm", ("write_file", "read_file"))


def test_atif(recorded, tmp_path):
    trajectory = atif_doc(recorded["data"], tmp_path, "gemini-cli")
    assert trajectory["agent"]["name"] == "gemini-cli" and trajectory["agent"]["model_name"] == MODEL
    agent = [step for step in trajectory["steps"] if step["source"] == "agent"]
    assert [c["function_name"] for step in agent for c in step.get("tool_calls") or []] == ["write_file", "read_file"]
    assert "forgerl proof" in json.dumps(agent[1]["observation"]) and agent[-1]["message"] == ANSWER


def test_forge_run_grades_a_qwenclawbench_task(scripted, tmp_path):
    needs("gemini")
    # task_00067 through run_shell_command: 14 of the 15 checks pass (see runner_fixtures)
    _, extra, _ = graded_sparql("gemini-cli", scripted(sparql_script("run_shell_command")).url, tmp_path / "data",
                                "--model", "qwen3")
    assert '"run_shell_command"' in extra["harness_transcript"]


SERVED_TURNS = served_turns("run_shell_command")


def test_served_by_the_policy(tmp_path):
    """The runner adapter against `forge-record serve --policy script:FILE`: the policy's tokens drive the
    real CLI over the Gemini API, and the second prompt continues the first call's token ids."""
    needs("gemini")
    r, calls, hits = serve_turns(tmp_path, "gemini-cli", SERVED_TURNS, "gemini", {"GEMINI_API_KEY": KEY})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert hits == []
    work = tmp_path / "work"
    ctx = RunContext("", work, tmp_path / "home", "", "sv")
    assert (work / "proof.txt").read_text() == "forgerl\n"
    assert get_harness("gemini-cli").final_answer(r.stdout, ctx) == "Done."
    assert get_harness("gemini-cli").transcript_files(ctx), "no Gemini CLI transcript"
    check_served_ids(calls, SERVED_TURNS, "gemini")  # and the second turn continues the first call's tokens
    assert called(calls) == ["run_shell_command"]
    assert not files_holding(KEY[6:], tmp_path), "the API key reached the disk"


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
    assert not files_holding(KEY, Path(ctx.home))
