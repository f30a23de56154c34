"""Per-task pass rates for a policy version: which tasks it solves never, sometimes, always.

RL learns from tasks a policy solves sometimes (a group of rollouts with
mixed outcomes has non-zero advantages), so this is the table to choose
training tasks from (then `forge-convert --solve-rate MIN:MAX`). The rate is
passed / scored attempts (the `attempts` view: infra errors are not
attempts; `passed` is each benchmark's own pass rule). `forge-analyze
pass-rates` prints it from a dataset, `forge-run` at the end of a round.
"""

from __future__ import annotations

from collections import Counter

import duckdb

from forgerl.errors import UserError

QUERY = """
SELECT task, harness, policy_version, n, passed, passed / n AS pass_rate, mean_reward FROM task_pass_rates
WHERE ($policy IS NULL OR policy_version = $policy) AND ($harness IS NULL OR harness = $harness)
ORDER BY policy_version, harness, task
"""


def solved(n: int, passed: int) -> str:
    """never / sometimes / always: what a task's attempts say about the policy."""
    return "never" if passed == 0 else "always" if passed == n else "sometimes"


def pass_rate_rows(con: duckdb.DuckDBPyConnection, policy_version: str | None = None,
                   harness: str | None = None) -> list[dict]:
    """Rows of the `task_pass_rates` view, for one policy version and harness if given; UserError if none match."""
    cur = con.execute(QUERY, {"policy": policy_version, "harness": harness})
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, r)) for r in cur.fetchall()]
    if not rows and (policy_version is not None or harness is not None):
        known = sorted({v for (v,) in con.execute("SELECT DISTINCT policy_version FROM attempts").fetchall()})
        raise UserError(f"no scored attempts for policy version {policy_version or 'any'} and harness "
                        f"{harness or 'any'} (policy versions: {', '.join(known) or 'none'})")
    return rows


def summary(rows: list[dict]) -> str:
    """One line: how many tasks are solved never, sometimes, always."""
    bands = Counter(solved(r["n"], r["passed"]) for r in rows)
    return (f"{len(rows)} task rows: {bands['never']} never solved, {bands['sometimes']} sometimes, "
            f"{bands['always']} always")


def rates_table(rows: list[dict], title: str):
    """The rows as a rich table: task, harness, policy version, attempts, passed, pass rate, solved."""
    from rich.table import Table

    table = Table(title=title, title_justify="left", caption=summary(rows), caption_justify="left")
    for name in ("task", "harness", "policy", "n", "passed", "pass rate", "mean reward", "solved"):
        table.add_column(name, justify="left" if name in ("task", "harness", "policy", "solved") else "right",
                         no_wrap=True)
    for r in rows:
        mean = "-" if r["mean_reward"] is None else f"{r['mean_reward']:.3f}"
        table.add_row(r["task"], r["harness"], r["policy_version"], str(r["n"]), str(r["passed"]),
                      f"{r['pass_rate']:.3f}", mean, solved(r["n"], r["passed"]))
    return table


def print_table(rows: list[dict], title: str, file=None) -> None:
    """Print `rates_table` (the one printer `forge-analyze pass-rates` and `forge-run` share)."""
    from rich.console import Console

    Console(width=200, file=file).print(rates_table(rows, title))
