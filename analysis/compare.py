"""Two slices of a dataset compared per task, with paired bootstrap confidence intervals.

`forge-analyze compare DATASET --a policy_version=v1 --b policy_version=v5`
selects sessions by any grouping column (`groups.py`) and compares them on
the tasks both sides attempted. Method (also in analysis/README.md):

- Every metric is a ratio of task-level sums: a behaviour rate pools its
  numerator and denominator over a side's sessions of a task (verified /
  sessions with writes, recovered / failure episodes, ...); pass@k and pass^k
  are the unbiased per-task estimators, averaged over tasks.
- Paired task-level resampling: draw the common tasks with replacement (the
  same draw for both sides, so task difficulty cancels in the difference),
  recompute each side's metric and the difference B - A; repeat
  `resamples` times from a seeded generator.
- The interval is the percentile interval of those replicates at the
  requested confidence. Replicates whose draw leaves a metric undefined (no
  sessions with writes, no failure episodes) are left out, and the interval
  is undefined when fewer than half remain.

A task set (`tasksets.TaskSet`, `--task-ids` / `--task-glob`) restricts both
sides to its tasks (held-out tasks, say); `where` restricts both to one value
of other columns, which is how `compare_per` compares within each harness.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import duckdb
import numpy as np

from forgerl.errors import UserError

from . import groups
from .reliability import pass_at_k, pass_pow_k
from .tasksets import TaskSet

# (metric, what it is, numerator column, denominator column) of the per-task sums `_task_sums` computes.
RATES: tuple[tuple[str, str, str, str], ...] = (
    ("verification_rate", "sessions that checked after their last write / sessions with writes", "verified", "written"),
    ("verify_latency_turns", "turns from last write to check, mean over verified sessions", "latency", "verified"),
    ("recovery_rate", "failure episodes recovered / episodes", "recovered", "episodes"),
    ("give_up_rate", "failure episodes given up / episodes", "gave_up", "episodes"),
    ("turns_to_recover", "turns to recover, mean over recovered episodes", "to_recover", "recovered"),
    ("tool_coverage", "tools used / offered, mean over sessions offered tools", "coverage", "offered"),
    ("plan_completion", "plan items completed / items", "plan_completed", "plan_items"),
    ("turns", "model turns per session", "turns", "sessions"),
    ("cost_usd", "list-price cost per session", "cost", "sessions"),
)

_TASK_SUMS = """
SELECT task, count(*) AS sessions,
       count(*) FILTER (WHERE writes > 0) AS written, count(*) FILTER (WHERE verified) AS verified,
       coalesce(sum(verify_latency_turns), 0) AS latency,
       sum(failure_episodes) AS episodes, sum(recovered_episodes) AS recovered, sum(gave_up_episodes) AS gave_up,
       sum(turns_to_recover_total) AS to_recover,
       coalesce(sum(tool_coverage), 0) AS coverage, count(tool_coverage) AS offered,
       sum(plan_completed) AS plan_completed, sum(plan_items) AS plan_items,
       sum(turns) AS turns, sum(cost_usd) AS cost
FROM session_metrics JOIN (SELECT session_id FROM session_groups WHERE {where}) USING (session_id)
GROUP BY task
"""
_TASK_PASSES = """
SELECT task, count(*) AS n, count(*) FILTER (WHERE passed) AS c FROM attempts
WHERE {where} GROUP BY task
"""


@dataclass(frozen=True)
class Side:
    """`column=value`: the sessions one side of a comparison holds."""

    column: str
    value: str

    @classmethod
    def parse(cls, text: str, flag: str) -> Side:
        column, sep, value = text.partition("=")
        if not sep or not column or not value:
            raise UserError(f"{flag} {text!r}: expected COLUMN=VALUE, e.g. policy_version=v1")
        return cls(column, value)

    def __str__(self) -> str:
        return f"{self.column}={self.value}"


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


@dataclass
class Row:
    """One metric of a comparison: each side's value and the difference B - A, each with its interval."""

    metric: str
    doc: str
    tasks: int
    a: float
    b: float
    delta: float
    a_ci: Interval | None
    b_ci: Interval | None
    delta_ci: Interval | None

    def as_dict(self) -> dict:
        """JSON-ready: an undefined value (NaN) or interval is null."""
        def ci(i: Interval | None) -> list[float] | None:
            return None if i is None else [i.low, i.high]

        def num(v: float) -> float | None:
            return None if v != v else v
        return {"metric": self.metric, "tasks": self.tasks, "a": num(self.a), "b": num(self.b),
                "delta": num(self.delta), "a_ci": ci(self.a_ci), "b_ci": ci(self.b_ci), "delta_ci": ci(self.delta_ci)}


