"""Mann-Whitney U and Hodges-Lehmann on synthetic samples (no timing anywhere)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import quantile_test

from dflash.bench import stats


def test_interval_tails_are_the_textbook_null_distribution():
    # Read from scipy's test by inversion: n = m = 3 has 20 arrangements, U = 0 once,
    # U = 1 once, U = 2 twice; n = m = 5: P(U <= 0) = 1/252, P(U <= 4) = 12/252.
    for n, expect in ((3, {0: 1 / 20, 1: 2 / 20, 2: 4 / 20}), (5, {0: 1 / 252, 4: 12 / 252})):
        x = [0.1 * i for i in range(n)]
        y = [0.37 + 0.29 * i for i in range(n)]
        d = sorted(a - b for a in x for b in y)
        for j, p in expect.items():
            assert stats._lower_tail(j, d, x, y) == pytest.approx(p)


def test_complete_separation_gives_the_smallest_p():
    x, y = [1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 8.0, 9.0, 10.0]
    assert stats.mann_whitney_less(x, y) == pytest.approx(1 / 252)
    assert stats.mann_whitney_less(y, x) == pytest.approx(1.0)


def test_normal_approximation_agrees_with_exact_for_moderate_samples():
    rng = random.Random(3)
    x = [rng.gauss(0.0, 1.0) for _ in range(20)]
    y = [rng.gauss(0.5, 1.0) for _ in range(20)]
    exact = stats.mann_whitney_less(x, y)
    y_tied = y + [x[0]]  # a tie forces the normal approximation
    approx = stats.mann_whitney_less(x, y_tied)
    assert abs(exact - approx) < 0.05
    assert exact < 0.2  # a half-sigma shift with 20 + 20 samples is visible


def test_all_tied_samples_give_no_evidence():
    assert stats.mann_whitney_less([1.0] * 4, [1.0] * 4) == 1.0


def test_hodges_lehmann_recovers_a_ratio_and_covers_it():
    rng = random.Random(7)
    base = [1000 * math.exp(rng.gauss(0, 0.02)) for _ in range(7)]
    cur = [0.8 * 1000 * math.exp(rng.gauss(0, 0.02)) for _ in range(7)]
    ratio, lo, hi, conf = stats.log_ratio(cur, base, 0.95)
    assert lo <= ratio <= hi
    assert lo < 0.8 < hi
    assert abs(ratio - 0.8) < 0.03
    assert conf >= 0.95


def test_interval_confidence_is_honest_for_tiny_samples():
    # 2 + 2 samples cannot reach 95%: the full range is returned with its real level.
    _, lo, hi, conf = stats.hodges_lehmann([1.0, 2.0], [3.0, 5.0], 0.95)
    assert (lo, hi) == (-4.0, -1.0)
    assert conf == pytest.approx(1 - 2 / 6)


def test_rejects_empty_and_non_positive_samples():
    with pytest.raises(ValueError):
        stats.mann_whitney_less([], [1.0])
    with pytest.raises(ValueError):
        stats.log_ratio([0.0, 1.0], [1.0, 2.0])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(1.0, 1e6), min_size=1, max_size=8),
    st.lists(st.floats(1.0, 1e6), min_size=1, max_size=8),
)
def test_p_values_are_probabilities_and_sides_are_complementary(x, y):
    lo, hi = stats.mann_whitney_less(x, y), stats.mann_whitney_less(y, x)
    assert 0.0 <= lo <= 1.0 and 0.0 <= hi <= 1.0
    # Exact, untied: P(U <= u) + P(U >= u) = 1 + P(U = u) >= 1.
    if len(set(x) | set(y)) == len(x) + len(y):
        assert lo + hi >= 1.0 - 1e-12


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(1.0, 1e4), min_size=3, max_size=8), st.floats(0.5, 2.0))
def test_ratio_estimate_is_scale_equivariant(base, factor):
    r1, *_ = stats.log_ratio([v * factor for v in base], base)
    assert r1 == pytest.approx(factor, rel=1e-9)


def test_median_interval_is_the_sign_tests_order_statistics():
    # n = 10: P(Bin(10, 1/2) <= 1) = 11/1024 <= 0.025 < P(<= 2) = 56/1024, so the 95%
    # interval is [x_(2), x_(9)]; n = 5: even [min, max] misses the median with 2/32 > 0.05.
    values = [0.93, 1.05, 0.87, 0.99, 0.9, 1.01, 0.95, 0.92, 0.96, 1.0]
    assert stats.median_interval(values) == (0.9, 1.01)
    assert stats.median_interval(values[:5]) is None
    assert stats.median_interval(values[:6]) == (min(values[:6]), max(values[:6]))


@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_median_interval_agrees_with_scipys_quantile_test_on_the_data(confidence):
    # The rank k is read off 1..n; the interval must be what scipy picks on the values.
    rng = random.Random(3)
    for n in range(2, 40):
        values = [rng.gauss(0, 1) for _ in range(n)]
        ci = quantile_test(values, q=stats.median(values), p=0.5).confidence_interval(confidence)
        lo, hi, achieved = stats.median_interval_achieved(values, confidence)
        if math.isnan(ci.low):
            assert stats.median_interval(values, confidence) is None
            assert (lo, hi) == (min(values), max(values)) and achieved < confidence
            assert achieved == pytest.approx(1 - 2 * 0.5**n)
        else:
            assert stats.median_interval(values, confidence) == (lo, hi) == (ci.low, ci.high)
            assert achieved >= confidence


def test_median_interval_of_tied_values_is_that_value():
    # Identical pairs give log ratios of exactly 0: the interval is [0, 0], as before.
    assert stats.median_interval_achieved([0.0] * 10, 0.95) == (0.0, 0.0, 1 - 22 / 1024)
    assert stats.median_interval([1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0]) == (1.0, 3.0)


@pytest.mark.parametrize(
    ("ratio", "p_slower", "p_faster", "expected"),
    [
        (0.90, 0.01, 0.99, "regression"),
        (0.96, 0.01, 0.99, "pass"),  # significant but smaller than the minimum effect
        (0.90, 0.20, 0.80, "pass"),  # large but not significant
        (1.10, 0.99, 0.01, "improvement"),
        (1.04, 0.99, 0.01, "pass"),  # 1 / (1 - 0.05) = 1.0526 is the bar
    ],
)
def test_verdict_needs_significance_and_the_minimum_effect(ratio, p_slower, p_faster, expected):
    assert stats.verdict(ratio, p_slower, p_faster, alpha=0.05, min_effect=0.05) == expected


def test_median_interval_covers_the_median_at_least_as_often_as_it_says():
    rng = random.Random(7)
    hits = sum(
        lo <= 0.0 <= hi
        for lo, hi in (
            stats.median_interval([rng.gauss(0, 1) for _ in range(12)]) for _ in range(400)
        )
    )
    assert hits / 400 >= 0.93  # nominal >= 0.95 (0.961 for n = 12); 400 draws: sd 0.01


def test_paired_ratio_p_is_the_exact_signed_rank_test():
    # 6 pairs all one way: the exact two-sided p is 2 / 2**6.
    assert stats.paired_ratio_p([1.1, 1.2, 1.05, 1.3, 1.15, 1.25]) == pytest.approx(2 / 64)
    assert stats.paired_ratio_p(
        [1 / r for r in (1.1, 1.2, 1.05, 1.3, 1.15, 1.25)]
    ) == pytest.approx(2 / 64)
    assert stats.paired_ratio_p([1.0, 1.0, 1.0]) == 1.0
    with pytest.raises(ValueError, match="positive"):
        stats.paired_ratio_p([1.1, 0.0])
