"""Per-use accuracy of the ledger study: strata, clustered CIs, paired tests with Holm.

Uses are stratified by the problem's own knobs (from the right text, so every arm is scored
on the same uses): the age band of the newest copy at the budget and m, the copies before
the use. Every figure is clustered by problem: a CI resamples problems whole (each with all
its uses, and for a seeded policy all its seeds). A paired comparison against the reference
(RandKV, averaged over its seeds) takes, per problem, the difference of right uses in the
stratum; its CI is a cluster bootstrap of the pooled difference, its p-value an exact sign
test over the problems that differ, Holm-adjusted over the whole family of reported
comparisons (every non-reference policy x budget x stratum).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from studies.ledger.run import LedgerRun
from studies.ledger.task import BANDS, LedgerProblem, age_band
from studies.stats import cluster_bootstrap_ci, holm, sign_test

__all__ = [
    "STRATA",
    "age_bins",
    "paired_rows",
    "seed_spread",
    "stratum_masks",
    "summary",
    "survival",
]

#: Reported strata, in order.
STRATA = (
    "all",
    *BANDS,
    "m=1",
    "m>=2",
    "beyond, m=1",
    "beyond, m>=2",
)


def _in(stratum: str, band: str, copies: int) -> bool:
    if stratum == "all":
        return True
    parts = [p.strip() for p in stratum.split(",")]
    return all(
        (copies == 1) if p == "m=1" else (copies >= 2) if p == "m>=2" else band == p for p in parts
    )


def stratum_masks(
    problems: Sequence[LedgerProblem], budget: int, buffer: int
) -> dict[str, list[list[bool]]]:
    """Per stratum, per problem, per use: whether the use is in the stratum at this budget."""
    return {
        s: [
            [_in(s, age_band(u.age, budget, buffer, len(p.prompt)), u.copies) for u in p.uses]
            for p in problems
        ]
        for s in STRATA
    }


def summary(runs: Sequence[LedgerRun], mask: list[list[bool]]) -> dict[str, Any] | None:
    """Accuracy in one stratum with its clustered 95% bootstrap CI (None when empty)."""
    right = [
        sum(float(run.correct[i][k]) for run in runs for k, inside in enumerate(uses) if inside)
        for i, uses in enumerate(mask)
    ]
    total = [float(sum(uses) * len(runs)) for uses in mask]
    if sum(total) == 0:
        return None
    low, high = cluster_bootstrap_ci(right, total)
    accuracy = sum(right) / sum(total)
    return {
        "accuracy": accuracy,
        "ci_low": min(low, accuracy),
        "ci_high": max(high, accuracy),
        "uses": int(sum(total)) // len(runs),
    }


def _per_problem(runs: Sequence[LedgerRun], mask: list[list[bool]]) -> list[float]:
    """Right uses per problem in the stratum, averaged over seeds."""
    return [
        sum(float(run.correct[i][k]) for run in runs for k, inside in enumerate(uses) if inside)
        / len(runs)
        for i, uses in enumerate(mask)
    ]


def paired_rows(
    rows: list[dict[str, Any]],
    runs: dict[tuple[str, int | None], list[LedgerRun]],
    masks: dict[int, dict[str, list[list[bool]]]],
    reference: str,
) -> list[dict[str, Any]]:
    """Paired comparisons (policy - reference) for every reported row and stratum, with
    Holm-adjusted p-values over all of them. `rows` name (evictor, budget)."""
    out = []
    for row in rows:
        name, budget = row["evictor"], row["budget"]
        ours = runs.get((reference, budget))
        if name == reference or budget is None or ours is None:
            continue
        for stratum, mask in masks[budget].items():
            uses = [float(sum(u)) for u in mask]
            if sum(uses) == 0:
                continue
            mine = _per_problem(ours, mask)
            theirs = _per_problem(runs[(name, budget)], mask)
            diff = [t - o for t, o in zip(theirs, mine, strict=True)]
            low, high = cluster_bootstrap_ci(diff, uses)
            p_value, better, worse = sign_test(diff)
            out.append(
                {
                    "evictor": name,
                    "budget": budget,
                    "stratum": stratum,
                    "difference": sum(diff) / sum(uses),
                    "ci_low": low,
                    "ci_high": high,
                    "sign_test_p": p_value,
                    "problems_better": better,
                    "problems_worse": worse,
                }
            )
    for row, adjusted in zip(out, holm([r["sign_test_p"] for r in out]), strict=True):
        row["holm_p"] = adjusted
    return out


def seed_spread(runs: Sequence[LedgerRun], mask: list[list[bool]]) -> dict[str, Any]:
    """Accuracy of each eviction seed in a stratum, and their range."""
    per_seed = [summary([run], mask) for run in runs]
    values = [s["accuracy"] for s in per_seed if s is not None]
    return {
        "seeds": [run.seed for run in runs],
        "accuracy": values,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }


def age_bins(
    problems: Sequence[LedgerProblem],
    runs: Sequence[LedgerRun],
    width: int,
) -> list[dict[str, Any]]:
    """Accuracy by the age of the newest copy, in bins of `width` tokens (clustered CIs)."""
    ages = sorted({u.age // width for p in problems for u in p.uses})
    rows = []
    for b in ages:
        mask = [[u.age // width == b for u in p.uses] for p in problems]
        cell = summary(runs, mask)
        if cell is not None:
            rows.append({"age_low": b * width, "age_high": (b + 1) * width - 1, **cell})
    return rows


def survival(runs: Sequence[LedgerRun], heads: int) -> dict[str, dict[str, float | int | None]]:
    """Accuracy by what the heads held at the use (pooled over seeds): the define's value token
    in no, some or every (layer, KV head), and no right copy's value token in any head."""
    classes: dict[str, list[int]] = {
        "define in no head": [0, 0],
        "define in some heads": [0, 0],
        "define in every head": [0, 0],
        "no right copy in any head": [0, 0],
    }
    full = (1 << heads) - 1
    for run in runs:
        for correct, defines, values in zip(
            run.correct, run.define_held, run.value_held, strict=True
        ):
            for right, define, value in zip(correct, defines, values, strict=True):
                key = (
                    "define in no head"
                    if define == 0
                    else "define in every head"
                    if define == full
                    else "define in some heads"
                )
                for name in (key, "no right copy in any head") if value == 0 else (key,):
                    classes[name][0] += int(right)
                    classes[name][1] += 1
    return {
        name: {"uses": n, "accuracy": right / n if n else None}
        for name, (right, n) in classes.items()
    }
