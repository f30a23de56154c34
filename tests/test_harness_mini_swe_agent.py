"""mini-swe-agent 2.4.6 (its own venv, .venv-mini) end to end: record, convert, run a task, serve.

The real `mini` CLI talks to the scripted upstream (or the scripted policy)
through the recorder. Its one tool is `bash`; it stops when a command prints
COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT first, and the rest of that output is
its submission (the final answer). The recording is made once per module and
shared by the record and convert tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from forgerl.recorder.launch import launch
from forgerl.runners.harnesses.mini_swe_agent import MINI_BIN
from forgerl.schema.store import read_table

from conftest import FORGE_RECORD, RecorderProcess, session_calls, session_parts
from convert_fixtures import TOKENIZER_DIR, convert, qwen_tokenizer, rows
from qwen_pi_fixtures import ProxyTrap
from runner_fixtures import BENCH, SPARQL_QUERY, SPARQL_SCORE, SPARQL_TASK
from scripted_upstream import Request, ScriptedUpstream, ToolCall, Turn

pytestmark = pytest.mark.slow
KEY = "sk-proj-miniswetestminiswetestminiswe"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
LOOP = ["echo forgerl > proof.txt", "cat proof.txt", f"{SUBMIT} && cat proof.txt"]


def mini() -> Path:
    path = MINI_BIN / "mini"
    if not path.exists():
        pytest.fail(f"{path} missing: run `make test` (it builds .venv-mini from requirements-mini.lock)")
    return path


def tool_results(request: Request) -> int:
    return sum(m.get("role") == "tool" for m in request.body.get("messages") or [])


def loop_script(request: Request) -> Turn:
    """Write proof.txt, read it back, submit its content: one bash call per turn, as mini requires."""
    step = tool_results(request)
    return Turn(text=f"Step {step}.", tool_calls=[ToolCall("bash", {"command": LOOP[min(step, 2)]})])


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, Path, list[str]]:
    """One recording, with every proxy variable at a trap: anything it reaches besides the recorder (loopback
    is exempt) lands there, as litellm's model-cost-map fetch from GitHub does without the launcher's
    LITELLM_LOCAL_MODEL_COST_MAP."""
    base = tmp_path_factory.mktemp("mini")
    work, home = base / "work", base / "home"
    work.mkdir()
    home.mkdir()
    trap = ProxyTrap()
    with ScriptedUpstream(loop_script) as up:
        r = subprocess.run([FORGE_RECORD, "run", "--out", str(base / "data"), "--session", "mi",
                            "--upstream-openai", up.url, "--", str(mini()), "-m", "openai/gpt-5.4", "-t",
                            "Write proof.txt and read it back.", "--yolo", "--exit-immediately",
                            "-o", str(base / "traj.json")],
                           cwd=work, env={**os.environ, "HOME": str(home), "OPENAI_API_KEY": KEY, **trap.env()},
                           capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL)
    trap.close()
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return base, r, base / "data", trap.hits


def test_records_a_tool_loop(recorded):
    base, r, data, phoned = recorded
    assert phoned == [], phoned
    assert (base / "work" / "proof.txt").read_text() == "forgerl\n"
    info = json.loads((base / "traj.json").read_text())["info"]
    assert info["exit_status"] == "Submitted" and info["submission"] == "forgerl\n"
    calls = session_calls(data, "mi", 3)
    assert len(calls) == 3 and all(c["api"] == "chat" and c["complete"] and c["error"] is None for c in calls)
    assert all(c["path"] == "/v1/chat/completions" and c["model_requested"] == "gpt-5.4" for c in calls)
    assert [t["name"] for t in json.loads(calls[0]["tools"])] == ["bash"]
    parts = [json.loads(p) for p in session_parts(data, "mi").values()]
    made = {p["call_id"]: json.loads(p["arguments"])["command"] for p in parts if p["type"] == "tool_call"}
    assert sorted(made.values()) == sorted(LOOP)
    read_back = [p for p in parts if p["type"] == "tool_result" and made.get(p["call_id"]) == "cat proof.txt"]
    assert read_back and "forgerl" in read_back[0]["text"]
    sessions = read_table(data, "sessions").to_pylist()
    assert {s["harness"] for s in sessions} == {"mini-swe-agent"}
    assert "session mi (mini-swe-agent)" in r.stderr and "bash x3" in r.stderr
    leaked = [str(p) for p in [*data.rglob("*"), *(base / "home").rglob("*"), base / "traj.json"]
              if p.is_file() and KEY[8:].encode() in p.read_bytes()]
    assert not leaked, leaked


def test_tokens_and_verl_sft(recorded, tmp_path):
    from forgerl.trainer.sft_dataset import ForgeSFTDataset

    _, _, data, _ = recorded
    manifest = convert(data, tmp_path / "s", "--to", "verl-sft", "--harness", "mini-swe-agent")
    assert manifest["counts"]["sessions"] == 1 and not manifest["counts"].get("tools_absent_calls")
    convert(data, tmp_path / "t", "--to", "tokens", "--tokenizer", TOKENIZER_DIR, "--harness", "mini-swe-agent")
    (row,) = rows(tmp_path / "t")
    assert row["segment_id"] == "mi:0" and row["num_turns"] == 3 and row["harness"] == "mini-swe-agent"
    files = sorted(str(p) for p in (tmp_path / "s").glob("train/*.parquet"))
    ds = ForgeSFTDataset(files, qwen_tokenizer(), {"pad_mode": "no_padding", "max_length": 65536,
                                                   "ignore_input_ids_mismatch": True})
    calls = [c for m in ds.messages[0] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [json.loads(c["function"]["arguments"])["command"] for c in calls] == LOOP
    assert [t["function"]["name"] for t in ds.tools[0]] == ["bash"]
    item = ds[0]
    assert item["input_ids"].tolist() == row["input_ids"]
    assert item["loss_mask"].tolist() == row["loss_mask"]


def test_atif(recorded, tmp_path):
    import atif

    _, _, data, _ = recorded
    convert(data, tmp_path / "a", "--to", "atif", "--harness", "mini-swe-agent")
    (doc_path,) = (tmp_path / "a").glob("train/*.json")
    doc = json.loads(doc_path.read_text())
    atif.Trajectory.model_validate(doc)
    calls = [c for s in doc["steps"] for c in s.get("tool_calls") or []]
    assert [(c["function_name"], c["arguments"]["command"]) for c in calls] == [("bash", cmd) for cmd in LOOP]


def sparql_script(request: Request) -> Turn:
    """task_00067 through mini's bash tool: write the query (14 of 15 checks), then submit."""
    if "SPARQL" not in str(request.body):
        return Turn(text="Nothing to do.", tool_calls=[ToolCall("bash", {"command": SUBMIT})])
    if tool_results(request) == 0:
        cmd = f"cat > query_output.sparql <<'EOF'\n{SPARQL_QUERY}EOF"
        return Turn(text="Writing the query.", tool_calls=[ToolCall("bash", {"command": cmd})])
    return Turn(text="Done.", tool_calls=[ToolCall("bash", {"command": f"{SUBMIT} && echo Wrote query_output.sparql"})])


