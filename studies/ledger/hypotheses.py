"""Verdicts on H1-H4 of docs/quality.md (stated before any policy run), from the paired table.

A comparison (policy - RandKV on one stratum at one budget) *supports* a hypothesis when its
Holm-adjusted p-value is below 0.05 with the difference in the stated direction, is *against*
it when significant the other way, else neither. A hypothesis is confirmed when every one of
its comparisons supports it, refuted when some are against it and none support it, mixed
when both occur, and inconclusive otherwise. H4 uses the unadjusted paired 95% CI, as stated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from studies.ledger.arms import SCORED
from studies.ledger.task import PROMPT

__all__ = ["ALPHA", "hypotheses", "paper_regime"]

ALPHA = 0.05


def paper_regime(budget: int, buffer: int) -> bool:
    """K - P >= 8r: per-round survival of an old token about 0.9 or more."""
    return budget - len(PROMPT) >= 8 * buffer


def _verdict(checks: list[dict[str, Any]]) -> str:
    support = sum(c["outcome"] == "supports" for c in checks)
    against = sum(c["outcome"] == "against" for c in checks)
    if not checks:
        return "inconclusive"
    if support == len(checks):
        return "confirmed"
    if against and not support:
        return "refuted"
    return "mixed" if support and against else "inconclusive"


def _check(row: dict[str, Any], sign: int) -> dict[str, Any]:
    significant = row["holm_p"] < ALPHA
    direction = (row["difference"] > 0) - (row["difference"] < 0)
    outcome = "neither"
    if significant and direction == sign:
        outcome = "supports"
    elif significant and direction == -sign:
        outcome = "against"
    keys = ("evictor", "budget", "stratum", "difference", "ci_low", "ci_high", "holm_p")
    return {**{k: row[k] for k in keys}, "outcome": outcome}


def _directional(
    paired: list[dict[str, Any]],
    policies: Sequence[str],
    stratum: str,
    budgets: Sequence[int],
    sign: int,
) -> dict[str, Any]:
    checks = [
        _check(row, sign)
        for row in paired
        if row["evictor"] in policies and row["stratum"] == stratum and row["budget"] in budgets
    ]
    return {"verdict": _verdict(checks), "comparisons": checks}


def hypotheses(
    rows: list[dict[str, Any]],
    paired: list[dict[str, Any]],
    budgets: Sequence[int],
    buffer: int,
    reference: str,
) -> dict[str, Any]:
    """H1-H4 with the comparisons behind each verdict."""
    paper = [b for b in budgets if paper_regime(b, buffer)]
    result = {
        "H1": {
            "statement": "m >= 2, beyond the window: RandKV beats window and StreamingLLM "
            "(budgets with K - P >= 8r)",
            **_directional(paired, ("window", "streamingllm"), "beyond, m>=2", paper, -1),
        },
        "H2": {
            "statement": "m = 1, beyond the window: H2O and R-KV beat RandKV (every budget)",
            **_directional(paired, ("h2o", "rkv"), "beyond, m=1", budgets, +1),
        },
        "H3": {
            "statement": "beyond the window: independent per-head draws beat one shared draw "
            "(every budget)",
            **_directional(paired, ("randkv-shared",), "beyond", budgets, -1),
        },
    }
    checks = []
    for budget in paper:
        overall = {
            r["evictor"]: r["strata"]["all"]["accuracy"]
            for r in rows
            if r["budget"] == budget and r["evictor"] in SCORED
        }
        if not overall:
            continue
        best = max(overall, key=lambda name: overall[name])
        row = next(
            r
            for r in paired
            if r["evictor"] == best and r["budget"] == budget and r["stratum"] == "all"
        )
        within = row["ci_low"] <= 0 or row["difference"] <= 0
        checks.append(
            {
                "budget": budget,
                "best_scored": best,
                "difference": row["difference"],
                "ci_low": row["ci_low"],
                "ci_high": row["ci_high"],
                "outcome": "supports" if within else "against",
            }
        )
    result["H4"] = {
        "statement": f"K - P >= 8r: {reference}'s overall accuracy within noise of the best "
        "scored method's (paired 95% CI includes 0, or RandKV ahead)",
        "verdict": _verdict(checks),
        "comparisons": checks,
    }
    return result
