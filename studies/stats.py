"""Confidence intervals and paired tests for exact-match accuracies (standard library + numpy).

Accuracy over problems x seeds: the Wilson score interval when each problem was run once,
else a percentile bootstrap that resamples problems (each with all its seeds), since runs of
one problem are correlated. Paired comparisons on the same problems: a paired bootstrap CI of
the mean per-problem difference and an exact two-sided sign test on the problems where the
two evictors differ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "bootstrap_mean_ci",
    "cluster_bootstrap_ci",
    "holm",
    "paired_comparison",
    "sign_test",
    "wilson_interval",
]

Z95 = 1.959963984540054


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion."""
    if trials <= 0:
        raise ValueError("trials must be positive")
    if not 0 <= successes <= trials:
        raise ValueError("successes must be in [0, trials]")
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_mean_ci(
    values: Sequence[float], *, resamples: int = 10_000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of `values` (one value per problem)."""
    data = np.asarray(values, dtype=np.float64)
    if data.size == 0:
        raise ValueError("no values")
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(resamples, data.size))].mean(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def sign_test(differences: Sequence[float]) -> tuple[float, int, int]:
    """Exact two-sided sign test of the median difference being 0.

    Returns (p_value, positives, negatives); zero differences are dropped.
    """
    positives = sum(1 for d in differences if d > 0)
    negatives = sum(1 for d in differences if d < 0)
    n = positives + negatives
    if n == 0:
        return 1.0, 0, 0
    k = min(positives, negatives)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail), positives, negatives


def paired_comparison(
    ours: Sequence[float], theirs: Sequence[float], *, resamples: int = 10_000, seed: int = 0
) -> dict[str, float | int]:
    """Compare per-problem scores of two evictors on the same problems (theirs - ours)."""
    if len(ours) != len(theirs):
        raise ValueError("paired scores need the same problems")
    diff = [t - o for o, t in zip(ours, theirs, strict=True)]
    low, high = bootstrap_mean_ci(diff, resamples=resamples, seed=seed)
    p_value, better, worse = sign_test(diff)
    return {
        "mean_difference": float(np.mean(diff)),
        "ci_low": low,
        "ci_high": high,
        "sign_test_p": p_value,
        "problems_better": better,
        "problems_worse": worse,
    }


def cluster_bootstrap_ci(
    right: Sequence[float],
    total: Sequence[float],
    *,
    resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap CI of a ratio sum(right) / sum(total) over clusters.

    One entry per cluster (a problem: its right uses and its uses in a stratum); clusters are
    resampled whole, since uses of one sequence are correlated. Clusters with total 0 count
    as drawn but add nothing."""
    num = np.asarray(right, dtype=np.float64)
    den = np.asarray(total, dtype=np.float64)
    if num.shape != den.shape or num.size == 0 or den.sum() <= 0:
        raise ValueError("need one (right, total) per cluster and some uses")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, num.size, size=(resamples, num.size))
    sums = den[picks].sum(axis=1)
    ratios = num[picks].sum(axis=1)[sums > 0] / sums[sums > 0]
    tail = (1 - level) / 2
    return float(np.quantile(ratios, tail)), float(np.quantile(ratios, 1 - tail))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (same order as given): reject where <= alpha to hold
    the family-wise error rate at alpha over the whole family."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted
