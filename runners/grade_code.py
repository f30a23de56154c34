"""A task's grade() source run on a workspace: what the grading child (or a rollout's jail, for a grade() that reads
files alone) does, and nothing it does not need.

Both are forked from the same warm fork server (`forkserver.py`), which is
small because nothing it imports pulls in pyarrow: a fork copies its
parent's page tables and every page the child writes, so grading from a 90
MB parent cost twice the CPU. Keep this module's imports to the standard
library.
"""

from __future__ import annotations


class GradingError(RuntimeError):
    """grade() raised, hung, or returned something that is not {name: number}."""


def run_grade(code: str, transcript: list, workspace: str) -> dict[str, float]:
    """Execute grader source and call its grade(); in-process (the child of `grading.grade_workspace`, or the jail)."""
    namespace: dict = {"__name__": "forgerl_task_grader"}
    exec(compile(code, "<grade>", "exec"), namespace)  # noqa: S102 - the task's own grader, in a child or the jail
    grade = namespace.get("grade")
    if not callable(grade):
        raise GradingError("the automated checks define no grade() function")
    scores = grade(transcript, workspace)
    if not isinstance(scores, dict):
        raise GradingError(f"grade() returned {type(scores).__name__}, expected a dict")
    out: dict[str, float] = {}
    for name, value in scores.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GradingError(f"grade() score {name!r} is {value!r}, not a number")
        out[str(name)] = float(value)
    return out
