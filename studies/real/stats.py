"""Per-document summaries and paired comparisons of the real-model study.

Every statistic is computed per document (a text window or a trace) first, RandKV's over its
seeds averaged; comparisons are paired over documents: the mean difference with a percentile
bootstrap 95% CI, and a two-sided paired t-test (continuous per-document means; with 8
documents an exact sign test cannot reach Holm-adjusted significance).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from scipy import stats as scipy_stats

from studies.real.run import ArmScores
from studies.real.traces import Trace
from studies.stats import bootstrap_mean_ci

__all__ = ["mean_ci", "paired_t", "per_document", "position_bins"]


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> list[float]:
    values = values.float()
    return [float(values[b][mask[b]].mean()) for b in range(values.shape[0])]


def scored_mask(traces: Sequence[Trace], length: int, start: int, own: bool) -> torch.Tensor:
    """(traces, length) bool: the positions a part's means run over: from `start` on, and
    for own generations only the dense model's own tokens."""
    mask = torch.zeros(len(traces), length, dtype=torch.bool)
    for b, trace in enumerate(traces):
        if own:
            at = [p for p in trace.generated if p >= start]
            mask[b, at] = True
        else:
            mask[b, start:] = True
    return mask


def per_document(
    group: Sequence[ArmScores], traces: Sequence[Trace], mask: torch.Tensor
) -> dict[str, list[float]]:
    """Per-document metrics of one (arm, budget), averaged over its seeds."""
    metrics: dict[str, list[list[float]]] = {}
    for run in group:
        row = {"nll": _masked_mean(run.nll, mask)}
        if run.kl is not None and run.agree is not None:
            row["kl"] = _masked_mean(run.kl, mask)
            row["top1_agreement"] = _masked_mean(run.agree, mask)
        for fact in traces[0].recall:
            row[f"{fact}_recalled"] = [
                float(bool((run.top1[b, t.recall[fact]] == torch.tensor(t.ids)[t.recall[fact]])
                           .all()))
                for b, t in enumerate(traces)
            ]  # fmt: skip
            row[f"{fact}_nll"] = [float(run.nll[b, t.recall[fact]].sum()) for b, t in
                                  enumerate(traces)]  # fmt: skip
        for fact, shares in run.held.items():
            row[f"{fact}_held"] = shares
        for key, values in row.items():
            metrics.setdefault(key, []).append(values)
    return {k: np.mean(np.asarray(v), axis=0).tolist() for k, v in metrics.items()}


def mean_ci(values: Sequence[float]) -> dict[str, float]:
    low, high = bootstrap_mean_ci(values)
    return {"mean": float(np.mean(values)), "ci_low": low, "ci_high": high}


def paired_t(ours: Sequence[float], theirs: Sequence[float]) -> dict[str, float]:
    """theirs - ours over documents: mean, bootstrap 95% CI, paired t-test p."""
    diff = np.asarray(theirs, dtype=np.float64) - np.asarray(ours, dtype=np.float64)
    low, high = bootstrap_mean_ci(diff.tolist())
    if np.allclose(diff, diff[0]):
        p = 1.0 if abs(diff[0]) < 1e-12 else 0.0
    else:
        p = float(scipy_stats.ttest_1samp(diff, 0.0).pvalue)
    return {"difference": float(diff.mean()), "ci_low": low, "ci_high": high, "t_test_p": p}


def position_bins(
    group: Sequence[ArmScores], start: int, width: int, reference: torch.Tensor | None = None
) -> list[dict[str, Any]]:
    """Mean NLL (minus the dense NLL `reference`, when given) per `width`-position bin from
    `start`, over every document and seed."""
    nll = torch.stack([run.nll for run in group]).mean(0)
    if reference is not None:
        nll = nll - reference
    bins = []
    for low in range(start, nll.shape[1], width):
        mean = float(torch.nanmean(nll[:, low : low + width]))
        if not math.isnan(mean):
            bins.append({"from": low, "to": min(low + width, nll.shape[1]), "nll": mean})
    return bins
