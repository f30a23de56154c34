"""`compute_score` for veRL's `reward.custom_reward_function`: the offline reward of one `verl-rl` row.

veRL calls `compute_score(data_source, solution_str, ground_truth, extra_info,
**reward_kwargs)`. For forgerl rows `ground_truth` is the task id and the
task source comes in `reward_kwargs["tasks"]` (what `forge-train rl` sets).
Online rollouts need none of this: the agent loop returns the graded reward.
Offline RL generates a single answer without a harness, and one rule
(`offline_rule`) rewards it, whatever the task's kind:

- regrade: a kind that can be graded from the recording and a workspace
  (`Task.offline_ungradable` empty: QwenClawBench and TOML tasks, whose
  grade() reads a transcript and the workspace) grades the answer as its
  checks grade a rollout, on a fresh copy of the task's workspace with a
  transcript of the prompt and that answer;
- recorded: any other kind (ClawEval's grader reads the session's tool
  dispatches and the services' audit data, web checks the apps' state,
  Harbor's verifier the environment the agent left; each kind says why) takes
  the reward its run recorded in `outcomes`, which `forge-convert` wrote into
  the row (`extra_info.recorded_reward`): the recorded trajectory's reward,
  not a grade of the new answer;
- refused: neither (such a kind and no recorded reward, as after an infra
  error; or a task the source does not hold). `screen` leaves these rows out
  before veRL starts and counts them per reason (`forge-train rl --data`
  reports the counts), so no sample is scored a silent 0; `compute_score`
  raises `RefusedSample` if one reaches it anyway.
"""

from __future__ import annotations

import functools
import math
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forgerl.runners.grading import combine, grade_workspace
from forgerl.runners.loader import load_tasks
from forgerl.runners.rollout import prepare_workspace
from forgerl.runners.tasks import Task
from forgerl.runners.transcript import openclaw_events
from forgerl.schema.messages import Message, Part

REGRADE, RECORDED, REFUSED = "regrade", "recorded", "refused"


class RefusedSample(ValueError):
    """A row the offline reward cannot score: neither re-gradable nor with a recorded reward."""


@dataclass(frozen=True)
class Rule:
    """How one row is rewarded offline: `how` is REGRADE, RECORDED or REFUSED (then `reason` says why)."""

    how: str
    reason: str = ""


@functools.lru_cache(maxsize=8)
def _tasks(path: str) -> dict[str, Task]:
    return {task.id: task for task in load_tasks(path)}


def _recorded(extra_info: dict | None) -> float | None:
    value = (extra_info or {}).get("recorded_reward")
    return None if value is None or math.isnan(value) else float(value)


def offline_rule(source: str, task_id: str, extra_info: dict | None) -> Rule:
    """The rule for the row of `task_id` (tasks from `source`) and its `extra_info`."""
    task = _tasks(source).get(task_id)
    if task is None:
        return Rule(REFUSED, f"no task {task_id!r} in {source}")
    if not task.offline_ungradable:
        return Rule(REGRADE)
    if _recorded(extra_info) is not None:
        return Rule(RECORDED)
    return Rule(REFUSED, f"{task.benchmark} task: {task.offline_ungradable}, and its run recorded no reward")


def _source(tasks: str | None, extra_info: dict | None) -> str:
    source = tasks or (extra_info or {}).get("task_path")
    if not source:
        raise ValueError("compute_score needs the task source: reward.custom_reward_function.reward_kwargs.tasks")
    return str(source)


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  tasks: str | None = None, **_: Any) -> float:
    source = _source(tasks, extra_info)
    rule = offline_rule(source, ground_truth, extra_info)
    if rule.how == REFUSED:
        raise RefusedSample(rule.reason)
    if rule.how == RECORDED:
        return _recorded(extra_info)
    task = _tasks(source)[ground_truth]
    transcript = openclaw_events([Message("user", (Part("text", text=task.prompt),)),
                                  Message("assistant", (Part("text", text=solution_str),))])
    with tempfile.TemporaryDirectory(prefix="forgerl-reward-") as tmp:
        workspace = Path(tmp) / "workspace"
        prepare_workspace(task, workspace)
        return float(combine(task, grade_workspace(task, transcript, workspace)).reward)


def screen(rows: list[dict], tasks: str) -> tuple[list[bool], Counter]:
    """Which rows (`reward_model`, `extra_info` as in `verl-rl` shards) the offline reward can score, and how many
    rows each rule took (`regrade`, `recorded`, `refused: <reason>`)."""
    keep, counts = [], Counter()
    for row in rows:
        extra_info = row.get("extra_info") or {}
        rule = offline_rule(_source(tasks, extra_info), (row.get("reward_model") or {}).get("ground_truth") or "",
                            extra_info)
        keep.append(rule.how != REFUSED)
        counts[f"{REFUSED}: {rule.reason}" if rule.how == REFUSED else rule.how] += 1
    return keep, counts
