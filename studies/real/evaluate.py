"""`python -m studies eval --task real`: every policy on a real model (SmolLM2-135M-Instruct by
default; `--model` takes another, e.g. Gemma 3 270M), real text and the model's own
generations, at matched (K, r). docs/quality.md ("Third study") says what and
why; this is the driver. Writes real.json, real.md and real.png.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from randkv.models.cache import default_cache_dir
from studies.arms import DENSE, find_arm
from studies.model import load_model
from studies.provenance import machine_record
from studies.real.corpus import plays
from studies.real.hypotheses import hypotheses
from studies.real.report import plot_real, real_markdown
from studies.real.run import ArmScores, score_arm
from studies.real.stats import (
    mean_ci,
    paired_t,
    per_document,
    position_bins,
    scored_mask,
)
from studies.real.store import RunStore
from studies.real.traces import Trace, own_generations, text_windows
from studies.report import write_result
from studies.schedule import plan_runs
from studies.stats import holm

__all__ = ["COMPARED", "PARTS", "REAL_SCHEMA_VERSION", "RealEvalConfig", "evaluate_real"]

REAL_SCHEMA_VERSION = 1

#: The policies compared by default (dense comes first, see RealEvalConfig).
COMPARED: tuple[str, ...] = (
    "randkv", "randkv-shared", "window", "streamingllm", "h2o", "snapkv", "tova", "rkv",
)  # fmt: skip

#: The two parts: text windows (perplexity) and the dense model's own generations.
PARTS = ("text", "own")

#: Width (positions) of the NLL-by-position bins.
POSITION_BIN = 128


@dataclass(frozen=True)
class RealEvalConfig:
    """What `python -m studies eval --task real` runs (the defaults are the committed run)."""

    budgets: tuple[int, ...] = (128, 192, 320)
    buffer: int = 16
    seeds: tuple[int, ...] = (0, 1, 2)
    documents: int = 8
    document_tokens: int = 2048
    document_prompt: int = 64
    generations: int = 24
    new_tokens: int = 768
    evictors: tuple[str, ...] = (DENSE, *COMPARED)
    parts: tuple[str, ...] = PARTS
    threads: int = 2
    reference: str = "randkv"


def _load(model_path: str | Path | None) -> tuple[Any, Any, Path]:
    """The model (float32, eager: the scored policies read attention weights, and every arm
    runs this path), its tokenizer and its folder (default: `randkv model fetch`'s)."""
    from transformers import AutoTokenizer

    from randkv.models.shipped import fetch_model

    folder = Path(model_path) if model_path is not None else fetch_model()
    return load_model(folder), AutoTokenizer.from_pretrained(folder), folder


def evaluate_real(
    config: RealEvalConfig,
    *,
    model_path: str | Path | None = None,
    out_dir: str | Path = "results/quality",
    runs_dir: str | Path | None = None,
    keep_runs: bool = True,
    show_progress: bool = True,
) -> dict[str, Any]:
    """Run every arm at every budget on both parts; write real.json, real.md and real.png.

    With `keep_runs`, each finished run is kept under `runs_dir` (default: the user cache's
    ``quality-real-runs``; see `RunStore`) and reused by a later call with the same traces,
    model, code and threads, so an interrupted evaluation resumes."""
    torch.set_num_threads(config.threads)
    for name in config.evictors:
        find_arm(name)
    unknown = set(config.parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; choose from {list(PARTS)}")
    model, tokenizer, folder = _load(model_path)
    model_record = _model_record(folder)
    runs_root = (
        Path(runs_dir) if runs_dir is not None else default_cache_dir() / "quality-real-runs"
    )

    def store(part: str, traces: list[Trace]) -> RunStore | None:
        if not keep_runs:
            return None
        return RunStore(runs_root, part, traces, buffer=config.buffer, context=model_record)

    started = time.perf_counter()
    parts: dict[str, Any] = {}
    if "text" in config.parts:
        docs = text_windows(
            tokenizer, plays(), config.documents, config.document_tokens, config.document_prompt
        )
        parts["text"] = _run_part("text", model, docs, config, store("text", docs), show_progress)
    if "own" in config.parts:
        traces = own_generations(model, tokenizer, config.generations, config.new_tokens)
        parts["own"] = _run_part("own", model, traces, config, store("own", traces), show_progress)
    result = {
        "schema_version": REAL_SCHEMA_VERSION,
        "task": {"name": "real", "parts": list(config.parts)},
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()},
        "model": model_record,
        "machine": machine_record(config.threads),
        "seconds": round(time.perf_counter() - started, 1),
        "parts": parts,
        "holm_family": (
            "per part: each non-reference policy x budget x metric (text: nll; own: kl, "
            "top1_agreement, nll) against RandKV"
        ),
    }
    result["hypotheses"] = hypotheses(result)
    write_result(result, out_dir, "real", real_markdown(result), plot_real)
    return result


def _model_record(folder: Path) -> dict[str, Any]:
    from randkv.models.shipped import model_provenance

    try:
        provenance = model_provenance(folder)
    except (FileNotFoundError, ValueError):
        provenance = None
    return {"path": str(folder), "provenance": provenance}


def _run_part(
    part: str,
    model: Any,
    traces: list[Trace],
    config: RealEvalConfig,
    store: RunStore | None,
    show_progress: bool,
) -> dict[str, Any]:
    """Dense first (its log-probabilities are the KL reference of own generations), then
    every planned (policy, budget, seed), each taken from `store` when it has it."""
    own = part == "own"
    plan = [p for p in plan_runs(config.evictors, config.budgets, config.seeds, find_arm)
            if p[0] != DENSE]  # fmt: skip
    dense, dense_logprobs = score_arm(
        model, traces, find_arm(DENSE), DENSE, budget=max(config.budgets),
        buffer=config.buffer, seed=0, keep_logprobs=own,
    )  # fmt: skip
    runs: dict[tuple[str, int | None], list[ArmScores]] = {(DENSE, None): [dense]}
    reused = 0
    for i, (name, budget, seed) in enumerate(plan):
        scores = store.load(name, budget, seed) if store is not None else None
        reused += scores is not None
        if show_progress:
            note = " (saved run)" if scores is not None else ""
            print(f"[{part}] {i + 1}/{len(plan)} {name} K={budget} seed={seed}{note}", flush=True)
        if scores is None:
            scores, _ = score_arm(
                model, traces, find_arm(name), name, budget=budget, buffer=config.buffer,
                seed=seed, dense_logprobs=dense_logprobs,
            )  # fmt: skip
            if store is not None:
                store.save(scores, budget, seed)
        runs.setdefault((name, scores.budget), []).append(scores)
    del dense_logprobs
    if show_progress and store is not None:
        print(f"[{part}] {reused} of {len(plan)} runs from {store.folder}", flush=True)
    return {**_summarise(part, traces, runs, config), "reused_runs": reused}


def _summarise(
    part: str,
    traces: list[Trace],
    runs: dict[tuple[str, int | None], list[ArmScores]],
    config: RealEvalConfig,
) -> dict[str, Any]:
    own = part == "own"
    length = len(traces[0].ids)
    start = max(config.budgets) + 2 * config.buffer  # every budget has had its first round
    mask = scored_mask(traces, length, start, own)
    per_doc = {key: per_document(group, traces, mask) for key, group in runs.items()}
    dense_nll = runs[(DENSE, None)][0].nll
    rows = []
    for (name, budget), group in runs.items():
        docs = per_doc[(name, budget)]
        row: dict[str, Any] = {"evictor": name, "budget": budget, "seeds": len(group)}
        row["metrics"] = {metric: mean_ci(values) for metric, values in docs.items()}
        row["nll_vs_dense"] = mean_ci(
            [a - b for a, b in zip(docs["nll"], per_doc[(DENSE, None)]["nll"], strict=True)]
        )
        row["rounds_per_trace"] = float(sum(group[0].rounds) / len(group[0].rounds))
        row["eviction_seconds"] = round(sum(r.eviction_seconds for r in group), 2)
        row["nll_by_position"] = position_bins(group, 0, POSITION_BIN, dense_nll)
        rows.append(row)
    paired = _paired(per_doc, config, own)
    return {
        "documents": [
            {"name": t.name, "tokens": len(t.ids), "prompt": t.prompt, "sampled": t.sampled}
            for t in traces
        ],
        "scored_from": start,
        "scored_tokens": int(mask.sum()),
        "results": rows,
        "paired": paired,
        "per_document": [
            {"evictor": name, "budget": budget, **values}
            for (name, budget), values in per_doc.items()
        ],
    }


def _paired(
    per_doc: dict[tuple[str, int | None], dict[str, list[float]]],
    config: RealEvalConfig,
    own: bool,
) -> list[dict[str, Any]]:
    """Every non-reference policy against the reference at each budget, Holm-adjusted."""
    metrics = ("kl", "top1_agreement", "nll") if own else ("nll",)
    paired = []
    for (name, budget), values in per_doc.items():
        if name in (DENSE, config.reference) or budget is None:
            continue
        ours = per_doc.get((config.reference, budget))
        if ours is None:
            continue
        for metric in metrics:
            test = paired_t(ours[metric], values[metric])
            paired.append({"evictor": name, "budget": budget, "metric": metric, **test})
    for row, p in zip(paired, holm([r["t_test_p"] for r in paired]), strict=True):
        row["holm_p"] = p
    return paired
