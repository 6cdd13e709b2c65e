"""Markdown tables and the accuracy-vs-age plot of a `python -m studies eval --task ledger` run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studies.ledger.stats import STRATA
from studies.report import accuracy_cell, markdown_table, result_budgets

__all__ = ["MIN_BIN_USES", "ledger_markdown", "plot_ledger"]

#: The plot leaves out age bins with fewer uses (their CIs span most of [0, 1]).
MIN_BIN_USES = 30


def _cell(cell: dict[str, Any] | None, ci: bool = True) -> str:
    if cell is None:
        return ""
    return accuracy_cell(cell) if ci else f"{cell['accuracy']:.2f}"


def _paired(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return ""
    return f"{cell['difference']:+.2f}" + ("*" if cell["holm_p"] < 0.05 else "")


def ledger_markdown(result: dict[str, Any]) -> str:
    """Overall accuracy, strata, paired comparisons (Holm), seed spread, survival, H1-H4."""
    rows = result["results"]
    budgets = result_budgets(result)
    names = list(dict.fromkeys(r["evictor"] for r in rows))
    by_key = {(r["evictor"], r["budget"]): r for r in rows}
    r = result["config"]["buffer"]
    out = [
        f"Ledger v{result['task']['version']}: {result['config']['problems']} problems, "
        f"r = {r}, {result['seconds']} s. Per-use accuracy [95% CI, clustered by problem]:",
        "",
    ]
    lines = []
    for name in names:
        if name == "dense":
            cell = by_key[("dense", None)]["strata"]["all"]
            lines.append(["dense (no eviction)", *[_cell(cell)] * len(budgets)])
            continue
        lines.append(
            [
                name,
                *[_cell(by_key.get((name, b), {}).get("strata", {}).get("all")) for b in budgets],
            ]
        )
    out += markdown_table(["evictor", *[f"K = {b}" for b in budgets]], lines)
    for b in budgets:
        out += ["", f"K = {b}: accuracy by stratum (age band of the newest copy, m copies):", ""]
        lines = [
            [name, *[_cell(by_key[(name, b)]["strata"][s], ci=False) for s in STRATA]]
            for name in names
            if (name, b) in by_key
        ]
        out += markdown_table(["evictor", *STRATA], lines)
    out += [
        "",
        f"Paired vs {result['config']['reference']} (policy - reference; * Holm p < 0.05; "
        f"family: {result['holm_family']}):",
        "",
    ]
    lines = []
    for b in budgets:
        for name in names:
            cells = {
                p["stratum"]: p
                for p in result["paired"]
                if p["evictor"] == name and p["budget"] == b
            }
            if cells:
                lines.append([f"{name} K={b}", *[_paired(cells.get(s)) for s in STRATA]])
    out += markdown_table(["policy", *STRATA], lines)
    out += ["", "Eviction-seed spread (accuracy per seed, overall / beyond):", ""]
    lines = []
    for row in rows:
        spread = row.get("seed_spread")
        if spread:
            lines.append(
                [
                    f"{row['evictor']} K={row['budget']}",
                    ", ".join(f"{v:.3f}" for v in spread["all"]["accuracy"]),
                    ", ".join(f"{v:.3f}" for v in spread["beyond"]["accuracy"]),
                ]
            )
    out += markdown_table(["policy", "overall", "beyond"], lines)
    out += ["", "Survival audit: accuracy (uses) by where the define's value token survived:", ""]
    classes = list(rows[0]["survival"])
    lines = []
    for row in rows:
        label = row["evictor"] if row["budget"] is None else f"{row['evictor']} K={row['budget']}"
        cells = []
        for c in classes:
            cell = row["survival"][c]
            acc = "-" if cell["accuracy"] is None else f"{cell['accuracy']:.2f}"
            cells.append(f"{acc} ({cell['uses']})")
        lines.append([label, *cells])
    out += markdown_table(["policy", *classes], lines)
    out += ["", "Hypotheses (stated before the run):", ""]
    for key, h in result["hypotheses"].items():
        out.append(f"- **{key}** ({h['statement']}): **{h['verdict']}**")
        for c in h["comparisons"]:
            who = c.get("evictor") or f"best scored = {c['best_scored']}"
            out.append(
                f"  - {who} K={c['budget']}: {c['difference']:+.3f} "
                f"[{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]"
                + (f", Holm p={c['holm_p']:.2g}" if "holm_p" in c else "")
                + f" ({c['outcome']})"
            )
    return "\n".join(out) + "\n"


def plot_ledger(result: dict[str, Any], path: str | Path) -> Path:
    """Accuracy against the age of the newest copy, one line per policy, one panel per K."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = result_budgets(result)
    fig, axes = plt.subplots(
        1, len(budgets), figsize=(4.2 * len(budgets), 4.2), dpi=110, squeeze=False
    )
    prompt, r = result["task"]["prompt_tokens"], result["config"]["buffer"]
    for ax, budget in zip(axes[0], budgets, strict=True):
        for row in result["results"]:
            if row["budget"] not in (budget, None):
                continue
            bins = [b for b in row["age_bins"] if b["uses"] >= MIN_BIN_USES]
            x = [(b["age_low"] + b["age_high"]) / 2 for b in bins]
            y = [b["accuracy"] for b in bins]
            err = [
                [max(0.0, b["accuracy"] - b["ci_low"]) for b in bins],
                [max(0.0, b["ci_high"] - b["accuracy"]) for b in bins],
            ]
            style = {"linewidth": 2.4, "color": "black"} if row["evictor"] == "randkv" else {}
            if row["evictor"] == "dense":
                style = {"linestyle": ":", "color": "green"}
            ax.errorbar(x, y, yerr=err, capsize=2, marker=".", label=row["evictor"], **style)
        ax.axvline(budget + r - prompt, color="gray", linewidth=0.8, linestyle="--")
        ax.set_title(
            f"K = {budget} (dashed: K + r - P; bins of >= {MIN_BIN_USES} uses)", fontsize=9
        )
        ax.set_xlabel("age of the newest copy (tokens)")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("per-use accuracy (95% CI, clustered)")
    axes[0][-1].legend(fontsize=7, loc="lower left")
    fig.suptitle(
        f"ledger v{result['task']['version']}: {result['config']['problems']} problems, r = {r}",
        fontsize=10,
    )
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
