"""Verdicts on H1-H4 of the real-model study (docs/quality.md, stated before any policy run).

Each check reads the paired table (policy - RandKV, Holm-adjusted t-test p) or the per-row
means; a hypothesis is confirmed when every one of its checks holds, refuted when none does,
mixed otherwise, and inconclusive when its rows were not run.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ALPHA", "SCORED", "hypotheses"]

ALPHA = 0.05
SCORED = ("h2o", "snapkv", "tova", "rkv")
WINDOWS = ("window", "streamingllm")


def _row(part: dict[str, Any], name: str, budget: int) -> dict[str, Any] | None:
    return next(
        (r for r in part["results"] if r["evictor"] == name and r["budget"] == budget), None
    )


def _pair(part: dict[str, Any], name: str, budget: int, metric: str) -> dict[str, Any] | None:
    return next(
        (
            p
            for p in part["paired"]
            if p["evictor"] == name and p["budget"] == budget and p["metric"] == metric
        ),
        None,
    )


def _verdict(checks: list[tuple[str, bool]]) -> dict[str, Any]:
    if not checks:
        return {"verdict": "inconclusive", "checks": []}
    held = sum(ok for _, ok in checks)
    verdict = "confirmed" if held == len(checks) else "refuted" if held == 0 else "mixed"
    return {"verdict": verdict, "checks": [{"check": text, "holds": ok} for text, ok in checks]}


def _metric(row: dict[str, Any] | None, name: str) -> float | None:
    if row is None or name not in row["metrics"]:
        return None
    return float(row["metrics"][name]["mean"])


def hypotheses(result: dict[str, Any]) -> dict[str, Any]:
    """H1-H4 at the largest budget (the paper's regime in the default run)."""
    parts = result["parts"]
    budgets = result["config"]["budgets"]
    top = max(budgets)
    text, own = parts.get("text"), parts.get("own")
    out: dict[str, Any] = {}

    h1: list[tuple[str, bool]] = []
    if text and (row := _row(text, "randkv", top)):
        high = row["nll_vs_dense"]["ci_high"]
        h1.append((f"text NLL - dense, upper CI {high:+.4f} < 0.05 at K={top}", high < 0.05))
    if own and (agree := _metric(_row(own, "randkv", top), "top1_agreement")) is not None:
        h1.append((f"own top-1 agreement {agree:.3f} >= 0.95 at K={top}", agree >= 0.95))
    out["H1"] = _verdict(h1)

    h2: list[tuple[str, bool]] = []
    for part, metric in ((text, "nll"), (own, "kl")):
        for name in SCORED:
            pair = part and _pair(part, name, top, metric)
            if pair:
                better = pair["difference"] < -0.01 and pair["holm_p"] < ALPHA
                h2.append((
                    f"{name} {metric} - randkv {pair['difference']:+.4f} (Holm p "
                    f"{pair['holm_p']:.2g}) not clearly better at K={top}",
                    not better,
                ))  # fmt: skip
    out["H2"] = _verdict(h2)

    h3: list[tuple[str, bool]] = []
    for budget in budgets:
        pair = text and _pair(text, "window", budget, "nll")
        if pair:
            worse = pair["difference"] > 0 and pair["holm_p"] < ALPHA
            h3.append((
                f"window nll - randkv {pair['difference']:+.4f} (Holm p {pair['holm_p']:.2g}) "
                f"not significantly worse at K={budget}",
                not worse,
            ))  # fmt: skip
    out["H3"] = _verdict(h3)

    h4: list[tuple[str, bool]] = []
    if own:
        ours = _row(own, "randkv", top)
        recall, held = _metric(ours, "passcode_recalled"), _metric(ours, "passcode_held")
        for name in WINDOWS:
            theirs = _row(own, name, top)
            other = _metric(theirs, "passcode_recalled")
            if recall is not None and other is not None:
                h4.append((
                    f"passcode recall randkv {recall:.2f} > {name} {other:.2f} at K={top}",
                    recall > other,
                ))  # fmt: skip
            other_held = _metric(theirs, "passcode_held")
            if other_held is not None:
                h4.append((f"{name} holds the passcode in {other_held:.3f} of heads (0 expected)",
                           other_held == 0.0))  # fmt: skip
        if held is not None:
            h4.append((f"randkv holds the passcode in {held:.3f} of heads (> 0)", held > 0))
    out["H4"] = _verdict(h4)
    return out
