"""`--solve-rate MIN:MAX`: keep the sessions of tasks the policy solves sometimes, not never or always.

RL learns nothing from a task every rollout passes or every rollout fails
(all advantages are zero), so training sets are cut to tasks whose pass
rate lies in a band. A pass rate belongs to one policy in one harness: it is
a row of the dataset's `task_pass_rates` (defined once, in
`forgerl.schema.attempts`; `forge-analyze pass-rates` prints the same rows):
passed / scored attempts per task, harness, model and policy version (infra
errors are not attempts; `passed` is each benchmark's own pass rule). By
default a session is judged by its task's rate in the session's own scope
(the harness, model and policy version of its outcome). `--solve-rate-harness`,
`--solve-rate-model` and `--solve-rate-policy` name a part of the scope
instead, e.g. to keep the prompts a strong model recorded by how often the
policy being trained solves them in the harness it trains in. The other
filters (`--since`, `--harness`, ...) choose sessions, not the attempts a rate
counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from forgerl.errors import UserError
from forgerl.schema import duck
from forgerl.schema.attempts import Scope, pass_rate_rows, register

# A session's own scope: the harness, model and policy version its outcome row was placed in. A session has one
# (`converters/joins.py` refuses a dataset where it has several that differ); the QUALIFY keeps one of exact repeats.
SESSION_SCOPES = """
SELECT session_id, harness, model, policy_version FROM outcome_scopes
QUALIFY row_number() OVER (PARTITION BY session_id ORDER BY attempt DESC NULLS LAST) = 1
"""

Key = tuple[str, str, str, str]  # task, harness, model, policy version


@dataclass(frozen=True)
class SolveRate:
    low: float
    high: float
    scope: Scope = Scope()

    @classmethod
    def parse(cls, text: str, scope: Scope = Scope()) -> SolveRate:
        """`MIN:MAX`, two rates in [0, 1] with MIN <= MAX (e.g. `0.1:0.9`); UserError otherwise."""
        low, sep, high = text.partition(":")
        try:
            band = cls(float(low), float(high), scope) if sep else None
        except ValueError:
            band = None
        if band is None or not 0.0 <= band.low <= band.high <= 1.0:
            raise UserError(f"--solve-rate expects MIN:MAX with 0 <= MIN <= MAX <= 1 (e.g. 0.1:0.9), got {text!r}")
        return band

    def __contains__(self, rate: float) -> bool:
        return self.low <= rate <= self.high


@dataclass(frozen=True)
class PassRates:
    """The dataset's task pass rates and each graded session's own scope, read once per run."""

    rates: dict[Key, float] = field(default_factory=dict)
    sessions: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    def rate(self, session_id: str, task: str | None, scope: Scope) -> float | None:
        """The pass rate of the session's task in `scope` (its parts left None: the session's own), or None
        when that scope holds no scored attempt of the task."""
        own = self.sessions.get(session_id)
        if task is None or own is None:
            return None
        harness, model, policy = own
        return self.rates.get((task, scope.harness or harness, scope.model or model, scope.policy_version or policy))


def pass_rates(root: Path, scope: Scope) -> PassRates:
    """The `task_pass_rates` rows in `scope` (UserError when it has none) and every session's own scope."""
    con = register(duck.connect(root))
    try:
        try:
            rows = pass_rate_rows(con, scope)
        except UserError as e:
            raise UserError(f"--solve-rate: {e}") from None
        sessions = {sid: (harness, model, policy) for sid, harness, model, policy in con.sql(SESSION_SCOPES).fetchall()}
    except duckdb.Error as e:
        raise UserError(f"{root}: cannot read the outcomes for --solve-rate: {str(e).splitlines()[0]}") from None
    finally:
        con.close()
    return PassRates({(r["task"], r["harness"], r["model"], r["policy_version"]): r["pass_rate"] for r in rows},
                     sessions)
