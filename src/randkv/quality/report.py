"""Markdown tables of a `randkv quality eval` result (the README's table is made by this)."""

from __future__ import annotations

from typing import Any

__all__ = ["markdown_tables"]


def _cell(row: dict[str, Any]) -> str:
    return f"{row['accuracy']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"


def markdown_tables(result: dict[str, Any], reference: str = "randkv") -> str:
    """Accuracy per evictor x budget (with 95% CIs), then paired differences vs `reference`."""
    rows = result["results"]
    budgets = sorted({r["budget"] for r in rows if r["budget"] is not None})
    names = list(dict.fromkeys(r["evictor"] for r in rows))
    by_key = {(r["evictor"], r["budget"]): r for r in rows}
    header = "| evictor | " + " | ".join(f"K = {b}" for b in budgets) + " |"
    rule = "|---|" + "---|" * len(budgets)
    lines = ["Exact-match accuracy [95% CI]:", "", header, rule]
    for name in names:
        if name == "dense":
            dense = by_key[("dense", None)]
            lines.append(
                f"| dense (no eviction) | {_cell(dense)} (any K) |" + " |" * (len(budgets) - 1)
            )
            continue
        cells = [_cell(by_key[(name, b)]) if (name, b) in by_key else "" for b in budgets]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"Paired vs {reference} (accuracy difference, sign-test p):", "", header, rule]
    for name in names:
        if name in ("dense", reference):
            continue
        cells = []
        for b in budgets:
            paired = by_key.get((name, b), {}).get("vs_" + reference)
            cells.append(
                f"{paired['mean_difference']:+.2f}, p={paired['sign_test_p']:.2g}" if paired else ""
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
