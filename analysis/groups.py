"""What sessions can be grouped and compared by, and the per-group aggregate SQL over any of them.

A grouping column is one of the fixed session columns (`FIXED`: harness,
model, task, policy version), an outcome column (`OUTCOME`: the graded
rollout's status, runner, attempt, passed, reward) or a key of the sessions'
`labels` (what `forge-record --labels` stamped). `column` turns its name into
one SQL expression that reads the same in the `session_groups` and
`attempts` views, so behaviour metrics and pass@k group alike.
"""

from __future__ import annotations

import duckdb

from forgerl.errors import UserError

FIXED: tuple[str, ...] = ("harness", "model", "task", "policy_version")
OUTCOME: tuple[str, ...] = ("status", "runner", "attempt", "passed", "reward")


def _lit(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def label_keys(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The label keys any session of the dataset carries, sorted."""
    rows = con.execute("SELECT DISTINCT unnest(json_keys(labels)) FROM sessions "
                       "WHERE labels IS NOT NULL AND json_type(labels) = 'OBJECT' ORDER BY 1").fetchall()
    return [r[0] for r in rows]


def choices(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Every name `column` accepts on this dataset: fixed, outcome, then label keys not shadowed by those."""
    return [*FIXED, *OUTCOME, *(k for k in label_keys(con) if k not in FIXED + OUTCOME)]


def column(con: duckdb.DuckDBPyConnection, by: str, flag: str = "--by") -> str:
    """The SQL expression of grouping column `by` (UserError naming the choices if the dataset has no such column)."""
    if by in FIXED or by in OUTCOME:
        return f'"{by}"'
    if by in label_keys(con):
        return f"json_extract_string(labels, {_lit('$.' + chr(34) + by + chr(34))})"
    raise UserError(f"unknown {flag} column {by!r}; choose one of: {', '.join(choices(con))}")


def key(expr: str) -> str:
    """A grouping expression as the text value groups are named by (a session without a value: `(none)`)."""
    return f"coalesce(CAST({expr} AS VARCHAR), '(none)')"


def pass_rows(expr: str) -> str:
    """A CTE body: attempts n and passes c per group value and task (and harness, model, policy version)."""
    return (f"SELECT {key(expr)} AS grp, task, harness, model, policy_version, count(*) AS n, "
            f"count(*) FILTER (WHERE passed) AS c FROM attempts GROUP BY ALL")


def metrics_by(expr: str, name: str) -> str:
    """One row per value of `expr`: every behaviour metric aggregated over that group's sessions, pass@1 per task."""
    return f"""
WITH s AS (
  SELECT grp, count(*) AS sessions, sum(turns) AS turns, sum(tool_calls) AS tool_calls,
         avg(CAST(verified AS DOUBLE)) FILTER (WHERE writes > 0) AS verification_rate,
         avg(verify_latency_turns) AS verify_latency_turns,
         sum(recovered_episodes) / nullif(sum(failure_episodes), 0) AS recovery_rate,
         sum(gave_up_episodes) / nullif(sum(failure_episodes), 0) AS give_up_rate,
         sum(turns_to_recover_total) / nullif(sum(recovered_episodes), 0) AS turns_to_recover,
         avg(tool_coverage) AS tool_coverage,
         sum(plan_completed) / nullif(sum(plan_items), 0) AS plan_completion,
         sum(human_turns) AS human_turns, sum(harness_turns) AS harness_turns,
         sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens,
         sum(cache_read_tokens) AS cache_read_tokens, sum(cache_write_tokens) AS cache_write_tokens,
         sum(cost_usd) AS cost_usd
  FROM session_metrics JOIN (SELECT session_id, {key(expr)} AS grp FROM session_groups) USING (session_id)
  GROUP BY 1),
p AS (SELECT grp, avg(c / n) AS pass_at_1 FROM ({pass_rows(expr)}) GROUP BY 1)
SELECT s.grp AS "{name}", s.* EXCLUDE (grp), p.pass_at_1 FROM s LEFT JOIN p USING (grp) ORDER BY 1
"""


def pass_curve_by(expr: str, name: str) -> str:
    """Mean pass@k and pass^k per group value; k runs to the fewest attempts any of the group's tasks has, so every
    point averages the same tasks."""
    return f"""
WITH r AS ({pass_rows(expr)}),
g AS (SELECT *, min(n) OVER (PARTITION BY grp) AS max_k FROM r)
SELECT grp AS "{name}", k, avg(pass_at_k(n, c, k)) AS pass_at_k, avg(pass_pow_k(n, c, k)) AS pass_pow_k,
       count(*) AS tasks
FROM (SELECT *, unnest(range(1, max_k + 1)) AS k FROM g) GROUP BY ALL ORDER BY 1, 2
"""
