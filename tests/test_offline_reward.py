"""The offline reward of `verl-rl` rows: one rule for every task kind (`trainer/reward.py`).

Rows are real `forge-convert --to verl-rl` rows of the bundled example's recorded sessions, with outcome rows
as each kind's runner writes them (a reward for a graded run, none for an infra error) naming a task of each
kind: a forgerl TOML task (re-graded from a transcript and a fresh workspace), a web task, a ClawEval task and a
Harbor task (none of them gradable offline: each takes its run's recorded reward, or is refused without one).
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forgerl.converters.cli import main as convert
from forgerl.runners.loader import load_tasks
from forgerl.schema.writer import DatasetWriter
from forgerl.trainer.launch import LaunchError
from forgerl.trainer.reward import RefusedSample, compute_score, offline_rule, screen
from forgerl.trainer.rl import AGENT_NAME, offline_screened

from conftest import REPO
from faults.plumbing import rewrite_outcomes
from runner_fixtures import toml_task

EXAMPLE = REPO / "analysis" / "example"
CLAWEVAL_TASK = REPO.parent / "shared" / "benchmarks" / "claweval" / "tasks" / "T001zh_email_triage"
WEB_TASKS = REPO / "benchmarks" / "web" / "tasks" / "shop-buy-sencha.toml"
HARBOR_TASK = REPO / "tests" / "fixtures" / "harbor" / "hello"

# session -> (task, status, recorded reward): the outcome row of that recorded session (its example row replaced)
OUTCOMES = {
    "codex-patch-a1": ("add", "failed", 0.0),  # re-graded: the recorded 0 does not count
    "codex-patch-a2": ("add", "infra_error", None),  # re-graded all the same
    "cc-verify-a1": ("shop-buy-sencha", "failed", 0.25),
    "cc-verify-a2": ("shop-buy-sencha", "infra_error", None),
    "cc-recover2-a1": ("T001zh_email_triage", "success", 0.8125),
    "cc-recover2-a2": ("T001zh_email_triage", "infra_error", None),
    "cc-subagent-a1": ("hello", "failed", 0.0),  # a recorded 0 is a reward, not a missing one
    "cc-subagent-a2": ("hello", "infra_error", None),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    """The task source of each kind, by task id."""
    toml = toml_task(tmp_path_factory.mktemp("tasks"), "add",
                     "return {'said_42': 1.0 if '42' in str(transcript) else 0.0}", prompt="What is 40 + 2?")
    return {"add": str(toml), "shop-buy-sencha": str(WEB_TASKS), "T001zh_email_triage": str(CLAWEVAL_TASK),
            "hello": str(HARBOR_TASK)}


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict[str, dict]:
    """verl-rl rows (for an offline agent) of the example's sessions graded as `OUTCOMES` says, by session."""
    data = tmp_path_factory.mktemp("offline") / "example"
    shutil.copytree(EXAMPLE, data)
    rewrite_outcomes(data, lambda rows: [r for r in rows if r["session_id"] not in OUTCOMES])  # one outcome a session
    now = datetime.now(timezone.utc)
    with DatasetWriter(data, source="runner") as w:
        for session, (task, status, reward) in OUTCOMES.items():
            w.add_outcome({"session_id": session, "task_id": task, "attempt": 100,
                           "harness": "codex" if session.startswith("codex") else "claude-code",
                           "model": "m", "status": status, "reward": reward,
                           "passed": None if reward is None else reward == 1.0, "t_start": now, "t_end": now})
    out = data.parent / "rl"
    assert convert([str(data), "--to", "verl-rl", "--out", str(out), "--no-progress", "--val-fraction", "0",
                    "--no-dedupe", "--agent-name", "single_turn_agent"]) == 0
    rows = [r for f in sorted((out / "train").glob("*.parquet")) for r in pq.read_table(f).to_pylist()]
    return {r["extra_info"]["session_id"]: r for r in rows if r["extra_info"]["session_id"] in OUTCOMES}


def score(row: dict, source: str, answer: str) -> float:
    return compute_score(row["data_source"], answer, row["reward_model"]["ground_truth"], row["extra_info"],
                         tasks=source)


