"""Hand-labelled fixture sessions for the analysis tests: recorded once through the real recorder.

The sessions are `analysis_scenarios.scenarios()`; the values below were
worked out by hand from those scripts and the definitions in analysis/README.md
(not read back from the views). Turn numbers count model calls that produced
output, in order, subagent calls included.
"""

from __future__ import annotations

from pathlib import Path

from forgerl.schema.writer import DatasetWriter

import analysis_scenarios as scenarios
from conftest import RecorderProcess, session_calls
from scripted_upstream import ScriptedUpstream

# Per call: 100 uncached in, 10 out, 1000 cache read, 50 cache write (scenarios.USAGE). OpenAI's APIs have no
# cache-write count: the scripted upstream reports those 50 as plain input, so a Codex call has 150 uncached in.
SONNET_CALL = (100 * 3.0 + 10 * 15.0 + 1000 * 0.30 + 50 * 3.75) / 1e6
GPT5_CALL = (150 * 1.25 + 10 * 10.0 + 1000 * 0.125) / 1e6

EXPECTED: dict[str, dict] = {
    # TodoWrite(3 pending), Read, Edit calc.py (t3), Bash pytest (t4, a test), TodoWrite(2 of 3 done), answer.
    "cc-verify": dict(harness="claude-code", model="claude-sonnet-4-5", calls=6, turns=6, tool_calls=5, writes=1,
                      verified=True, verify_latency_turns=1, check_kind="test", failure_episodes=0,
                      recovered_episodes=0, gave_up_episodes=0, tools_offered=8, tools_used=4, tool_coverage=0.5,
                      plan_items=3, plan_completed=2, plan_completion=2 / 3, human_turns=1, harness_turns=1,
                      parallel_turns=0, subagent_calls=0, call_errors=0, errored=False,
                      input_tokens=600, output_tokens=60, cache_read_tokens=6000, cache_write_tokens=300,
                      cost_usd=6 * SONNET_CALL),
    # pytest fails twice (is_error, then only "Exit code: 1" in the text), Edit (t3), pytest passes (t4):
    # one episode, 2 failures, recovered 3 turns after the first failure. Write NOTES.md (t5), no check after.
    "cc-recover2": dict(turns=6, tool_calls=5, writes=2, verified=False, verify_latency_turns=None,
                        failed_results=2, failure_episodes=1, recovered_episodes=1, gave_up_episodes=0,
                        turns_to_recover_total=3, tools_used=3, tool_coverage=3 / 8, plan_items=0,
                        plan_completion=None, human_turns=1, harness_turns=0),
    # Read missing.txt fails alongside Grep and Glob (one turn of 3 parallel calls), then the model gives up.
    "cc-giveup-parallel": dict(turns=2, tool_calls=3, parallel_turns=1, writes=0, verified=None, failed_results=1,
                               failure_episodes=1, recovered_episodes=0, gave_up_episodes=1, tools_used=3,
                               tool_coverage=3 / 8),
    # Agent (t1) runs a subagent (t2 Glob, t3 answer), then 2 parallel TaskCreate (t4), TaskUpdate #1 done (t5),
    # answer (t6). The subagent's prompt is harness-written. Offered: 6 main + Glob from the subagent.
    "cc-subagent": dict(turns=6, tool_calls=5, subagent_calls=1, parallel_turns=1, human_turns=1, harness_turns=1,
                        plan_items=2, plan_completed=1, plan_completion=0.5, tools_offered=7, tools_used=4,
                        tool_coverage=4 / 7, writes=0, failure_episodes=0),
    # Bash ls (t1), then the upstream answers 500: 2 calls, 1 turn, and the session ends in an error.
    "cc-errors-out": dict(calls=2, turns=1, tool_calls=1, call_errors=1, errored=True, failure_episodes=0,
                          input_tokens=100, cache_read_tokens=1000),
    # One chat call with no tools offered: coverage, plan and verification are undefined (NULL).
    "no-tools": dict(harness="openai-python", model="gpt-4.1", turns=1, tool_calls=0, tools_offered=0,
                     tools_used=0, tool_coverage=None, plan_completion=None, verified=None, human_turns=1),
    # update_plan, apply_patch Add hello.py (t2), run fails with exit 1 (t3), patch (t4), run passes (t5, check
    # kind run), update_plan 2/2 done, answer. Recovery of `python hello.py`: 2 turns.
    "codex-patch": dict(harness="codex", model="gpt-5", turns=7, tool_calls=6, writes=2, verified=True,
                        verify_latency_turns=1, check_kind="run", failed_results=1, failure_episodes=1,
                        recovered_episodes=1, turns_to_recover_total=2, tools_offered=5, tools_used=3,
                        tool_coverage=0.6, plan_items=2, plan_completed=2, plan_completion=1.0,
                        human_turns=1, harness_turns=1, input_tokens=1050, cache_write_tokens=0,
                        cost_usd=7 * GPT5_CALL),
}

