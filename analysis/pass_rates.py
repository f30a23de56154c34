"""Per-task pass rates for a policy version: which tasks it solves never, sometimes, always.

RL learns from tasks a policy solves sometimes (a group of rollouts with
mixed outcomes has non-zero advantages), so this is the table to choose
training tasks from (then `forge-convert --solve-rate MIN:MAX`). The rate is
passed / scored attempts per task, harness, model and policy version (the
`task_pass_rates` view, defined once in `forgerl.schema.attempts`, which
`forge-convert --solve-rate` reads too: infra errors are not attempts;
`passed` is each benchmark's own pass rule). `forge-analyze pass-rates`
prints it from a dataset, `forge-run` at the end of a round.
"""

from __future__ import annotations

from collections import Counter

from rich.table import Table

from forgerl import printer


def solved(n: int, passed: int) -> str:
    """never / sometimes / always: what a task's attempts say about the policy."""
    return "never" if passed == 0 else "always" if passed == n else "sometimes"


def summary(rows: list[dict]) -> str:
    """One line: how many tasks are solved never, sometimes, always."""
    bands = Counter(solved(r["n"], r["passed"]) for r in rows)
    return (f"{len(rows)} task rows: {bands['never']} never solved, {bands['sometimes']} sometimes, "
            f"{bands['always']} always")


def rates_table(rows: list[dict], title: str) -> Table:
    """The rows as a table: task, harness, model, policy version, attempts, passed, pass rate, solved."""
    headers = ["task", "harness", "model", "policy", "n", "passed", "pass rate", "mean reward", "solved"]
    body = [[r["task"], r["harness"], r["model"], r["policy_version"], r["n"], r["passed"], f"{r['pass_rate']:.3f}",
             "-" if r["mean_reward"] is None else f"{r['mean_reward']:.3f}", solved(r["n"], r["passed"])]
            for r in rows]
    return printer.table(headers, body, title=title, caption=summary(rows),
                         left={"task", "harness", "model", "policy", "solved"})