def test_each_kind_says_whether_it_grades_offline(sources):
    kinds = {task_id: load_tasks(path)[0] for task_id, path in sources.items()}
    assert [task_id for task_id, task in kinds.items() if not task.offline_ungradable] == ["add"]
    assert {type(task).__name__ for task in kinds.values()} == {"Task", "WebTask", "ClawEvalTask", "HarborTask"}


def test_a_workspace_task_is_regraded_whatever_its_run_recorded(rows, sources):
    for session in ("codex-patch-a1", "codex-patch-a2"):
        assert offline_rule(sources["add"], "add", rows[session]["extra_info"]).how == "regrade"
        assert score(rows[session], sources["add"], "It is 42.") == 1.0
        assert score(rows[session], sources["add"], "It is 41.") == 0.0


@pytest.mark.parametrize(("graded", "infra", "task_id", "reward", "why"), [
    ("cc-verify-a1", "cc-verify-a2", "shop-buy-sencha", 0.25,
     "forgerl-web task: its checks read the apps' state after the run"),
    ("cc-recover2-a1", "cc-recover2-a2", "T001zh_email_triage", 0.8125,
     "ClawEval task: its grader reads the recorded session's tool dispatches and the services' audit data after "
     "the run"),
    ("cc-subagent-a1", "cc-subagent-a2", "hello", 0.0, "Harbor task: its verifier (tests/test.sh) checks the "
     "environment the agent left"),
])
def test_other_kinds_take_the_recorded_reward_or_are_refused(rows, sources, graded, infra, task_id, reward, why):
    source = sources[task_id]
    assert rows[graded]["extra_info"]["recorded_reward"] == reward
    assert score(rows[graded], source, "It is 42.") == reward == score(rows[graded], source, "")
    assert rows[infra]["extra_info"]["recorded_reward"] is None
    rule = offline_rule(source, task_id, rows[infra]["extra_info"])
    assert rule.how == "refused" and rule.reason == f"{why}, and its run recorded no reward"
    with pytest.raises(RefusedSample, match="its run recorded no reward"):
        score(rows[infra], source, "It is 42.")
    keep, counts = screen([rows[graded], rows[infra], rows["codex-patch-a1"]], source)
    assert keep == [True, False, False]  # codex-patch-a1's task "add" is not in this source
    assert counts == {"recorded": 1, f"refused: {rule.reason}": 1, f"refused: no task 'add' in {source}": 1}


def test_forge_train_leaves_refused_rows_out_and_reports_them(rows, sources, tmp_path, capsys):
    shard = tmp_path / "train.parquet"
    harness_row = {**rows["cc-verify-a2"], "agent_name": AGENT_NAME}  # graded by its rollout: never screened
    pq.write_table(pa.Table.from_pylist([rows["cc-verify-a1"], rows["cc-verify-a2"], harness_row]), shard)
    kept = offline_screened([str(shard)], Path(sources["shop-buy-sencha"]), tmp_path / "run")
    left = [r for f in kept for r in pq.read_table(f).to_pylist()]
    assert [(r["extra_info"]["session_id"], r["agent_name"]) for r in left] == [
        ("cc-verify-a1", "single_turn_agent"), ("cc-verify-a2", AGENT_NAME)]
    reason = "refused: forgerl-web task: its checks read the apps' state after the run, and its run recorded no reward"
    assert json.loads((tmp_path / "run" / "offline_rewards.json").read_text()) == {"recorded": 1, reason: 1}
    assert capsys.readouterr().err.strip() == f"forge-train: offline rewards: 1 recorded; 1 {reason}"


def test_data_whose_every_row_is_refused_is_one_line(rows, sources, tmp_path):
    shard = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([rows["cc-subagent-a2"]]), shard)
    with pytest.raises(LaunchError) as refused:
        offline_screened([str(shard)], Path(sources["hello"]), tmp_path / "run")
    assert str(refused.value) == ("every row of --data is refused by the offline reward: 1 refused: Harbor task: its "
                                  "verifier (tests/test.sh) checks the environment the agent left, and its run "
                                  "recorded no reward")
    assert not (tmp_path / "run" / "offline_rewards.json").exists()
