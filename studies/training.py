"""The training loop every quality model shares, and the record a checkpoint ships with.

Deterministic given the seed: the initialisation comes from `torch.manual_seed(seed)` and a
task's batches are a pure function of (seed, step). Bitwise reproduction of shipped weights
additionally needs the same torch version and thread count (float reductions are summed in a
thread-dependent order); `quality_train.json` in the checkpoint folder records both.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import torch

from studies.model import MODEL_PARAMS, build_model, write_tokenizer_files

__all__ = ["FitSettings", "fit", "training_record"]


class FitSettings(Protocol):
    """What the optimisation loop reads of a training config."""

    seed: int
    steps: int
    lr: float
    warmup: int
    weight_decay: float
    threads: int


def _lr(config: FitSettings, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def fit(
    out_dir: str | Path,
    config: FitSettings,
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    record: Callable[[list[dict[str, Any]], float], dict[str, Any]],
    *,
    progress: Callable[[int, float, float], None] | None = None,
    save_every: int = 0,
) -> dict[str, Any]:
    """The optimisation loop of every quality model: a fresh model seeded by `config.seed`,
    AdamW with warm-up and cosine decay, `batch(step)` -> (ids, labels with -100 where no
    loss is taken); saves the folder with `record(history, seconds)` as quality_train.json."""
    torch.set_num_threads(config.threads)
    model = build_model(config.seed)
    model.config._attn_implementation = "sdpa"
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=(0.9, 0.98),
    )
    start = time.perf_counter()
    history = []
    for step in range(config.steps):
        for group in optimizer.param_groups:
            group["lr"] = _lr(config, step)
        ids, labels = batch(step)
        logits = model(input_ids=ids).logits[:, :-1]
        target = labels[:, 1:]
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        with torch.no_grad():
            known = target != -100
            accuracy = float((logits.argmax(-1) == target)[known].float().mean())
        history.append({"step": step, "loss": round(loss.item(), 5), "acc": round(accuracy, 5)})
        if progress is not None:
            progress(step, loss.item(), accuracy)
        if save_every and (step + 1) % save_every == 0 and step + 1 < config.steps:
            partial = record(history, time.perf_counter() - start)
            _save(model, Path(out_dir), {**partial, "partial": True})
            model.train()
    final = record(history, time.perf_counter() - start)
    _save(model, Path(out_dir), final)
    return final


def training_record(
    config: Any, task_version: int, history: list[dict[str, Any]], seconds: float
) -> dict[str, Any]:
    """The JSON a checkpoint ships with: settings, time, final loss, a thinned loss history."""
    return {
        "train_config": asdict(config),
        "task_version": task_version,
        "model_params": MODEL_PARAMS,
        "train_seconds": round(seconds, 1),
        "torch_version": torch.__version__,
        "threads": config.threads,
        "final_loss": history[-1]["loss"],
        "final_token_accuracy": history[-1]["acc"],
        "steps_done": len(history),
        "history": history[:: max(1, len(history) // 100)],
    }


def _save(model: Any, out_dir: Path, record: dict[str, Any]) -> None:
    """Write the checkpoint folder atomically (a temporary sibling renamed into place)."""
    out_dir = out_dir.absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.eval()
    model.config._attn_implementation = "sdpa"
    model.save_pretrained(tmp, safe_serialization=True)
    write_tokenizer_files(tmp)
    (tmp / "quality_train.json").write_text(json.dumps(record, indent=2) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
