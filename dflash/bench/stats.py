"""Distribution-free statistics of the bench's verdicts, from scipy.stats: the verdict
rule both verdicts apply (`verdict`), the median's interval (`median_interval`, the sign
test's; the paired verdict's and the efficiency bench's), and the stored-number test.

The stored-number test is scipy's Mann-Whitney U (`scipy.stats.mannwhitneyu`): its exact null
distribution for samples without ties, its normal approximation (tie- and
continuity-corrected) otherwise. The ratio is the Hodges-Lehmann estimate of the
shift of log(tok/s) (the median of the pairwise differences), exponentiated, and its
interval comes from inverting the same test: between the sorted pairwise differences
d_(j) and d_(j+1) the U statistic of x - delta against y is n*m - j, so scipy's
p-value there is the null probability P(U <= j) that picks the interval's order
statistics. The verdict and the interval therefore always agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import median as _median

from scipy.stats import binom, mannwhitneyu, quantile_test, wilcoxon

EXACT_MAX = 50  # scipy's exact distribution up to n + m = 50 samples without ties


def _method(x: Sequence[float], y: Sequence[float]) -> str:
    untied = len(set(x) | set(y)) == len(x) + len(y)
    return "exact" if untied and len(x) + len(y) <= EXACT_MAX else "asymptotic"


def mann_whitney_less(x: Sequence[float], y: Sequence[float]) -> float:
    """One-sided p-value for "x tends to be smaller than y"."""
    if not x or not y:
        raise ValueError("Mann-Whitney U needs two non-empty samples")
    if len(set(x) | set(y)) == 1:
        return 1.0  # every value identical: no evidence either way (scipy: nan)
    return float(mannwhitneyu(x, y, alternative="less", method=_method(x, y)).pvalue)


def _lower_tail(j: int, d: list[float], x: Sequence[float], y: Sequence[float]) -> float:
    """P(U <= j) under the null, read from scipy's test at a shift between d_(j) and
    d_(j+1) (below all differences for j = 0)."""
    lo = d[j - 1] if j > 0 else d[0] - 1.0
    hi = d[j] if j < len(d) else lo + 1.0
    delta = 0.5 * (lo + hi)
    shifted = [a - delta for a in x]
    return float(mannwhitneyu(shifted, y, alternative="greater", method=_method(x, y)).pvalue)


def hodges_lehmann(
    x: Sequence[float], y: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float, float]:
    """(estimate, low, high, achieved confidence) of the shift x - y.

    The interval is [d_(k), d_(nm+1-k)] of the sorted pairwise differences, with k the
    largest integer such that P(U <= k-1) <= (1-confidence)/2. With few samples the
    achieved confidence exceeds the requested one (or, below 3+3 samples, falls short:
    the full range is then returned with its true confidence).
    """
    d = sorted(a - b for a in x for b in y)
    est = _median(d)
    half = (1.0 - confidence) / 2.0
    k = 0
    while k < len(d) // 2 and (k == 0 or d[k - 1] < d[k]) and _lower_tail(k, d, x, y) <= half:
        k += 1
    k = max(k, 1)
    achieved = 1.0 - 2.0 * _lower_tail(k - 1, d, x, y)
    return est, d[k - 1], d[len(d) - k], achieved


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
    if not values:
        raise ValueError("median of an empty sample")
    return float(_median(values))


def _sign_test_rank(n: int, confidence: float) -> int | None:
    """k of the sign-test interval [x_(k), x_(n+1-k)] for the median of n values, as
    `scipy.stats.quantile_test` (p = 0.5) picks it: it depends on n and the confidence
    only, so it is read off the ranks 1..n. Its coverage is strictly above `confidence`
    where a binomial tail equals (1 - confidence) / 2 exactly (e.g. 0.875 with 7 values;
    never at the bench's 0.95). None where even [min, max] covers no more (95%: fewer
    than 6 values; with 5, [min, max] covers the median with 15/16 = 0.9375 only)."""
    ranks = list(range(1, n + 1))
    ci = quantile_test(ranks, q=median(ranks), p=0.5).confidence_interval(confidence)
    return None if math.isnan(ci.low) or math.isnan(ci.high) else int(ci.low)


def _ranked(values: Sequence[float], confidence: float) -> tuple[list[float], int | None]:
    """(the values sorted, the sign test's k for their number, or None): the rank asked
    for once, for both interval functions below."""
    return sorted(values), _sign_test_rank(len(values), confidence)


def median_interval_achieved(
    values: Sequence[float], confidence: float = 0.95
) -> tuple[float, float, float]:
    """(low, high, achieved confidence) of the median: the sign test's order statistics,
    whose coverage under Binomial(n, 1/2) is at least `confidence` (it exceeds it for small
    n); where the sample is too small for that, [min, max] with its lower coverage."""
    n = len(values)
    if n < 2:
        raise ValueError(f"an interval for a median needs at least 2 values, got {n}")
    v, k = _ranked(values, confidence)
    k = k or 1
    return float(v[k - 1]), float(v[n - k]), 1.0 - 2.0 * float(binom.cdf(k - 1, n, 0.5))


def median_interval(
    values: Sequence[float], confidence: float = 0.95
) -> tuple[float, float] | None:
    """Distribution-free interval for the median at `confidence` or more (the sign
    test's, `median_interval_achieved`); None when the sample is too small for it."""
    v, k = _ranked(values, confidence)
    if k is None:
        return None
    return float(v[k - 1]), float(v[len(v) - k])


def verdict(ratio: float, p_slower: float, p_faster: float, alpha: float, min_effect: float) -> str:
    """asv's rule, for the stored-number and the paired verdicts alike: a regression needs
    both p(slower) < alpha and ratio < 1 - min_effect; an improvement both p(faster) <
    alpha and ratio > 1 / (1 - min_effect); anything else passes."""
    if p_slower < alpha and ratio < 1.0 - min_effect:
        return "regression"
    if p_faster < alpha and ratio > 1.0 / (1.0 - min_effect):
        return "improvement"
    return "pass"


def paired_ratio_p(ratios: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value for "the paired ratios are centred on 1"
    (`scipy.stats.wilcoxon` on their logarithms; exact for small samples without ties)."""
    if min(ratios) <= 0:
        raise ValueError("ratios must be positive")
    logs = [math.log(r) for r in ratios]
    if not any(logs):
        return 1.0  # every pair identical: no evidence either way (scipy: nan)
    return float(wilcoxon(logs).pvalue)
