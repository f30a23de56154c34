"""A web task's checks, evaluated against one finished rollout: what `web.py` grades with, in a child process.

The checks are Python expressions written in the task file, so they run
where QwenClawBench's `grade()` runs: in a child forked for the grade
(`grading.grade_workspace`), with a time limit. They see:

* each app's state by its name (`shop`, `travel`): what its
  `/__forge/state` endpoint returned after the harness exited;
* `answer`: the harness's final answer ("" when it gave none);
* `actions`: the recorded trajectory's browser actions in order, from every
  recorded model call's answer, each `{"name", "arguments"}` (tool calls, and
  browser-use's JSON `action` items);
* `steps`: how many model calls acted (answered with at least one action).

Two kinds of check (WebVoyager's answer match and Online-Mind2Web's final-state
match): `answer_includes = EXPR` scores the share of the values EXPR
computes from the app's data (one value or a list) that the answer
contains (text case- and space-insensitively, numbers by value, `$1,234.50`
as 1234.5); `expect = EXPR` scores a truth value (1/0) or a number in [0, 1].
"""

from __future__ import annotations

import re

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _plain(text: str) -> str:
    return " ".join(text.lower().split())


def numbers_in(text: str) -> list[float]:
    return [float(m.replace(",", "")) for m in NUMBER.findall(text)]


def contains(answer: str, value: object) -> bool:
    """Whether the answer states `value`: a number by value, anything else as text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return any(abs(n - value) < 0.005 for n in numbers_in(answer))
    return _plain(str(value)) in _plain(answer)


def _score(check: dict, scope: dict) -> float:
    if "answer_includes" in check:
        expected = eval(check["answer_includes"], scope)  # noqa: S307 - the task's own check, in the grading child
        values = expected if isinstance(expected, (list, tuple)) else [expected]
        return sum(contains(scope["answer"], v) for v in values) / len(values) if values else 0.0
    value = eval(check["expect"], scope)  # noqa: S307
    return min(1.0, max(0.0, float(value)))


def grade(run: dict, workspace_path: str) -> dict[str, float]:
    """Per-check scores; `run` holds `checks`, `state` ({app: state}), `answer`, `actions`, `steps`."""
    scope = {**run["state"], "answer": run["answer"] or "", "actions": run["actions"], "steps": run["steps"],
             "contains": contains, "numbers_in": numbers_in}
    return {check["name"]: _score(check, scope) for check in run["checks"]}
