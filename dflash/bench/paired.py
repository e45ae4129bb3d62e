"""The paired verdict: candidate and baseline environments measured in the same run.

Each pair is one candidate repeat and one baseline repeat run back to back on the same
host, so whatever the shared machine's load does to one it does, nearly, to the other;
the within-pair log ratio log(candidate / baseline) removes it. The test is scipy's
Wilcoxon signed-rank test on those log ratios (exact null distribution for the pair
counts used here); the ratio is exp(median log ratio) with the distribution-free
interval of a median: the order statistics [x_(k), x_(n+1-k)] with k from the
binomial(n, 1/2) distribution (the sign-test interval,
`dflash.bench.stats.median_interval_achieved`), whose achieved confidence is reported
(it exceeds the requested one for small n).

A regression needs both: p(slower) < alpha AND ratio < 1 - min_effect (asv's rule,
`dflash.bench.stats.verdict`, which the stored-number verdict applies too).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scipy import stats

from dflash.bench import stats as bench_stats


@dataclass(frozen=True)
class PairedResult:
    pairs: int
    ratios: list[float]  # candidate / baseline, per pair
    ratio: float
    ci: tuple[float, float]
    confidence: float
    p_slower: float
    p_faster: float
    verdict: str  # "pass" | "regression" | "improvement"

    def to_dict(self) -> dict[str, Any]:
        return {
            "pairs": self.pairs,
            "ratios": self.ratios,
            "ratio": self.ratio,
            "ci": list(self.ci),
            "confidence": self.confidence,
            "p_slower": self.p_slower,
            "p_faster": self.p_faster,
            "verdict": self.verdict,
        }


def paired_verdict(
    candidate: Sequence[float],
    baseline: Sequence[float],
    alpha: float,
    min_effect: float,
) -> PairedResult:
    if len(candidate) != len(baseline):
        raise ValueError("paired samples need the same number of candidate and baseline repeats")
    if len(candidate) < 2:
        raise ValueError("a paired comparison needs at least 2 pairs")
    if min(candidate) <= 0 or min(baseline) <= 0:
        raise ValueError("throughput samples must be positive")
    logs = [math.log(c / b) for c, b in zip(candidate, baseline, strict=True)]
    if all(v == 0.0 for v in logs):  # identical samples: no evidence either way
        p_slower = p_faster = 1.0
    else:
        p_slower = float(stats.wilcoxon(logs, alternative="less").pvalue)
        p_faster = float(stats.wilcoxon(logs, alternative="greater").pvalue)
    mid = float(stats.scoreatpercentile(logs, 50))
    lo, hi, achieved = bench_stats.median_interval_achieved(logs, 1.0 - alpha)
    ratio = math.exp(mid)
    return PairedResult(
        pairs=len(logs),
        ratios=[math.exp(v) for v in logs],
        ratio=ratio,
        ci=(math.exp(lo), math.exp(hi)),
        confidence=achieved,
        p_slower=p_slower,
        p_faster=p_faster,
        verdict=bench_stats.verdict(ratio, p_slower, p_faster, alpha, min_effect),
    )
