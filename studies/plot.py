"""The accuracy-vs-budget plot of a quality result (rows of evictor, budget, accuracy, CI)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["STYLE", "plot_accuracy"]

STYLE = {
    "randkv": {"color": "black", "linewidth": 2.4, "marker": "o"},
    "randkv-noprompt": {"color": "gray", "linestyle": "--", "marker": "o"},
    "streamingllm": {"color": "tab:red", "marker": "v"},
    "window": {"color": "tab:orange", "marker": "^"},
    "h2o": {"color": "tab:blue", "marker": "s"},
    "h2o-noprompt": {"color": "tab:blue", "linestyle": "--", "marker": "s"},
    "snapkv": {"color": "tab:green", "marker": "D"},
    "tova": {"color": "tab:purple", "marker": "P"},
    "randkv-shared": {"color": "dimgray", "linestyle": ":", "marker": "o"},
    "rkv": {"color": "tab:brown", "marker": "X"},
}


def plot_accuracy(result: dict[str, Any], path: str | Path, *, title: str | None = None) -> Path:
    """Exact-match accuracy (with its 95% CI) per evictor against the budget K; `title`
    defaults to the task's name and version and the number of problems."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    series: dict[str, list[dict[str, Any]]] = {}
    for row in result["results"]:
        series.setdefault(row["evictor"], []).append(row)
    budgets = sorted({row["budget"] for row in result["results"] if row["budget"] is not None})
    for name, rows in series.items():
        if name == "dense":
            row = rows[0]
            ax.axhline(row["accuracy"], color="green", alpha=0.5, linestyle=":", label="dense")
            ax.axhspan(row["ci_low"], row["ci_high"], color="green", alpha=0.08)
            continue
        rows = sorted(rows, key=lambda r: r["budget"])
        x = [r["budget"] for r in rows]
        y = [r["accuracy"] for r in rows]
        err = [
            [max(0.0, r["accuracy"] - r["ci_low"]) for r in rows],
            [max(0.0, r["ci_high"] - r["accuracy"]) for r in rows],
        ]
        ax.errorbar(x, y, yerr=err, capsize=3, label=name, **STYLE.get(name, {}))
    task = result["task"]
    config = result["config"]
    if title is None:
        title = f"{task['name']} v{task['version']}: {config['problems']} problems"
    ax.set_xscale("log", base=2)
    ax.set_xticks(budgets, [str(b) for b in budgets])
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel(f"budget K (tokens per KV head, prompt included; r = {config['buffer']})")
    ax.set_ylabel("exact-match accuracy (95% CI)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