# Graded rollouts as a runner would write them. fix-calc: 2 attempts, 1 passed; find-file: 1 failed;
# greet: 1 passed plus an infra_error that is not an attempt.
OUTCOMES = [
    ("cc-verify", "fix-calc", 1, "success", 1.0),
    ("cc-recover2", "fix-calc", 2, "failed", 0.5),
    ("cc-giveup-parallel", "find-file", 1, "failed", 0.0),
    ("codex-patch", "greet", 1, "success", 1.0),
    ("cc-errors-out", "greet", 2, "infra_error", None),
]
EXPECTED_PASS_K = {  # (task, k) -> (pass@k, pass^k)
    ("fix-calc", 1): (0.5, 0.5), ("fix-calc", 2): (1.0, 0.0),
    ("find-file", 1): (0.0, 0.0),
    ("greet", 1): (1.0, 1.0),
}


def record_fixtures(root: Path) -> None:
    """Play every scenario through `forge-record serve` against the scripted upstream, then add outcomes."""
    all_ = scenarios.scenarios()
    with ScriptedUpstream(scenarios.script) as up:
        rec = RecorderProcess(root, up.url).start()
        try:
            for s in all_:
                scenarios.play(s, rec.base(s.session))
            for s in all_:
                session_calls(root, s.session, EXPECTED[s.session].get("calls", EXPECTED[s.session]["turns"]))
        finally:
            rec.stop()
    add_outcomes(root, {s.session: s for s in all_})


def add_outcomes(root: Path, by_session: dict) -> None:
    with DatasetWriter(root, source="runner") as w:
        for session, task, attempt, status, reward in OUTCOMES:
            w.add_outcome(scenarios.outcome(by_session[session], session, task, attempt, reward, status))


# --- several policy versions on train and held-out tasks (learning curves, `compare --task-ids --per`) -----------

LEARN_TRAIN = ("tr-copy", "tr-make", "tr-move", "tr-wipe")
LEARN_HELDOUT = ("ho-copy", "ho-make", "ho-move", "ho-wipe")
LEARN_SCENARIO = {"claude-code": "cc-giveup-parallel", "codex": "codex-patch"}  # the session each harness plays
LEARN_CALLS = {"cc-giveup-parallel": 2, "codex-patch": 7}
# (harness, policy version) -> the tasks whose one attempt passes (reward 1.0; every other attempt fails at 0.0).
# By hand, pass rate train / held-out / all: claude-code v0 0 / 0 / 0, v1 1 / 1/2 / 3/4, v2 1 / 1 / 1;
# codex v0 1/4 / 0 / 1/8, v1 1/2 / 1/4 / 3/8, v2 3/4 / 1/2 / 5/8.
LEARN_PASSES: dict[tuple[str, str], set[str]] = {
    ("claude-code", "v0"): set(),
    ("claude-code", "v1"): {*LEARN_TRAIN, "ho-copy", "ho-make"},
    ("claude-code", "v2"): {*LEARN_TRAIN, *LEARN_HELDOUT},
    ("codex", "v0"): {"tr-copy"},
    ("codex", "v1"): {"tr-copy", "tr-make", "ho-copy"},
    ("codex", "v2"): {"tr-copy", "tr-make", "tr-move", "ho-copy", "ho-make"},
}


def record_learning(root: Path) -> None:
    """Play one session per (policy version, harness, task) through `forge-record serve --policy-version V`, then
    write the graded outcomes; v0's runner leaves the version out (the sessions' calls carry it)."""
    by_name = {s.session: s for s in scenarios.scenarios()}
    rows = []
    with ScriptedUpstream(scenarios.script) as up:
        for version in ("v0", "v1", "v2"):
            rec = RecorderProcess(root, up.url, "--policy-version", version).start()
            try:
                played = []
                for (harness, v), passes in LEARN_PASSES.items():
                    if v != version:
                        continue
                    scenario = by_name[LEARN_SCENARIO[harness]]
                    for task in (*LEARN_TRAIN, *LEARN_HELDOUT):
                        session = f"{version}-{harness}-{task}"
                        scenarios.play(scenario, rec.base(session))
                        played.append((session, scenario))
                        row = scenarios.outcome(scenario, session, task, 1, 1.0 if task in passes else 0.0)
                        rows.append({**row, "policy_version": None if version == "v0" else version})
                for session, scenario in played:
                    session_calls(root, session, LEARN_CALLS[scenario.session])
            finally:
                rec.stop()
    with DatasetWriter(root, source="runner") as w:
        for row in rows:
            w.add_outcome(row)
