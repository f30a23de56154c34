"""`compute_score` for veRL's `reward.custom_reward_function`: grade a policy's answer with the task's grader.

veRL calls `compute_score(data_source, solution_str, ground_truth, extra_info,
**reward_kwargs)`. For forgerl rows `ground_truth` is the task id and the
task source comes in `reward_kwargs["tasks"]` (what `forge-train rl` sets).
Offline RL on `verl-rl` shards generates a single answer without a harness:
it is graded as the task's automated checks grade a rollout, on a fresh
copy of the task's workspace with a transcript of the prompt and that answer.
Online rollouts need none of this: the agent loop returns the graded reward.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any

from forgerl.runners.grading import combine, grade_workspace
from forgerl.runners.rollout import prepare_workspace
from forgerl.runners.tasks import Task, load_tasks
from forgerl.runners.transcript import openclaw_events
from forgerl.schema.messages import Message, Part


@functools.lru_cache(maxsize=8)
def _tasks(path: str) -> dict[str, Task]:
    return {task.id: task for task in load_tasks(path)}


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None,
                  tasks: str | None = None, **_: Any) -> float:
    source = tasks or (extra_info or {}).get("task_path")
    if not source:
        raise ValueError("compute_score needs the task source: reward.custom_reward_function.reward_kwargs.tasks")
    known = _tasks(str(source))
    if ground_truth not in known:
        raise ValueError(f"no task {ground_truth!r} in {source}")
    task = known[ground_truth]
    transcript = openclaw_events([Message("user", (Part("text", text=task.prompt),)),
                                  Message("assistant", (Part("text", text=solution_str),))])
    with tempfile.TemporaryDirectory(prefix="forgerl-reward-") as tmp:
        workspace = Path(tmp) / "workspace"
        prepare_workspace(task, workspace)
        return float(combine(task, grade_workspace(task, transcript, workspace)).reward)
