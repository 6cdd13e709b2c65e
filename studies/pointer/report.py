"""The pointer chain's report: the shared accuracy tables plus exact match by cycle length,
and the accuracy-vs-budget plot with the task's title."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studies.plot import plot_accuracy
from studies.report import markdown_row, markdown_table, markdown_tables, result_budgets

__all__ = ["plot_pointer", "pointer_markdown"]


def pointer_markdown(result: dict[str, Any], reference: str = "randkv") -> str:
    """quality.md: accuracy per evictor x budget, paired differences vs `reference`, then
    exact match by cycle length when the result has it."""
    text = markdown_tables(result, reference)
    if result.get("by_cycle_length"):
        cycles = _cycle_table(result["by_cycle_length"], result_budgets(result))
        text += "\n" + "\n".join(cycles) + "\n"
    return text


def _cycle_table(rows: list[dict[str, Any]], budgets: list[int]) -> list[str]:
    """Exact match by cycle length: one row per (evictor, cycle bin), one column per K."""
    bins = list(dict.fromkeys(tuple(r["cycles"]) for r in rows))
    by_key = {(r["evictor"], r["budget"], tuple(r["cycles"])): r for r in rows}
    names = list(dict.fromkeys(r["evictor"] for r in rows))
    out = [
        "Exact match by cycle length C (problems per bin in the dense row):",
        "",
        *markdown_table(["evictor", "C", *[f"K = {b}" for b in budgets]], []),
    ]
    for name in names:
        for low, high in bins:
            if name == "dense":
                cell = by_key.get((name, None, (low, high)))
                text = f"{cell['accuracy']:.2f} (n={cell['problems']})" if cell else ""
                out.append(f"| dense | {low}-{high} | {text} (any K) |" + " |" * (len(budgets) - 1))
                continue
            cells = [by_key.get((name, b, (low, high))) for b in budgets]
            accuracies = [f"{c['accuracy']:.2f}" if c else "" for c in cells]
            out.append(markdown_row([name, f"{low}-{high}", *accuracies]))
    return out


def plot_pointer(result: dict[str, Any], path: str | Path) -> Path:
    """quality.png: exact match per evictor against K, titled with the task's sizes."""
    task, config = result["task"], result["config"]
    title = (
        f"{task['name'].replace('-', ' ')} v{task['version']}: {task['num_keys']} keys "
        f"(prompt {task['prompt_tokens']} tokens), {task['answer_tokens']} generated tokens, "
        f"{config['problems']} problems"
    )
    return plot_accuracy(result, path, title=title)
