"""pass@k and pass^k: the unbiased estimators over n attempts of which c passed.

One implementation for the whole project: `forge-run`'s final table, the
analysis views and the report all call these. Whether a run passed is the
benchmark's rule (QwenClawBench: reward 1.0; ClawEval: task score >= 0.75),
decided per outcome row; infra failures are not attempts, except that
ClawEval counts a task's missing trials as failed (`counting_missing`).
"""

from __future__ import annotations

from math import comb


def _check(n: int, c: int, k: int) -> None:
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k attempts drawn without replacement passes: 1 - C(n-c,k)/C(n,k)."""
    _check(n, c, k)
    return 1.0 - comb(n - c, k) / comb(n, k)


def counting_missing(n: int, k: int) -> int:
    """Attempts when a task's missing trials count as failed ones (ClawEval's `score_summary.py` pads each task to
    its expected trials with score 0): at least k."""
    return max(n, k)


def pass_pow_k(n: int, c: int, k: int) -> float:
    """Probability that all k attempts drawn without replacement pass (pass^k): C(c,k)/C(n,k)."""
    _check(n, c, k)
    return comb(c, k) / comb(n, k)
