"""real.md and real.png of the real-model study."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from studies.plot import STYLE
from studies.report import markdown_table

__all__ = ["plot_real", "real_markdown"]


def _budgets(part: dict[str, Any]) -> list[int]:
    return sorted({r["budget"] for r in part["results"] if r["budget"] is not None})


def _names(part: dict[str, Any]) -> list[str]:
    return list(dict.fromkeys(r["evictor"] for r in part["results"]))


def _cell(cell: dict[str, Any] | None, digits: int = 3, sign: bool = False) -> str:
    if not cell:
        return ""
    form = f"{{:{'+' if sign else ''}.{digits}f}}"
    return f"{form.format(cell['mean'])} [{form.format(cell['ci_low'])}, " + (
        f"{form.format(cell['ci_high'])}]"
    )


def _by_key(part: dict[str, Any]) -> dict[tuple[str, int | None], dict[str, Any]]:
    return {(r["evictor"], r["budget"]): r for r in part["results"]}


def _metric_table(part: dict[str, Any], title: str, pick: Any, dense_pick: Any) -> list[str]:
    budgets, rows = _budgets(part), _by_key(part)
    lines = []
    for name in _names(part):
        if name == "dense":
            cells = [dense_pick(rows[("dense", None)])] + [""] * (len(budgets) - 1)
            lines.append(["dense (no eviction)", *cells])
            continue
        lines.append([name, *[pick(rows.get((name, b))) for b in budgets]])
    return [title, "", *markdown_table(["policy", *[f"K = {b}" for b in budgets]], lines), ""]


def _paired_table(part: dict[str, Any], metric: str, title: str) -> list[str]:
    budgets = _budgets(part)
    pairs = {(p["evictor"], p["budget"]): p for p in part["paired"] if p["metric"] == metric}
    lines = []
    for name in _names(part):
        if name in ("dense", "randkv"):
            continue
        cells = []
        for b in budgets:
            p = pairs.get((name, b))
            cells.append(f"{p['difference']:+.4f}, Holm p={p['holm_p']:.2g}" if p else "")
        lines.append([name, *cells])
    return [title, "", *markdown_table(["policy", *[f"K = {b}" for b in budgets]], lines), ""]


def _metric(row: dict[str, Any] | None, name: str, digits: int = 3) -> str:
    if not row or name not in row["metrics"]:
        return ""
    return _cell(row["metrics"][name], digits)


def model_title(result: dict[str, Any]) -> str:
    """The studied model's name from its provenance ("Gemma 3 270M"); SmolLM2 (the committed
    run) when the folder had none."""
    provenance = (result.get("model") or {}).get("provenance") or {}
    description = provenance.get("description")
    return description.split(" (")[0] if description else "SmolLM2-135M-Instruct"


def real_markdown(result: dict[str, Any]) -> str:
    config = result["config"]
    reused = sum(part.get("reused_runs", 0) for part in result["parts"].values())
    resumed = f", {reused} runs saved by an earlier invocation" if reused else ""
    lines = [
        f"# Real model: {model_title(result)} (float32)",
        "",
        f"r = {config['buffer']}; RandKV over seeds {config['seeds']}; 95% bootstrap CIs over "
        f"documents; paired: policy - RandKV, t-test, Holm per part. {result['seconds']} s on "
        f"{result['machine']['processor']} ({result['machine']['threads']} threads{resumed}).",
        "",
    ]
    text = result["parts"].get("text")
    if text:
        lines += [
            f"## Text: {len(text['documents'])} windows of {text['documents'][0]['tokens']} "
            f"tokens (Shakespeare), P = {text['documents'][0]['prompt']}, scored from position "
            f"{text['scored_from']} ({text['scored_tokens']} tokens)",
            "",
        ]
        lines += _metric_table(
            text,
            "NLL - dense (nats/token) [95% CI]:",
            lambda r: _cell(r["nll_vs_dense"], 4, sign=True) if r else "",
            lambda r: f"NLL {_metric(r, 'nll')}",
        )
        lines += _paired_table(text, "nll", "Paired vs randkv (NLL difference):")
    own = result["parts"].get("own")
    if own:
        docs = own["documents"]
        lines += [
            f"## Own generations: {len(docs)} answers ({sum(d['sampled'] for d in docs)} "
            f"sampled), {docs[0]['tokens']} tokens each, scored on the model's own tokens from "
            f"position {own['scored_from']} ({own['scored_tokens']} tokens)",
            "",
        ]
        for metric, title, digits in (
            ("kl", "KL(dense || policy) per token (nats) [95% CI]:", 4),
            ("top1_agreement", "Top-1 agreement with dense [95% CI]:", 3),
            ("passcode_recalled", "Passcode (stated once, early) recalled [95% CI]:", 2),
            ("room_recalled", "Room (stated four times) recalled [95% CI]:", 2),
            ("passcode_held", "Share of (layer, KV head) holding the passcode statement:", 3),
        ):
            lines += _metric_table(
                own, title, lambda r, m=metric, d=digits: _metric(r, m, d),
                lambda r, m=metric, d=digits: _metric(r, m, d),
            )  # fmt: skip
        lines += _paired_table(own, "kl", "Paired vs randkv (KL difference):")
    lines += ["## Hypotheses (docs/quality.md)", ""]
    for name, verdict in result["hypotheses"].items():
        lines.append(f"- **{name}: {verdict['verdict']}**")
        lines += [f"  - {'holds' if c['holds'] else 'fails'}: {c['check']}" for c in
                  verdict["checks"]]  # fmt: skip
    return "\n".join(lines) + "\n"


def plot_real(result: dict[str, Any], path: str | Path) -> Path:
    """Left: text NLL - dense by budget; middle: own-generation KL by budget; right: NLL -
    dense by position at the largest budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), dpi=110)
    panels = (
        ("text", lambda r: r["nll_vs_dense"], "text: NLL - dense (nats/token)"),
        ("own", lambda r: r["metrics"].get("kl"), "own generations: KL(dense || policy)"),
    )
    for ax, (part_name, pick, label) in zip(axes[:2], panels, strict=True):
        part = result["parts"].get(part_name)
        if not part:
            ax.set_visible(False)
            continue
        for name in _names(part):
            rows = sorted((r for r in part["results"] if r["evictor"] == name
                           and r["budget"] is not None), key=lambda r: r["budget"])  # fmt: skip
            cells = [pick(r) for r in rows]
            if not rows or any(c is None for c in cells):
                continue
            x = [r["budget"] for r in rows]
            y = [c["mean"] for c in cells]
            err = [[max(0.0, c["mean"] - c["ci_low"]) for c in cells],
                   [max(0.0, c["ci_high"] - c["mean"]) for c in cells]]  # fmt: skip
            ax.errorbar(x, y, yerr=err, capsize=3, label=name, **STYLE.get(name, {}))
        budgets = _budgets(part)
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlabel(f"budget K (r = {result['config']['buffer']})")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    text = result["parts"].get("text")
    ax = axes[2]
    if text:
        top = max(_budgets(text))
        for row in text["results"]:
            if row["budget"] == top:
                bins = row["nll_by_position"]
                ax.plot([b["from"] for b in bins], [b["nll"] for b in bins], label=row["evictor"],
                        **STYLE.get(row["evictor"], {}))  # fmt: skip
        ax.set_xlabel("position (bins of 128 tokens)")
        ax.set_ylabel(f"text: NLL - dense at K = {top}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    else:
        ax.set_visible(False)
    fig.suptitle(f"{model_title(result)}: policies at matched budgets", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
