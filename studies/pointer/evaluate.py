"""`python -m studies eval`: exact-match accuracy of every evictor at matched budgets.

Every evictor runs through the same code: `randkv.hf.generate` over a `RandKVCache` with the
same (K, r), greedy decoding, the same eager-attention model. Only the choice of the r slots a
round empties differs (`randkv.selectors`, by their names in `randkv.selectors.registry`;
`COMPARED` are the ones compared by default). Dense runs the same loop with a budget no round
reaches. Deterministic evictors run once; RandKV and its ablation once per seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from randkv.hf.cache import RandKVCache, left_pad
from randkv.hf.generate import generate
from randkv.models.tiny import PAD_ID
from randkv.spec.config import RandKVConfig
from studies.arms import DENSE, find_arm
from studies.families import EVAL_FAMILY
from studies.model import decode, encode, load_model, shipped_checkpoint
from studies.pointer.checker import check_answer
from studies.pointer.report import plot_pointer, pointer_markdown
from studies.pointer.strata import add_holm, by_cycle_length
from studies.pointer.task import TASK_VERSION, Problem, TaskConfig, make_problems
from studies.provenance import machine_record, model_record
from studies.report import write_result
from studies.schedule import run_arms
from studies.stats import bootstrap_mean_ci, paired_comparison, wilson_interval

__all__ = ["COMPARED", "SCHEMA_VERSION", "EvalConfig", "evaluate", "run_evictor"]

#: Bump when the JSON layout changes (2: Holm-adjusted p-values, accuracy by cycle length).
SCHEMA_VERSION = 2

#: The policies compared by default (names in `randkv.selectors.registry`), in report order.
COMPARED: tuple[str, ...] = (
    "randkv",
    "randkv-noprompt",
    "streamingllm",
    "window",
    "h2o",
    "h2o-noprompt",
    "snapkv",
    "tova",
)


@dataclass(frozen=True)
class EvalConfig:
    """What `python -m studies eval` runs."""

    budgets: tuple[int, ...] = (40, 48, 64, 96)
    buffer: int = 8
    seeds: tuple[int, ...] = (0, 1, 2)
    problems: int = 128
    num_keys: int = 8
    hops: int = 32  # 128 generated tokens, where the shipped model is >= 80% exact with dense
    tally: bool = False  # tally chains instead of pointer chains (see TaskConfig)
    evictors: tuple[str, ...] = (DENSE, *COMPARED)
    batch_size: int = 32
    threads: int = 2
    reference: str = "randkv"  # paired comparisons are against this evictor

    @property
    def task(self) -> TaskConfig:
        return TaskConfig(num_keys=self.num_keys, hops=self.hops, tally=self.tally)


@dataclass
class Run:
    """One evictor at one budget and seed over all problems."""

    evictor: str
    budget: int | None
    seed: int | None
    exact: list[bool] = field(default_factory=list)
    hops_correct: list[int] = field(default_factory=list)


def _batches(problems: Sequence[Problem], size: int) -> list[list[Problem]]:
    return [list(problems[i : i + size]) for i in range(0, len(problems), size)]


def run_evictor(
    model: Any,
    problems: Sequence[Problem],
    evictor: str,
    *,
    budget: int,
    buffer: int,
    seed: int = 0,
    batch_size: int = 32,
    on_batch: Callable[[int], None] | None = None,
) -> Run:
    """Greedy answers of one evictor (or "dense") to `problems`, checked independently."""
    arm = find_arm(evictor)
    run = Run(evictor, None if arm.dense else budget, seed if arm.random else None)
    for batch in _batches(problems, batch_size):
        prompts = [encode(p.prompt) for p in batch]
        new_tokens = max(len(encode(p.target)) for p in batch)
        ids, mask = left_pad(prompts, PAD_ID)
        # Dense: the same loop with a budget no round reaches, attention over every token.
        limit = ids.shape[1] + new_tokens if arm.dense else budget
        config = RandKVConfig(budget=limit, buffer_size=buffer, seed=seed)
        selector = arm.selector()
        cache = RandKVCache.from_inputs(
            model,
            ids,
            mask,
            randkv=config,
            selector=selector,
            track_positions=selector.needs_positions,
        )
        out = generate(model, ids, mask, randkv=None, cache=cache, **_greedy(new_tokens))
        for b, problem in enumerate(batch):
            text = decode(out[b, ids.shape[1] :].tolist())
            result = check_answer(
                problem.prompt, text, problem.config.hops, tally=problem.config.tally
            )
            run.exact.append(result.exact)
            run.hops_correct.append(result.hops_correct)
        if on_batch is not None:
            on_batch(len(batch))
    return run


def _greedy(new_tokens: int) -> dict[str, Any]:
    return {
        "max_new_tokens": new_tokens,
        "do_sample": False,
        "eos_token_id": None,  # the answer has a fixed length; never stop early
        "pad_token_id": PAD_ID,
    }


def _per_problem(runs: list[Run], attribute: str) -> list[float]:
    """Mean over seeds of each problem's score."""
    table = [getattr(run, attribute) for run in runs]
    return [sum(float(v) for v in column) / len(table) for column in zip(*table, strict=True)]


