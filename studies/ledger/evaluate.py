"""`python -m studies eval --task ledger`: per-use accuracy of every arm at matched budgets.

Every arm decodes the same evaluation problems (family 0) through `randkv.hf.forced_decode`
over a `RandKVCache` with the same (K, r) (`studies.ledger.run`); dense runs the same
loop with a budget no round reaches, once; RandKV and its shared-draw ablation once per
eviction seed; the other arms once per budget. Writes ledger.json, ledger.md and ledger.png.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from studies.arms import DENSE
from studies.families import EVAL_FAMILY
from studies.ledger.arms import COMPARED, ledger_arm
from studies.ledger.hypotheses import hypotheses
from studies.ledger.report import ledger_markdown, plot_ledger
from studies.ledger.run import LedgerRun, run_ledger_arm
from studies.ledger.stats import (
    STRATA,
    age_bins,
    paired_rows,
    seed_spread,
    stratum_masks,
    summary,
    survival,
)
from studies.ledger.task import LEDGER_VERSION, LedgerConfig, LedgerProblem, make_ledgers
from studies.model import load_model, shipped_checkpoint
from studies.provenance import machine_record, model_record
from studies.report import write_result
from studies.schedule import run_arms

__all__ = ["LEDGER_SCHEMA_VERSION", "LedgerEvalConfig", "evaluate_ledger"]

#: Bump when the JSON layout changes (the pointer-chain eval's schema is 1).
LEDGER_SCHEMA_VERSION = 2

#: Width (tokens) of the age bins of the accuracy-vs-age plot: one event.
AGE_BIN = 16


@dataclass(frozen=True)
class LedgerEvalConfig:
    """What `python -m studies eval --task ledger` runs."""

    budgets: tuple[int, ...] = (24, 32, 48, 72)
    buffer: int = 4
    seeds: tuple[int, ...] = (0, 1, 2)
    problems: int = 128
    events: int = 80
    variables: int = 20
    evictors: tuple[str, ...] = (DENSE, *COMPARED)
    batch_size: int = 128
    threads: int = 1
    reference: str = "randkv"

    @property
    def task(self) -> LedgerConfig:
        return LedgerConfig(events=self.events, variables=self.variables, buffer=self.buffer)


def evaluate_ledger(
    config: LedgerEvalConfig,
    *,
    model_path: str | Path | None = None,
    out_dir: str | Path = "results/quality",
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run every arm at every budget; write ledger.json, ledger.md and ledger.png."""
    torch.set_num_threads(config.threads)
    for name in config.evictors:
        ledger_arm(name)
    problems = make_ledgers(EVAL_FAMILY, config.problems, config.task)
    model_folder = Path(model_path) if model_path is not None else shipped_checkpoint("ledger")
    model = load_model(model_folder)
    runs, seconds = run_arms(run_ledger_arm, model, problems, config, ledger_arm, show_progress)
    heads = model.config.num_hidden_layers * model.config.num_key_value_heads
    result = _report(config, problems, runs, model_folder, seconds, heads)
    write_result(result, out_dir, "ledger", ledger_markdown(result), plot_ledger)
    return result


def _report(
    config: LedgerEvalConfig,
    problems: list[LedgerProblem],
    runs: dict[tuple[str, int | None], list[LedgerRun]],
    model_folder: Path,
    seconds: float,
    heads: int,
) -> dict[str, Any]:
    masks = {b: stratum_masks(problems, b, config.buffer) for b in config.budgets}
    dense_budget = max(config.budgets)
    rows = []
    for (name, budget), group in runs.items():
        strata_of = masks[budget if budget is not None else dense_budget]
        row: dict[str, Any] = {
            "evictor": name,
            "budget": budget,
            "seeds": len(group),
            "strata": {s: summary(group, strata_of[s]) for s in STRATA},
            "survival": survival(group, heads),
            "age_bins": age_bins(problems, group, AGE_BIN),
        }
        if len(group) > 1:
            row["seed_spread"] = {s: seed_spread(group, strata_of[s]) for s in ("all", "beyond")}
        row["structural_errors"] = sum(e is not None for run in group for e in run.errors)
        rows.append(row)
    paired = paired_rows(rows, runs, masks, config.reference)
    return {
        "schema_version": LEDGER_SCHEMA_VERSION,
        "task": {
            "name": "ledger",
            "version": LEDGER_VERSION,
            "family": EVAL_FAMILY,
            **asdict(config.task),
            "prompt_tokens": config.task.prompt_tokens,
            "body_tokens": config.task.body_tokens,
            "uses": [[[u.age, u.copies, int(u.filler)] for u in p.uses] for p in problems],
        },
        "config": {
            **asdict(config),
            "budgets": list(config.budgets),
            "seeds": list(config.seeds),
            "evictors": list(config.evictors),
        },
        "model": model_record(model_folder),
        "machine": machine_record(config.threads),
        "seconds": round(seconds, 1),
        "holm_family": (
            "every paired comparison against the reference in `paired`: each non-reference "
            f"policy x budget x stratum ({len(paired)} comparisons)"
        ),
        "results": rows,
        "paired": paired,
        "hypotheses": hypotheses(rows, paired, config.budgets, config.buffer, config.reference),
        "per_problem": [
            {
                "evictor": run.evictor,
                "budget": run.budget,
                "seed": run.seed,
                "correct": ["".join("1" if c else "0" for c in row) for row in run.correct],
                "value_held": run.value_held,
                "define_held": run.define_held,
            }
            for group in runs.values()
            for run in group
        ],
    }
