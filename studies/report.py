"""Markdown helpers shared by the quality reports, and the accuracy-per-budget tables of any
result whose rows carry an accuracy with its CI and a paired comparison against a reference
(the pointer chain's table is made by this; its cycle-length table is in
`studies.pointer.report`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "accuracy_cell",
    "markdown_row",
    "markdown_table",
    "markdown_tables",
    "result_budgets",
    "write_result",
]


def write_result(
    result: dict[str, Any],
    out_dir: str | Path,
    stem: str,
    markdown: str,
    plot: Callable[[dict[str, Any], Path], Path],
) -> None:
    """Write <stem>.json, <stem>.md and, when matplotlib is installed, <stem>.png into
    `out_dir`; `result["plot"]` becomes the plot's path (None without matplotlib)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown)
    try:
        plot(result, out / f"{stem}.png")
        result["plot"] = str(out / f"{stem}.png")
    except ImportError:  # matplotlib is in the bench extra
        result["plot"] = None


def markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def markdown_table(header: Sequence[str], lines: Sequence[Sequence[str]]) -> list[str]:
    """The lines of a markdown table: the header, the rule, one row per line."""
    return [markdown_row(header), "|" + "---|" * len(header), *map(markdown_row, lines)]


def accuracy_cell(cell: dict[str, Any]) -> str:
    """An accuracy with its CI: ``0.84 [0.77, 0.90]``."""
    return f"{cell['accuracy']:.2f} [{cell['ci_low']:.2f}, {cell['ci_high']:.2f}]"


def result_budgets(result: dict[str, Any]) -> list[int]:
    """The budgets K of a result's rows, ascending (dense rows have none)."""
    return sorted({r["budget"] for r in result["results"] if r["budget"] is not None})


def markdown_tables(result: dict[str, Any], reference: str = "randkv") -> str:
    """Accuracy per evictor x budget (with 95% CIs), then paired differences vs `reference`."""
    rows = result["results"]
    budgets = result_budgets(result)
    names = list(dict.fromkeys(r["evictor"] for r in rows))
    by_key = {(r["evictor"], r["budget"]): r for r in rows}
    head = markdown_table(["evictor", *[f"K = {b}" for b in budgets]], [])
    lines = ["Exact-match accuracy [95% CI]:", "", *head]
    for name in names:
        if name == "dense":
            dense = accuracy_cell(by_key[("dense", None)])
            lines.append(f"| dense (no eviction) | {dense} (any K) |" + " |" * (len(budgets) - 1))
            continue
        cells = [accuracy_cell(by_key[(name, b)]) if (name, b) in by_key else "" for b in budgets]
        lines.append(markdown_row([name, *cells]))
    holm_note = (
        ", Holm-adjusted p" if any("holm_p" in r.get("vs_" + reference, {}) for r in rows) else ""
    )
    paired_title = f"Paired vs {reference} (accuracy difference, sign-test p{holm_note}):"
    lines += ["", paired_title, "", *head]
    for name in names:
        if name in ("dense", reference):
            continue
        cells = []
        for b in budgets:
            paired = by_key.get((name, b), {}).get("vs_" + reference)
            cells.append(_paired(paired))
        lines.append(markdown_row([name, *cells]))
    return "\n".join(lines) + "\n"


def _paired(paired: dict[str, Any] | None) -> str:
    if not paired:
        return ""
    text = f"{paired['mean_difference']:+.2f}, p={paired['sign_test_p']:.2g}"
    return text + (f", Holm {paired['holm_p']:.2g}" if "holm_p" in paired else "")