@dataclass
class Comparison:
    a: Side
    b: Side
    confidence: float
    resamples: int
    seed: int
    tasks: list[str]
    rows: list[Row]
    task_set: TaskSet | None = None
    where: tuple[Side, ...] = ()

    def row(self, metric: str) -> Row | None:
        """The row of `metric` (None when the comparison has none, e.g. pass@1 without graded tasks)."""
        return next((r for r in self.rows if r.metric == metric), None)

    def as_dict(self) -> dict:
        """JSON-ready: the sides, tasks, method and every metric."""
        return {"a": str(self.a), "b": str(self.b), "where": [str(w) for w in self.where],
                "task_set": None if self.task_set is None else str(self.task_set), "tasks": self.tasks,
                "confidence": self.confidence, "resamples": self.resamples, "seed": self.seed,
                "method": "paired task-level bootstrap, percentile", "metrics": [r.as_dict() for r in self.rows]}


def resample(units: int, resamples: int, seed: int) -> np.ndarray:
    """`resamples` draws of `units` indices with replacement (one row per replicate), from a seeded generator."""
    return np.random.default_rng(seed).integers(0, units, size=(resamples, units))


def ratio(num: np.ndarray, den: np.ndarray, draws: np.ndarray | None = None) -> np.ndarray | float:
    """sum(num) / sum(den) over all units, or per replicate of `draws` (NaN where the denominator is 0)."""
    if draws is None:
        total = den.sum()
        return float(num.sum() / total) if total else float("nan")
    n, d = num[draws].sum(axis=1), den[draws].sum(axis=1)
    out = np.full(len(draws), np.nan)
    np.divide(n, d, out=out, where=d != 0)
    return out


def percentile_interval(replicates: np.ndarray, confidence: float) -> Interval | None:
    """The central `confidence` share of the defined replicates; None when fewer than half are defined."""
    defined = replicates[~np.isnan(replicates)]
    if len(defined) < len(replicates) / 2:
        return None
    alpha = (1 - confidence) / 2
    low, high = np.quantile(defined, [alpha, 1 - alpha])
    return Interval(float(low), float(high))


def paired(num_a: np.ndarray, den_a: np.ndarray, num_b: np.ndarray, den_b: np.ndarray, draws: np.ndarray,
           confidence: float) -> tuple[float, float, float, Interval | None, Interval | None, Interval | None]:
    """Point values of A, B and B - A, and their percentile intervals over the same task draws."""
    a, b = ratio(num_a, den_a), ratio(num_b, den_b)
    ra, rb = ratio(num_a, den_a, draws), ratio(num_b, den_b, draws)
    return (a, b, b - a, percentile_interval(ra, confidence), percentile_interval(rb, confidence),
            percentile_interval(rb - ra, confidence))


def _fetch(con: duckdb.DuckDBPyConnection, sql: str, sides: tuple[Side, ...],
           task_set: TaskSet | None) -> dict[str, dict]:
    """Per-task rows of the sessions (or attempts) that have every one of `sides`, on `task_set`'s tasks."""
    where = " AND ".join(f"{groups.key(groups.column(con, s.column))} = ?" for s in sides)
    cur = con.execute(sql.format(where=where), [s.value for s in sides])
    names = [d[0] for d in cur.description]
    return {row[0]: dict(zip(names, row)) for row in cur.fetchall() if task_set is None or row[0] in task_set}


def compare(con: duckdb.DuckDBPyConnection, a: Side, b: Side, *, confidence: float = 0.95, resamples: int = 2000,
            seed: int = 0, task_set: TaskSet | None = None, where: tuple[Side, ...] = ()) -> Comparison:
    """Compare sides `a` and `b` (both narrowed to `where` and `task_set`) over the tasks both hold (UserError if
    they share none)."""
    _check(con, a, b, tuple(w.column for w in where), confidence, resamples)
    sums_a, sums_b = (_fetch(con, _TASK_SUMS, (s, *where), task_set) for s in (a, b))
    scope = "".join(f" and {w}" for w in where) + ("" if task_set is None else f" on {task_set}")
    for side, sums in ((a, sums_a), (b, sums_b)):
        if not sums:
            raise UserError(f"no sessions have {side}{scope}")
    tasks = sorted(sums_a.keys() & sums_b.keys())
    if not tasks:
        raise UserError(f"{a} and {b} share no task{scope}, so there is nothing to pair")
    draws = resample(len(tasks), resamples, seed)
    rows = []
    for metric, doc, num, den in RATES:
        cols = [np.array([float(s[t][c] or 0) for t in tasks]) for s in (sums_a, sums_b) for c in (num, den)]
        rows.append(Row(metric, doc, len(tasks), *paired(*cols, draws, confidence)))
    passes_a, passes_b = (_fetch(con, _TASK_PASSES, (s, *where), task_set) for s in (a, b))
    rows += _pass_rows(passes_a, passes_b, tasks, resamples, seed, confidence)
    return Comparison(a, b, confidence, resamples, seed, tasks, rows, task_set, where)