def test_forge_run_grades_a_task(scripted, tmp_path):
    mini()
    up = scripted(sparql_script)
    out = tmp_path / "data"
    r = subprocess.run([str(Path(sys.executable).with_name("forge-run")), str(BENCH), "--task", SPARQL_TASK,
                        "--harness", "mini-swe-agent", "--upstream", up.url, "--out", str(out)],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = read_table(out, "outcomes").to_pylist()
    assert row["harness"] == "mini-swe-agent" and row["model"] == "gpt-5.4"
    assert row["reward"] == pytest.approx(SPARQL_SCORE) and row["status"] == "failed"
    extra = json.loads(row["extra"])
    assert extra["final_answer"] == "Wrote query_output.sparql"
    assert any("network namespace" in e for e in extra["enforced"]) or "not isolated" in str(extra["enforced"])
    assert '"submission"' in extra["harness_transcript"]
    calls = read_table(out, "calls").to_pylist()
    assert len(calls) == 2 and all(c["error"] is None and c["status"] == 200 for c in calls)


MINI_TURNS = ['<tool_call>\n{"name": "bash", "arguments": {"command": "echo forgerl > proof.txt"}}\n</tool_call>',
              '<think>\nIt worked.\n</think>\n\nDone.\n<tool_call>\n{"name": "bash", "arguments": '
              '{"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}\n</tool_call>']


def test_served_by_the_policy(tmp_path):
    tok = qwen_tokenizer()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(MINI_TURNS))
    served = RecorderProcess(tmp_path / "data", None, "--policy", f"script:{script}", "--tokenizer",
                             str(TOKENIZER_DIR), "--served-model", "qwen3-policy").start()
    (tmp_path / "work").mkdir()
    try:
        aimed = launch([str(mini()), "-m", "openai/qwen3-policy", "-t", "Write proof.txt", "--yolo",
                        "--exit-immediately", "-o", str(tmp_path / "traj.json")], served.url, "ms", tmp_path)
        r = subprocess.run(aimed.argv, cwd=tmp_path / "work", capture_output=True, text=True, timeout=240,
                           env={**os.environ, "HOME": str(tmp_path), "OPENAI_API_KEY": KEY, **aimed.env},
                           stdin=subprocess.DEVNULL)
    finally:
        served.stop()
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / "work" / "proof.txt").read_text() == "forgerl\n"
    assert json.loads((tmp_path / "traj.json").read_text())["info"]["exit_status"] == "Submitted"
    calls = session_calls(tmp_path / "data", "ms", 2)
    for call, text in zip(calls, MINI_TURNS):
        assert call["api"] == "chat" and call["policy_version"] == "qwen3-policy" and call["error"] is None
        assert tok.decode(call["completion_token_ids"][:-1], skip_special_tokens=False) == text
    held = calls[0]["prompt_token_ids"] + calls[0]["completion_token_ids"]
    assert calls[1]["prompt_token_ids"][:len(held)] == held, "the second turn re-tokenised the history"


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
