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
    holm_note = (
        ", Holm-adjusted p" if any("holm_p" in r.get("vs_" + reference, {}) for r in rows) else ""
    )
    lines += [
        "",
        f"Paired vs {reference} (accuracy difference, sign-test p{holm_note}):",
        "",
        header,
        rule,
    ]
    for name in names:
        if name in ("dense", reference):
            continue
        cells = []
        for b in budgets:
            paired = by_key.get((name, b), {}).get("vs_" + reference)
            cells.append(_paired(paired))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if result.get("by_cycle_length"):
        lines += ["", *_cycle_table(result["by_cycle_length"], budgets)]
    return "\n".join(lines) + "\n"


def _paired(paired: dict[str, Any] | None) -> str:
    if not paired:
        return ""
    text = f"{paired['mean_difference']:+.2f}, p={paired['sign_test_p']:.2g}"
    return text + (f", Holm {paired['holm_p']:.2g}" if "holm_p" in paired else "")


def _cycle_table(rows: list[dict[str, Any]], budgets: list[int]) -> list[str]:
    """Exact match by cycle length: one row per (evictor, cycle bin), one column per K."""
    bins = list(dict.fromkeys(tuple(r["cycles"]) for r in rows))
    by_key = {(r["evictor"], r["budget"], tuple(r["cycles"])): r for r in rows}
    names = list(dict.fromkeys(r["evictor"] for r in rows))
    out = [
        "Exact match by cycle length C (problems per bin in the dense row):",
        "",
        "| evictor | C | " + " | ".join(f"K = {b}" for b in budgets) + " |",
        "|---|---|" + "---|" * len(budgets),
    ]
    for name in names:
        for low, high in bins:
            if name == "dense":
                cell = by_key.get((name, None, (low, high)))
                text = f"{cell['accuracy']:.2f} (n={cell['problems']})" if cell else ""
                out.append(f"| dense | {low}-{high} | {text} (any K) |" + " |" * (len(budgets) - 1))
                continue
            cells = [by_key.get((name, b, (low, high))) for b in budgets]
            out.append(
                f"| {name} | {low}-{high} | "
                + " | ".join(f"{c['accuracy']:.2f}" if c else "" for c in cells)
                + " |"
            )
    return out
