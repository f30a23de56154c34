"""Which graded rollouts count as attempts, and whose they are: the scope a task's pass rate is counted in.

A pass rate says something about one policy in one harness: "solved 2 of 3"
by Claude Code with Sonnet tells nothing about Qwen in OpenCode. So every
outcome row is placed in a scope (harness, model, policy version), taken from
the outcome the runner wrote and, where it left one out, from the session's
own calls (the recorder's harness, the model most of its calls answered with,
the policy version serve mode tagged them with). Infra errors are not
attempts. `forge-analyze`'s `attempts` and `task_pass_rates` views and
`forge-convert --solve-rate` both read these definitions, so the table a user
chooses tasks from and the filter that keeps them count the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from forgerl.errors import UserError

NO_POLICY = "(none)"  # the policy version of outcomes and calls that name none

OUTCOME_SCOPES = f"""
WITH s AS (SELECT session_id, nullif(harness, 'unknown') AS harness, labels FROM sessions),
c AS (
  SELECT session_id, mode(coalesce(model_returned, model_requested)) FILTER (WHERE len(output_refs) > 0) AS model,
         mode(policy_version) AS policy_version
  FROM calls GROUP BY 1)
SELECT o.session_id, o.task_id AS task, coalesce(o.harness, s.harness, 'unknown') AS harness,
       coalesce(o.model, c.model, 'unknown') AS model,
       coalesce(o.policy_version, c.policy_version, '{NO_POLICY}') AS policy_version,
       o.attempt, o.status, o.runner, o.reward, coalesce(o.passed, false) AS passed, s.labels
FROM outcomes o LEFT JOIN s USING (session_id) LEFT JOIN c USING (session_id)
"""

ATTEMPTS = "SELECT * FROM outcome_scopes WHERE status <> 'infra_error'"

TASK_PASS_RATES = """
SELECT task, harness, model, policy_version, count(*) AS n, count(*) FILTER (WHERE passed) AS passed,
       count(*) FILTER (WHERE passed) / count(*) AS pass_rate, avg(reward) AS mean_reward
FROM attempts GROUP BY ALL
"""

# (name, doc, SQL) in dependency order: `forgerl.analysis.views` registers them among its views.
VIEWS: tuple[tuple[str, str, str], ...] = (
    ("outcome_scopes", "every outcome row with its task and scope: harness, model, policy version (from the "
     "outcome, else the session's calls)", OUTCOME_SCOPES),
    ("attempts", "graded rollouts that count as attempts (infra_error excluded), with their scope", ATTEMPTS),
    ("task_pass_rates", "scored attempts n, passed, pass rate and mean reward per task, harness, model and "
     "policy version (forge-analyze pass-rates, forge-convert --solve-rate)", TASK_PASS_RATES),
)


def register(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """Create these views on a connection from `forgerl.schema.duck.connect` (what the converters read)."""
    for name, _doc, sql in VIEWS:
        con.execute(f"CREATE VIEW {name} AS {sql}")
    return con


@dataclass(frozen=True)
class Scope:
    """Whose attempts a pass rate counts: a harness, model and policy version; None is any (or, for
    `forge-convert --solve-rate`, each session's own)."""

    harness: str | None = None
    model: str | None = None
    policy_version: str | None = None

    def __str__(self) -> str:
        return ", ".join(f"{name} {value or 'any'}" for name, value in
                         (("harness", self.harness), ("model", self.model), ("policy version", self.policy_version)))


SHOWN = 8  # scopes a "no scored attempts" error lists

RATES = """
SELECT task, harness, model, policy_version, n, passed, pass_rate, mean_reward FROM task_pass_rates
WHERE task IS NOT NULL AND ($harness IS NULL OR harness = $harness) AND ($model IS NULL OR model = $model)
  AND ($policy IS NULL OR policy_version = $policy)
ORDER BY policy_version, model, harness, task
"""


def pass_rate_rows(con: duckdb.DuckDBPyConnection, scope: Scope = Scope()) -> list[dict]:
    """The `task_pass_rates` rows in `scope` (a connection with these views); UserError if it has none."""
    cur = con.execute(RATES, {"harness": scope.harness, "model": scope.model, "policy": scope.policy_version})
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, r)) for r in cur.fetchall()]
    if not rows:
        known = [k for (k,) in con.execute("SELECT DISTINCT harness || ' / ' || model || ' / ' || policy_version "
                                           "FROM attempts WHERE task IS NOT NULL ORDER BY 1").fetchall()]
        more = f"; {len(known) - SHOWN} more" if len(known) > SHOWN else ""
        raise UserError(f"no scored attempts for {scope} (harness / model / policy version with attempts: "
                        f"{'; '.join(known[:SHOWN]) or 'none'}{more})")
    return rows