def _check(con: duckdb.DuckDBPyConnection, a: Side, b: Side, per: tuple[str, ...], confidence: float,
           resamples: int) -> None:
    """UserError for an interval setting out of range or a column the dataset lacks (naming the flag)."""
    if not 0 < confidence < 1:
        raise UserError(f"--confidence must be between 0 and 1, got {confidence}")
    if resamples < 100:
        raise UserError(f"--resamples must be at least 100, got {resamples}")
    for flag, name in (("--a", a.column), ("--b", b.column), *(("--per", c) for c in per)):
        groups.column(con, name, flag)  # an unknown column: UserError naming the flag and the choices


def compare_per(con: duckdb.DuckDBPyConnection, a: Side, b: Side, per: str, *, confidence: float = 0.95,
                resamples: int = 2000, seed: int = 0, task_set: TaskSet | None = None) -> \
        tuple[list[Comparison], list[str]]:
    """`compare` within each value of column `per` (each harness, say), in natural order; a value on which the
    two sides cannot be paired is left out and said in the notes (UserError if every value is)."""
    _check(con, a, b, (per,), confidence, resamples)
    expr = groups.key(groups.column(con, per))
    sides = " OR ".join(f"{groups.key(groups.column(con, s.column))} = ?" for s in (a, b))
    values = [r[0] for r in con.execute(f"SELECT DISTINCT {expr} FROM session_groups WHERE {sides}",
                                        [a.value, b.value]).fetchall()]
    done, notes = [], []
    for value in sorted(values, key=natural_key):
        try:
            done.append(compare(con, a, b, confidence=confidence, resamples=resamples, seed=seed,
                                task_set=task_set, where=(Side(per, value),)))
        except UserError as e:  # this value lacks a side or a shared task: the others still compare
            notes.append(f"{per}={value}: {e}")
    if not done:
        raise UserError(f"no {per} has both sides to pair: {'; '.join(notes)}")
    return done, notes


def _pass_rows(passes_a: dict[str, dict], passes_b: dict[str, dict], tasks: list[str], resamples: int, seed: int,
               confidence: float) -> list[Row]:
    """pass@k and pass^k for k up to the fewest attempts of any task graded on both sides."""
    graded = [t for t in tasks if t in passes_a and t in passes_b]
    if not graded:
        return []
    draws = resample(len(graded), resamples, seed)
    ones = np.ones(len(graded))
    rows = []
    for k in range(1, min(p[t]["n"] for p in (passes_a, passes_b) for t in graded) + 1):
        for name, fn in ((f"pass@{k}", pass_at_k), (f"pass^{k}", pass_pow_k)):
            va, vb = (np.array([fn(p[t]["n"], p[t]["c"], k) for t in graded]) for p in (passes_a, passes_b))
            doc = f"{'at least one' if fn is pass_at_k else 'all'} of {k} attempts pass, mean over tasks"
            rows.append(Row(name, doc, len(graded), *paired(va, ones, vb, ones, draws, confidence)))
    return rows


def natural_key(value: str) -> tuple:
    """Sort key that puts v2 before v10 (digit runs compare as numbers)."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", value) if part)


def policy_versions(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The dataset's policy versions in natural order (sessions without one left out)."""
    rows = con.execute("SELECT DISTINCT policy_version FROM session_groups WHERE policy_version <> '(none)'").fetchall()
    return sorted((r[0] for r in rows), key=natural_key)


def learning_curves(con: duckdb.DuckDBPyConnection, over: str = "policy_version",
                    per: str = "harness") -> list[dict]:
    """Every behaviour metric and pass@1 per (`per`, `over`) value: how each harness's behaviour moves across
    policy versions. Rows ordered by `per`, then `over` in natural order."""
    both = " || chr(31) || ".join(groups.key(groups.column(con, c)) for c in (per, over))
    cur = con.execute(groups.metrics_by(both, "key"))
    names = [d[0] for d in cur.description]
    out = []
    for row in cur.fetchall():
        rec = dict(zip(names, row))
        rec[per], rec[over] = rec.pop("key").split(chr(31), 1)
        out.append(rec)
    return sorted(out, key=lambda r: (r[per], natural_key(r[over])))
