"""A ClawEval task's own `grader.py` on a rollout, in the forked grading child (`forkserver.fork_call`).

The grader is found and called as ClawEval's CLI does it
(`claw_eval.graders.registry.get_grader`, `claw_eval.cli._grade_with_optional_params`),
on the trace built from our recording (`claweval_trace.py`) and the services'
audit data, and its `DimensionScores` become the task score through
`claw_eval.models.scoring.compute_task_score`.

Without a judge (`--judge`), graders still call one: they get `NotGradedJudge`,
whose every answer is 0 and counted, so the score is a lower bound and the
outcome says the judge part was not graded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from claw_eval.cli import _grade_with_optional_params
from claw_eval.graders import base
from claw_eval.graders.llm_judge import JudgeResult, LLMJudge
from claw_eval.graders.registry import get_grader
from claw_eval.models.scoring import compute_task_score
from claw_eval.models.task import TaskDefinition

from ..simulated_user import NO_KEY
from ..transcript import rollout_messages
from .claweval import NOT_JUDGED
from .claweval_trace import trace

JUDGE_KEY_VARIABLES = ("FORGE_JUDGE_API_KEY", "OPENAI_API_KEY")


class NotGradedJudge:
    """Stands in for `LLMJudge` when no judge is configured: every evaluation scores 0, and is counted."""

    def __init__(self) -> None:
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("evaluate"):
            raise AttributeError(name)

        def not_graded(*args: Any, **kwargs: Any) -> JudgeResult:
            self.calls += 1
            return JudgeResult(score=0.0, reasoning="not graded: forge-run was given no --judge")

        return not_graded


def _judge(judge: list[str] | None) -> LLMJudge | NotGradedJudge:
    if not judge:
        return NotGradedJudge()
    url, model = judge
    key = next((os.environ[k] for k in JUDGE_KEY_VARIABLES if os.environ.get(k)), NO_KEY)  # a pod's: its sidecar's
    return LLMJudge(model_id=model, api_key=key, base_url=url)


def grade(task_file: str, tasks_dir: str, dataset: str, session: str, audit: dict[str, dict],
          judge: list[str] | None) -> dict[str, float]:
    """The dimension scores, `task_score` and the count of ungraded judge calls, for one rollout."""
    # English graders load their Chinese peer through load_peer_grader(task_id), whose default folder is found
    # from the package's own file: point it at this benchmark's tasks/ (an installed claw_eval has none beside it).
    base.load_peer_grader.__defaults__ = (Path(tasks_dir),)
    task = TaskDefinition.from_yaml(task_file)
    messages, dispatches = trace(rollout_messages(dataset, session), task)
    grader = get_grader(task.task_id, tasks_dir=tasks_dir, task_dir=Path(task_file).parent)
    scorer = _judge(judge)
    scores, _ = _grade_with_optional_params(grader, messages, dispatches, task, audit_data=audit, judge=scorer,
                                            media_events=[])
    return {"completion": scores.completion, "robustness": scores.robustness,
            "communication": scores.communication, "safety": scores.safety,
            "task_score": compute_task_score(scores),
            NOT_JUDGED: float(scorer.calls if isinstance(scorer, NotGradedJudge) else 0)}
