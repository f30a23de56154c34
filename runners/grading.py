"""Grading a rollout: run the task's `grade()` and turn its scores into a reward.

`grade()` is arbitrary Python from a task file, so it runs in a child process
of its own (forked from a warm server, `forkserver.py`) with the workspace as
its working directory and a time limit: a grader that hangs or crashes
cannot take the runner with it. The local runner and the
Kubernetes pod entry both call `grade_workspace`, so a task is graded the same
way wherever it ran.

Scoring follows QwenClawBench (`scripts/lib_grading.py`): the automated score
is the plain mean of the values `grade()` returns; a hybrid task weights its
automated and judge parts by `grading_weights`. Parts that were not graded
(the LLM judge, when no judge is configured) are left out of the weighted
mean and recorded as "not graded", so without a judge the reward is the
automated score itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from forgerl.schema.messages import Message

from .forkserver import ForkError, fork_grade
from .grade_code import GradingError
from .transcript import openclaw_events, recorded_turns, rollout_messages
from .verifier import Verdict

if TYPE_CHECKING:
    from .tasks import Task

GRADER_TIMEOUT_S = 120
NOT_GRADED = "not graded"


@dataclass(frozen=True)
class Judge:
    """An OpenAI-compatible LLM judge (`forge-run --judge URL --judge-model M`); its key is read from
    FORGE_JUDGE_API_KEY, else OPENAI_API_KEY, when it is called (never stored)."""

    url: str  # the API base, e.g. http://host:8000/v1
    model: str


@dataclass(frozen=True)
class GradeInput:
    """What a task's `score` may read about one finished rollout (its recorded calls are durable by then).

    `messages` and `transcript` are read from the dataset on first use, so a
    kind that needs neither never reads the session's calls.
    """

    dataset: Path  # the dataset root the recorder writes
    session: str
    workspace: Path
    final_answer: str | None = None  # the harness's last answer to the user, from its own output
    service_state: dict[str, object] = field(default_factory=dict)  # service name -> what its state endpoints returned
    verdict: Verdict | None = None  # what a verifier run after the agent left (`verifier.py`), if the task has one
    judge: Judge | None = None  # for the LLM-judged parts of a grade; None: they are reported as not graded

    @cached_property
    def messages(self) -> list[Message]:
        """The recorded conversation in the schema's canonical model: the last call's input and output."""
        return rollout_messages(self.dataset, self.session)

    @cached_property
    def transcript(self) -> list[dict]:
        """The OpenClaw-style transcript QwenClawBench graders read (`transcript.py`)."""
        return openclaw_events(self.messages)

    @cached_property
    def turns(self) -> list[list[Message]]:
        """The model's answer in each recorded call, in order (the whole trajectory, also for harnesses whose last
        call's input does not repeat the earlier steps)."""
        return recorded_turns(self.dataset, self.session)


def grade_workspace(task: Task, transcript: list, workspace: Path, timeout: float = GRADER_TIMEOUT_S) -> dict[str, float]:
    """Run the task's grade() in a child process against `workspace`; raise GradingError on failure."""
    try:
        answer = fork_grade({"code": task.grader, "transcript": transcript, "workspace": str(workspace)}, timeout)
    except ForkError as e:
        raise GradingError(f"grade() {e}") from None
    if not answer["ok"]:
        raise GradingError(f"grade() failed: {answer['error']}")
    return answer["scores"]


@dataclass(frozen=True)
class Reward:
    reward: float
    graded: dict  # part -> {"weight", "score"} or NOT_GRADED


def combine(task: Task, scores: dict[str, float], judge_score: float | None = None) -> Reward:
    """The weighted mean of the graded parts; the judge part counts only when a judge scored it."""
    automated = sum(scores.values()) / len(scores) if scores else 0.0
    part_scores = {"automated": automated, "llm_judge": judge_score}
    graded: dict = {}
    total = weight_sum = 0.0
    for part, weight in task.weights.items():
        score = part_scores.get(part)
        if score is None:
            graded[part] = NOT_GRADED
            continue
        graded[part] = {"weight": weight, "score": score}
        total += weight * score
        weight_sum += weight
    reward = total / weight_sum if weight_sum else automated
    return Reward(reward=min(1.0, max(0.0, reward)), graded=graded)
