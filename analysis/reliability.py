"""pass@k and pass^k: the unbiased estimators over n attempts of which c passed.

One implementation for the whole project: `forge-run`'s final table, the
analysis views and the report all call these. A run passes only at reward 1.0
(QwenClawBench's rule), and infra failures are not attempts.
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


def pass_pow_k(n: int, c: int, k: int) -> float:
    """Probability that all k attempts drawn without replacement pass (pass^k): C(c,k)/C(n,k)."""
    _check(n, c, k)
    return comb(c, k) / comb(n, k)
