"""Distribution-free statistics for throughput samples (no scipy).

Mann-Whitney U with the exact null distribution for small samples without ties and
the normal approximation (tie- and continuity-corrected) otherwise, and the
Hodges-Lehmann estimate of a shift with its distribution-free confidence interval.
Throughput ratios are shifts of log(tok/s): the HL estimate of the log shift,
exponentiated, is the ratio current/baseline, and its interval comes from the same
U distribution as the test, so the verdict and the interval always agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

EXACT_MAX = 50  # exact distribution up to n + m = 50 (counts stay small integers)


@lru_cache(maxsize=256)
def _u_counts(n: int, m: int) -> tuple[int, ...]:
    """counts[u] = arrangements of n x's and m y's with U = u (x above y pairs)."""
    # f(n, m) = f(n-1, m) shifted by m  +  f(n, m-1): the largest value is an x or a y.
    if n == 0 or m == 0:
        return (1,)
    a, b = _u_counts(n - 1, m), _u_counts(n, m - 1)
    out = [0] * (n * m + 1)
    for u, c in enumerate(a):
        out[u + m] += c
    for u, c in enumerate(b):
        out[u] += c
    return tuple(out)


def u_cdf(u: int, n: int, m: int) -> float:
    """P(U <= u) under the null, exact."""
    counts = _u_counts(n, m)
    total = math.comb(n + m, n)
    return sum(counts[: max(0, u + 1)]) / total


def u_statistic(x: Sequence[float], y: Sequence[float]) -> float:
    """U of x: pairs with x > y, ties counting one half."""
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)


def _normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def mann_whitney_less(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided p-value for "x tends to be smaller than y"."""
    n, m = len(x), len(y)
    if n == 0 or m == 0:
        raise ValueError("Mann-Whitney U needs two non-empty samples")
    u = u_statistic(x, y)
    tied = len(set(x) | set(y)) < n + m
    if not tied and n + m <= EXACT_MAX:
        return u_cdf(int(u), n, m)
    pooled = sorted(list(x) + list(y))
    ties = _tie_groups(pooled)
    N = n + m
    var = n * m / 12.0 * ((N + 1) - sum(t**3 - t for t in ties) / (N * (N - 1)))
    if var <= 0:
        return 1.0  # every value identical: no evidence either way
    z = (u - n * m / 2.0 + 0.5) / math.sqrt(var)  # continuity correction toward the null
    return _normal_cdf(z)


def _tie_groups(values: Sequence[float]) -> list[int]:
    groups, run = [], 1
    for a, b in zip(values, values[1:], strict=False):
        if a == b:
            run += 1
        else:
            groups.append(run)
            run = 1
    groups.append(run)
    return groups


def hodges_lehmann(
    x: Sequence[float], y: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float, float]:
    """(estimate, low, high, achieved confidence) of the shift x - y.

    The interval is [d_(k), d_(nm+1-k)] of the sorted pairwise differences, with k the
    largest integer such that P(U <= k-1) <= (1-confidence)/2. With few samples the
    achieved confidence exceeds the requested one (or, below 3+3 samples, falls short:
    the full range is then returned with its true confidence).
    """
    n, m = len(x), len(y)
    d = sorted(a - b for a in x for b in y)
    mid = len(d) // 2
    est = d[mid] if len(d) % 2 else 0.5 * (d[mid - 1] + d[mid])
    half = (1.0 - confidence) / 2.0
    k = 0
    while k < n * m // 2 and _lower_tail(k, n, m) <= half:
        k += 1
    k = max(k, 1)
    achieved = 1.0 - 2.0 * _lower_tail(k - 1, n, m)
    return est, d[k - 1], d[len(d) - k], achieved


def _lower_tail(u: int, n: int, m: int) -> float:
    if n + m <= EXACT_MAX:
        return u_cdf(u, n, m)
    mu, sd = n * m / 2.0, math.sqrt(n * m * (n + m + 1) / 12.0)
    return _normal_cdf((u + 0.5 - mu) / sd)


def log_ratio(
    current: Sequence[float], baseline: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float, float]:
    """Ratio current/baseline of positive samples: (estimate, low, high, confidence)."""
    if min(current) <= 0 or min(baseline) <= 0:
        raise ValueError("throughput samples must be positive")
    est, lo, hi, conf = hodges_lehmann(
        [math.log(v) for v in current], [math.log(v) for v in baseline], confidence
    )
    return math.exp(est), math.exp(lo), math.exp(hi), conf


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    if not s:
        raise ValueError("median of an empty sample")
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])
