"""`--solve-rate MIN:MAX`: keep the sessions of tasks the policy solves sometimes, not never or always.

RL learns nothing from a task every rollout passes or every rollout fails
(all advantages are zero), so training sets are cut to tasks whose pass
rate lies in a band. A task's pass rate is its passed attempts over its
scored attempts in the dataset's `outcomes` (infra errors are not attempts;
`passed` is each benchmark's own pass rule, as the runners wrote it), over
every harness and policy version the dataset holds; the other filters
(`--since`, `--harness`, ...) choose sessions, not the attempts a rate counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb

from forgerl.errors import UserError
from forgerl.schema import duck

RATES = """
SELECT task_id, count(*) FILTER (WHERE passed) / count(*) AS rate
FROM outcomes WHERE status <> 'infra_error' AND task_id IS NOT NULL GROUP BY task_id
"""


@dataclass(frozen=True)
class SolveRate:
    low: float
    high: float

    @classmethod
    def parse(cls, text: str) -> SolveRate:
        """`MIN:MAX`, two rates in [0, 1] with MIN <= MAX (e.g. `0.1:0.9`); UserError otherwise."""
        low, sep, high = text.partition(":")
        try:
            band = cls(float(low), float(high)) if sep else None
        except ValueError:
            band = None
        if band is None or not 0.0 <= band.low <= band.high <= 1.0:
            raise UserError(f"--solve-rate expects MIN:MAX with 0 <= MIN <= MAX <= 1 (e.g. 0.1:0.9), got {text!r}")
        return band

    def __contains__(self, rate: float) -> bool:
        return self.low <= rate <= self.high


def task_pass_rates(root: Path) -> dict[str, float]:
    """Each task's pass rate over its scored attempts in the dataset."""
    con = duck.connect(root)
    try:
        return dict(con.sql(RATES).fetchall())
    except duckdb.Error as e:
        raise UserError(f"{root}: cannot read the outcomes for --solve-rate: {str(e).splitlines()[0]}") from None
    finally:
        con.close()
