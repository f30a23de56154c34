"""The behaviour metrics hold for every supported harness: one hand-labelled session per harness, recorded through
`forge-record serve` with the real CLI (tests/behaviour_fixtures.py, stored in tests/fixtures/behaviour).

Each call's label (plan update, failed call, write, the check after the last write that also recovers the failed
call) is written by hand in `behaviour_fixtures.jobs()`; here the views must say the same, call by call.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from forgerl.analysis import connect, kinds

from behaviour_fixtures import CHECK, FAILS, FIXTURE, PLAN, SUBMITS, WRITE, Job, jobs

# Offered tools that are `other` on purpose (no behaviour metric reads them): skills, MCP-ish and scheduling tools,
# deferred-tool discovery, questions to the user.
OTHER: dict[str, set[str]] = {
    "claude-code": {"CronCreate", "CronDelete", "CronList", "EnterWorktree", "ExitWorktree", "ReportFindings",
                    "ScheduleWakeup", "SendMessage", "Skill", "TaskOutput", "TaskStop", "Workflow"},
    "codex": {"request_user_input"},
    "openclaw": {"openclaw", "tool_call", "tool_describe", "tool_search"},
    "opencode": {"skill"},
    "gemini-cli": {"activate_skill"},
    "qwen-code": {"list_agents", "skill", "tool_call", "tool_search"},
    "pi": set(),
    "mini-swe-agent": set(),
}


@pytest.fixture(scope="module")
def con(tmp_path_factory):
    root = tmp_path_factory.mktemp("behaviour") / "data"
    shutil.copytree(FIXTURE, root)  # opening may upgrade a dataset in place: keep the stored fixture as recorded
    return connect(root, materialize=True)


def _rows(con, sql: str, *params) -> list[dict]:
    cur = con.execute(sql, list(params))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _label(call: dict, check_turn: int | None, recovered_turns: set[int]) -> str:
    """What the views say a call is, in the fixtures' label words."""
    if call["kind"] == "plan":
        return PLAN
    if call["writes_file"]:
        return WRITE
    if call["turn"] == check_turn and call["turn"] in recovered_turns:
        return CHECK
    if call["failed"]:
        return FAILS
    return SUBMITS if call["command"] == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" else "other"


@pytest.mark.parametrize("job", jobs(), ids=lambda j: j.harness)
def test_each_call_matches_its_hand_label(con, job: Job):
    calls = _rows(con, "SELECT tc.*, tr.failed FROM tool_calls tc LEFT JOIN tool_results tr USING (session_id, call_key) "
                       "WHERE session_id = ? ORDER BY step", job.harness)
    verification = _rows(con, "SELECT * FROM verification WHERE session_id = ?", job.harness)
    recoveries = _rows(con, "SELECT * FROM recoveries WHERE session_id = ?", job.harness)
    check_turn = verification[0]["check_turn"] if verification else None
    recovered = {r["recovered_turn"] for r in recoveries if r["recovered"]}
    want = [(act.arguments.get("id", act.name) if act.name == "tool_call" else act.name, label)
            for act, label in job.acts]
    assert [(c["tool_name"], _label(c, check_turn, recovered)) for c in calls] == want
    # one episode: the failed `cat notes.txt`, recovered by the same command after the write
    assert [(r["kind"], r["target"], r["failures"], r["recovered"]) for r in recoveries] == [
        ("shell", "cat notes.txt", 1, True)]


@pytest.mark.parametrize("job", jobs(), ids=lambda j: j.harness)
def test_session_metrics_per_harness(con, job: Job):
    m = _rows(con, "SELECT * FROM session_metrics WHERE session_id = ?", job.harness)[0]
    assert m["harness"] == job.harness
    assert (m["writes"], m["verified"], m["check_kind"], m["verify_latency_turns"]) == (1, True, "reread", 1)
    assert (m["failure_episodes"], m["recovered_episodes"], m["gave_up_episodes"]) == (1, 1, 0)
    assert (m["plan_items"], m["plan_completed"]) == job.plan
    assert m["plan_completion"] == (None if job.plan == (0, 0) else job.plan[1] / job.plan[0])


def test_every_offered_tool_has_a_kind(con):
    """The tool-kind table covers what each harness offers, but for the tools listed as `other` on purpose."""
    offered = _rows(con, "SELECT session_id, tools FROM calls WHERE tools IS NOT NULL")
    names: dict[str, set[str]] = {}
    for row in offered:
        for tool in json.loads(row["tools"]):
            found = [t["name"] for t in tool.get("tools") or []] if tool.get("type") == "namespace" else \
                [f["name"] for f in tool.get("functionDeclarations") or []] or [(tool.get("function") or tool).get("name")]
            names.setdefault(row["session_id"], set()).update(n for n in found if n)
    assert set(names) == set(OTHER)
    for harness, tools in names.items():
        assert tools - kinds.TOOL_KINDS.keys() == OTHER[harness], harness


def test_fixture_is_small_and_holds_no_key():
    files = [p for p in Path(FIXTURE).rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 3_000_000
    assert not [p for p in files if b"behaviourbehaviour" in p.read_bytes()]
