"""Learning curves: pass rate per policy version, per harness, held-out tasks apart from training ones.

Did a policy learn, and does it carry to tasks it never trained on? One
point per (harness, split, policy version): the mean over tasks of each
task's pass rate (passed / scored attempts, the `attempts` view: infra
errors are not attempts), which is `compare`'s pass@1, with its interval
from the same task-level percentile bootstrap (`compare.resample`). The
split is `held-out` (the task set's tasks) and `train` (the others) when a
task set is given, else `all`. Versions run in natural order (v2 before v10);
sessions without a policy version are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import numpy as np

from .compare import Interval, natural_key, percentile_interval, ratio, resample
from .tasksets import TaskSet

HELD_OUT, TRAIN, ALL = "held-out", "train", "all"

_TASK_PASSES = """
SELECT harness, policy_version, task, count(*) AS n, count(*) FILTER (WHERE passed) AS c FROM attempts
WHERE task IS NOT NULL AND policy_version <> '(none)' GROUP BY ALL
"""


@dataclass(frozen=True)
class Point:
    """One harness's pass rate at one policy version on one split of the tasks."""

    harness: str
    split: str
    policy_version: str
    tasks: int
    attempts: int
    passed: int
    pass_rate: float
    interval: Interval | None

    def as_dict(self) -> dict:
        ci = None if self.interval is None else [self.interval.low, self.interval.high]
        return {"harness": self.harness, "split": self.split, "policy_version": self.policy_version,
                "tasks": self.tasks, "attempts": self.attempts, "passed": self.passed, "pass_rate": self.pass_rate,
                "ci": ci}


def split_of(task: str, task_set: TaskSet | None) -> str:
    """`held-out` for a task in the set, `train` for any other; `all` without a set."""
    if task_set is None:
        return ALL
    return HELD_OUT if task in task_set else TRAIN


def pass_rate_curves(con: duckdb.DuckDBPyConnection, task_set: TaskSet | None = None, *, confidence: float = 0.95,
                     resamples: int = 2000, seed: int = 0) -> list[Point]:
    """Every (harness, split, policy version) with graded attempts, ordered by harness, split (held-out first),
    then version in natural order."""
    cells: dict[tuple[str, str, str], list[tuple[int, int]]] = {}
    for harness, version, task, n, c in con.execute(_TASK_PASSES).fetchall():
        cells.setdefault((harness, split_of(task, task_set), version), []).append((n, c))
    points = []
    for (harness, split, version), counts in cells.items():
        n, c = (np.array(col, dtype=float) for col in zip(*counts))
        rates, ones = c / n, np.ones(len(counts))
        interval = percentile_interval(ratio(rates, ones, resample(len(counts), resamples, seed)), confidence)
        points.append(Point(harness, split, version, len(counts), int(n.sum()), int(c.sum()),
                            float(rates.mean()), interval))
    order = {HELD_OUT: 0, TRAIN: 1, ALL: 2}
    return sorted(points, key=lambda p: (p.harness, order[p.split], natural_key(p.policy_version)))
