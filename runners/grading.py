"""Grading a rollout: run the task's `grade()` and turn its scores into a reward.

`grade()` is arbitrary Python from a task file, so it runs in a child process
of its own (forked from a warm server, `forkserver.py`) with the workspace as
its working directory and a time limit: a grader that hangs or crashes
cannot take the runner with it. The local runner and the
Kubernetes pod entry both call `grade_workspace`, so a task is graded the same
way wherever it ran. A grade() that reads files alone (`reads_transcript`) is
run by the rollout's jail instead, once the harness has ended and nothing it
started is left (`Task.jail_grader`): the same call, with the harness's
confinement (no network but the recorder, its cgroup), and no process of its
own; `scores_of` reads either answer.

Scoring follows QwenClawBench (`scripts/lib_grading.py`): the automated score
is the plain mean of the values `grade()` returns; a hybrid task weights its
automated and judge parts by `grading_weights`. Parts that were not graded
(the LLM judge, when no judge is configured) are left out of the weighted
mean and recorded as "not graded", so without a judge the reward is the
automated score itself.
"""

from __future__ import annotations

import ast
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
# Names through which code can reach a function's arguments without naming them (frames, eval).
_INTROSPECTION = frozenset({"eval", "exec", "locals", "vars", "globals", "sys", "inspect", "__import__",
                            "builtins"})


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
    jail_grade: dict | None = None  # grade()'s answer when the jail ran it after the harness (`Task.jail_grader`)
    judge: Judge | None = None  # for the LLM-judged parts of a grade; None: they are reported as not graded

    @cached_property
    def messages(self) -> list[Message]:
        """The recorded conversation in the schema's canonical model: the input and output of the main thread's
        last call (`transcript.rollout_messages`), not a subagent's or a memory extractor's after it."""
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
    return scores_of(answer)


def scores_of(answer: dict) -> dict[str, float]:
    """The scores in a grade's answer ({"ok", "scores"|"error"}: a grade child's or a jail's); GradingError if it
    failed."""
    if not answer["ok"]:
        raise GradingError(f"grade() failed: {answer['error']}")
    return answer["scores"]


def reads_transcript(code: str) -> bool:
    """Whether grade() may look at its first argument, the transcript; False only when it provably cannot.

    A grader that checks files alone (21 of QwenClawBench's 34 do) is handed an
    empty transcript, so the runner does not read the rollout's calls back for
    it. Provably: the module binds `grade` once, as an undecorated top-level
    `def` with a named first parameter, and nothing in that def names the
    parameter, and nothing in the module names what reaches arguments unnamed
    (`eval`, `locals`, `sys`, ...). Anything else, a syntax error included,
    counts as reading it (the child reports the error).
    """
    try:
        module = ast.parse(code)
    except SyntaxError:
        return True
    bindings = [node for node in ast.walk(module) if _binds_grade(node)]
    if len(bindings) != 1 or not isinstance(bindings[0], ast.FunctionDef) or bindings[0] not in module.body:
        return True
    grade = bindings[0]
    if grade.decorator_list or not (grade.args.posonlyargs or grade.args.args):
        return True
    first = (grade.args.posonlyargs or grade.args.args)[0].arg
    named = {node.id for node in ast.walk(grade) if isinstance(node, ast.Name)}
    return first in named or bool(_named_or_imported(module) & _INTROSPECTION)


def _named_or_imported(module: ast.Module) -> set[str]:
    """Every name the module uses, and every module it imports (`sys` in `from sys import _getframe`)."""
    names: set[str] = set()
    for node in ast.walk(module):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def _binds_grade(node: ast.AST) -> bool:
    """Whether `node` (re)binds the name `grade`: a def, a class, an assignment, an import, a `global`."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == "grade"
    if isinstance(node, ast.Name):
        return node.id == "grade" and isinstance(node.ctx, (ast.Store, ast.Del))
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((alias.asname or alias.name) == "grade" for alias in node.names)
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return "grade" in node.names
    return False


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