def _summary(runs: list[Run], hops: int) -> dict[str, Any]:
    exact = _per_problem(runs, "exact")
    trials = sum(len(run.exact) for run in runs)
    successes = sum(sum(run.exact) for run in runs)
    if len(runs) == 1:
        low, high, method = *wilson_interval(successes, trials), "wilson"
    else:
        low, high = bootstrap_mean_ci(exact)
        method = "bootstrap over problems"
    accuracy = successes / trials
    return {
        "accuracy": accuracy,
        # Float rounding can put a degenerate bootstrap interval a hair off the mean.
        "ci_low": min(low, accuracy),
        "ci_high": max(high, accuracy),
        "ci_method": method,
        "hop_fraction": sum(_per_problem(runs, "hops_correct")) / (len(exact) * hops),
        "problems": len(exact),
        "seeds": len(runs),
    }


def evaluate(
    config: EvalConfig,
    *,
    model_path: str | Path | None = None,
    out_dir: str | Path = "results/quality",
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run every evictor at every budget; write quality.json and quality.png into out_dir."""
    torch.set_num_threads(config.threads)
    for name in config.evictors:
        find_arm(name)  # every name is known before any run starts
    problems = make_problems(EVAL_FAMILY, config.problems, config.task)
    prompt_tokens = max(len(encode(p.prompt)) for p in problems)
    if min(config.budgets) < prompt_tokens:
        raise ValueError(
            f"budget {min(config.budgets)} is below the prompt ({prompt_tokens} tokens); "
            "every evictor here keeps K >= P tokens"
        )
    model = load_model(model_path)
    runs, seconds = run_arms(run_evictor, model, problems, config, find_arm, show_progress)
    result = _report(config, problems, runs, model_path, seconds, prompt_tokens)
    write_result(
        result, out_dir, "quality", pointer_markdown(result, config.reference), plot_pointer
    )
    return result


def _report(
    config: EvalConfig,
    problems: list[Problem],
    runs: dict[tuple[str, int | None], list[Run]],
    model_path: str | Path | None,
    seconds: float,
    prompt_tokens: int,
) -> dict[str, Any]:
    hops = config.hops
    rows = []
    for (name, budget), group in runs.items():
        row = {"evictor": name, "budget": budget, **_summary(group, hops)}
        reference = runs.get((config.reference, budget))
        if reference is not None and name != config.reference:  # dense has no budget
            row["vs_" + config.reference] = paired_comparison(
                _per_problem(reference, "exact"), _per_problem(group, "exact")
            )
        rows.append(row)
    model_folder = Path(model_path) if model_path is not None else shipped_checkpoint()
    result = {
        "schema_version": SCHEMA_VERSION,
        "task": {
            "name": "tally-chain" if config.tally else "pointer-chain",
            "version": TASK_VERSION,
            "family": EVAL_FAMILY,
            **asdict(config.task),
            "prompt_tokens": prompt_tokens,
            "answer_tokens": config.task.answer_chars,
            "cycle_lengths": [p.cycle_length for p in problems],
        },
        "config": {**asdict(config), "budgets": list(config.budgets), "seeds": list(config.seeds)},
        "model": model_record(model_folder),
        "machine": machine_record(config.threads),
        "seconds": round(seconds, 1),
        "results": rows,
        "per_problem": [
            {
                "evictor": run.evictor,
                "budget": run.budget,
                "seed": run.seed,
                "exact": [int(v) for v in run.exact],
                "hops_correct": run.hops_correct,
            }
            for group in runs.values()
            for run in group
        ],
    }
    family = add_holm(result, config.reference)
    result["holm_family"] = (
        f"every vs_{config.reference} comparison (each evictor x budget; {family} comparisons)"
    )
    result["by_cycle_length"] = by_cycle_length(result)
    return result
