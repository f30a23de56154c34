"""mini-swe-agent 2.4.6 (its own venv, .venv-mini) end to end: record, convert, run a task, serve.

The real `mini` CLI talks to the scripted upstream (or the scripted policy)
through the recorder. Its one tool is `bash`; it stops when a command prints
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT first, and the rest of that output is
its submission (the final answer). The recording is made once per module and
shared by the record and convert tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forgerl.harnesses import HarnessError, get_harness
from forgerl.schema.store import read_table

from conftest import session_parts
from harness_checks import (SPARQL_COMMAND, atif_calls, atif_doc, chat_calls, check_served_ids, files_holding,
                            graded_sparql, one_segment_sft, record_trapped, run_served, tool_results)
from scripted_upstream import Request, ToolCall, Turn

pytestmark = pytest.mark.slow
KEY = "sk-proj-miniswetestminiswetestminiswe"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
LOOP = ["echo forgerl > proof.txt", "cat proof.txt", f"{SUBMIT} && cat proof.txt"]


def mini() -> Path:
    try:
        return Path(get_harness("mini-swe-agent").find())
    except HarnessError as e:
        pytest.fail(f"{e}: run `make test` (it builds .venv-mini from requirements-mini.lock)")


def loop_script(request: Request) -> Turn:
    """Write proof.txt, read it back, submit its content: one bash call per turn, as mini requires."""
    step = tool_results(request)
    return Turn(text=f"Step {step}.", tool_calls=[ToolCall("bash", {"command": LOOP[min(step, 2)]})])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, object, Path, list[str]]:
    """One recording, with every proxy variable at a trap: anything it reaches besides the recorder (loopback
    is exempt) lands there, as litellm's model-cost-map fetch from GitHub does without the launcher's
    LITELLM_LOCAL_MODEL_COST_MAP."""
    base = tmp_path_factory.mktemp("mini")
    run = record_trapped(base, "mi", loop_script, [str(mini()), "-m", "openai/gpt-5.4", "-t",
                                                   "Write proof.txt and read it back.", "--yolo", "--exit-immediately",
                                                   "-o", str(base / "traj.json")], {"OPENAI_API_KEY": KEY})
    r = run["run"]
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return base, r, base / "data", run["hits"]


def test_records_a_tool_loop(recorded):
    base, r, data, phoned = recorded
    assert phoned == [], phoned
    assert (base / "work" / "proof.txt").read_text() == "forgerl\n"
    info = json.loads((base / "traj.json").read_text())["info"]
    assert info["exit_status"] == "Submitted" and info["submission"] == "forgerl\n"
    calls = chat_calls(data, "mi", 3, "gpt-5.4")
    assert [t["name"] for t in json.loads(calls[0]["tools"])] == ["bash"]
    parts = [json.loads(p) for p in session_parts(data, "mi").values()]
    made = {p["call_id"]: json.loads(p["arguments"])["command"] for p in parts if p["type"] == "tool_call"}
    assert sorted(made.values()) == sorted(LOOP)
    read_back = [p for p in parts if p["type"] == "tool_result" and made.get(p["call_id"]) == "cat proof.txt"]
    assert read_back and "forgerl" in read_back[0]["text"]
    sessions = read_table(data, "sessions").to_pylist()
    assert {s["harness"] for s in sessions} == {"mini-swe-agent"}
    assert "session mi (mini-swe-agent)" in r.stderr and "bash x3" in r.stderr
    leaked = files_holding(KEY[8:], data, base / "home", base / "traj.json")
    assert not leaked, leaked


def test_tokens_and_verl_sft(recorded, tmp_path):
    _, _, data, _ = recorded
    _, ds = one_segment_sft(data, tmp_path, "mini-swe-agent", "mi", 3)  # veRL's ids are the `tokens` row's
    calls = [c for m in ds.messages[0] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [json.loads(c["function"]["arguments"])["command"] for c in calls] == LOOP
    assert [t["function"]["name"] for t in ds.tools[0]] == ["bash"]


def test_atif(recorded, tmp_path):
    _, _, data, _ = recorded
    doc = atif_doc(data, tmp_path / "a", "mini-swe-agent")
    assert [(c["function_name"], c["arguments"]["command"]) for c in atif_calls(doc)] == [("bash", cmd) for cmd in LOOP]


def sparql_script(request: Request) -> Turn:
    """task_00067 through mini's bash tool: write the query (14 of 15 checks), then submit."""
    if "SPARQL" not in str(request.body):
        return Turn(text="Nothing to do.", tool_calls=[ToolCall("bash", {"command": SUBMIT})])
    if tool_results(request) == 0:
        return Turn(text="Writing the query.", tool_calls=[ToolCall("bash", {"command": SPARQL_COMMAND})])
    return Turn(text="Done.", tool_calls=[ToolCall("bash", {"command": f"{SUBMIT} && echo Wrote query_output.sparql"})])


def test_forge_run_grades_a_task(scripted, tmp_path):
    mini()
    row, extra, calls = graded_sparql("mini-swe-agent", scripted(sparql_script).url, tmp_path / "data",
                                      answer="Wrote query_output.sparql")
    assert row["model"] == "gpt-5.4"
    assert any("network namespace" in e for e in extra["enforced"]) or "not isolated" in str(extra["enforced"])
    assert '"submission"' in extra["harness_transcript"]
    assert len(calls) == 2 and all(c["error"] is None and c["status"] == 200 for c in calls)


MINI_TURNS = ['<tool_call>\n{"name": "bash", "arguments": {"command": "echo forgerl > proof.txt"}}\n</tool_call>',
              '<think>\nIt worked.\n</think>\n\nDone.\n<tool_call>\n{"name": "bash", "arguments": '
              '{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}\n</tool_call>']


def test_served_by_the_policy(tmp_path, monkeypatch):
    r, calls, phoned = run_served(tmp_path, monkeypatch, MINI_TURNS,
                                  [str(mini()), "-m", "openai/qwen3-policy", "-t", "Write proof.txt", "--yolo",
                                   "--exit-immediately", "-o", str(tmp_path / "traj.json")], "ms",
                                  {"OPENAI_API_KEY": KEY})
    assert phoned == [], phoned
    assert (tmp_path / "work" / "proof.txt").read_text() == "forgerl\n"
    assert json.loads((tmp_path / "traj.json").read_text())["info"]["exit_status"] == "Submitted"
    check_served_ids(calls, MINI_TURNS, "chat")  # and the second turn continues the first call's tokens


def test_analysis_sees_its_bash_actions_as_shell(recorded):
    """mini's actions are `bash` tool calls (v2): the analysis counts them as shell, `cat` as a re-read check."""
    from forgerl.analysis import connect

    _, _, data, _ = recorded
    con = connect(data)
    kinds = con.execute("SELECT tool_name, kind, command FROM tool_calls WHERE session_id = 'mi' "
                        "ORDER BY turn, pos").fetchall()
    assert [(name, kind) for name, kind, _ in kinds] == [("bash", "shell")] * 3
    assert [command for _, _, command in kinds] == LOOP
    cur = con.execute("SELECT * FROM session_metrics WHERE session_id = 'mi'")
    m = dict(zip([d[0] for d in cur.description], cur.fetchone()))
    assert m["harness"] == "mini-swe-agent" and m["tool_calls"] == 3
    assert (m["tools_offered"], m["tools_used"]) == (1, 1)
