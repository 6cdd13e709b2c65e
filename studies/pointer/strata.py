"""Holm over the pointer-chain table's paired comparisons, and accuracy by cycle length.

Both are computed from a `python -m studies eval` result alone (its `results`, `per_problem` and
`task.cycle_lengths`), so they apply to a stored result as well as to a fresh run.
Family for Holm: every `vs_<reference>` comparison of the result (each evictor x budget).
"""

from __future__ import annotations

from typing import Any

from studies.stats import bootstrap_mean_ci, holm

__all__ = ["CYCLE_BINS", "add_holm", "by_cycle_length"]

#: Cycle-length strata (inclusive): short cycles are revisited most often.
CYCLE_BINS: tuple[tuple[int, int], ...] = ((1, 2), (3, 4), (5, 6), (7, 10))


def add_holm(result: dict[str, Any], reference: str = "randkv") -> int:
    """Add `holm_p` to every paired comparison in place; returns the family size."""
    key = "vs_" + reference
    paired = [row[key] for row in result["results"] if key in row]
    for comparison, adjusted in zip(paired, holm([c["sign_test_p"] for c in paired]), strict=True):
        comparison["holm_p"] = adjusted
    return len(paired)


def by_cycle_length(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Exact-match accuracy per (evictor, budget, cycle-length bin), seeds averaged per
    problem, with a bootstrap 95% CI over problems."""
    cycles = result["task"]["cycle_lengths"]
    groups: dict[tuple[str, int | None], list[list[int]]] = {}
    for run in result["per_problem"]:
        groups.setdefault((run["evictor"], run["budget"]), []).append(run["exact"])
    rows = []
    for (name, budget), runs in groups.items():
        per_problem = [sum(col) / len(runs) for col in zip(*runs, strict=True)]
        for low, high in CYCLE_BINS:
            values = [v for v, c in zip(per_problem, cycles, strict=True) if low <= c <= high]
            if not values:
                continue
            ci_low, ci_high = bootstrap_mean_ci(values)
            mean = sum(values) / len(values)
            rows.append(
                {
                    "evictor": name,
                    "budget": budget,
                    "cycles": [low, high],
                    "problems": len(values),
                    "accuracy": mean,
                    "ci_low": min(ci_low, mean),
                    "ci_high": max(ci_high, mean),
                }
            )
    return rows
