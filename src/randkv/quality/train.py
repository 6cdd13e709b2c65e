"""`randkv quality train`: train the pointer-chain model on CPU and save a checkpoint.

Deterministic given the seed: the initialisation comes from `torch.manual_seed(seed)` and every
batch is a pure function of (seed, step) through the seeded task generator. Bitwise
reproduction of the shipped weights additionally needs the same torch version and thread count
(float reductions are summed in a thread-dependent order); `quality_train.json` in the
checkpoint folder records both.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from randkv.models.tiny import PAD_ID
from randkv.quality.model import MODEL_PARAMS, build_model, encode, write_tokenizer_files
from randkv.quality.task import TASK_VERSION, TaskConfig, make_problem

__all__ = ["Schedule", "TrainConfig", "fit", "train"]

#: Training problems come from task families TRAIN_FAMILY + seed; evaluation uses family 0..
#: (the families are independent random streams, so train and eval problems differ).
TRAIN_FAMILY = 1_000_000


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings of `randkv quality train` (defaults: the shipped checkpoint)."""

    seed: int = 0
    steps: int = 1800
    batch_size: int = 32
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    min_keys: int = 4
    max_keys: int = 10
    # Short chains (mostly the first lap of the cycle), so that most answer tokens need a
    # prompt lookup; the model generalises to the 40-hop evaluation chains.
    min_hops: int = 1
    max_hops: int = 12
    threads: int = 1
    tally: bool = False  # train on tally chains instead of pointer chains


def _batch(config: TrainConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, labels) of one batch; labels are -100 on the prompt and padding."""
    rng = random.Random(f"randkv-quality-train:{config.seed}:{step}")
    rows = []
    for i in range(config.batch_size):
        task = TaskConfig(
            num_keys=rng.randint(config.min_keys, config.max_keys),
            hops=rng.randint(config.min_hops, config.max_hops),
            tally=config.tally,
        )
        problem = make_problem(TRAIN_FAMILY + config.seed, step * config.batch_size + i, task)
        rows.append((encode(problem.prompt), encode(problem.target)))
    width = max(len(p) + len(t) for p, t in rows)
    ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for b, (prompt, target) in enumerate(rows):
        seq = prompt + target
        ids[b, : len(seq)] = torch.tensor(seq)
        # Labels are the inputs; the model shifts them. Only answer tokens are predictable.
        labels[b, len(prompt) : len(seq)] = torch.tensor(target)
    return ids, labels


def _lr(config: Schedule, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


class Schedule(Protocol):
    """What the optimisation loop reads of a training config."""

    seed: int
    steps: int
    lr: float
    warmup: int
    weight_decay: float
    threads: int


def train(
    out_dir: str | Path,
    config: TrainConfig | None = None,
    *,
    progress: Callable[[int, float, float], None] | None = None,
    save_every: int = 0,
) -> dict[str, Any]:
    """Train and save a checkpoint folder; returns the training record.

    `progress(step, loss, token_accuracy)` is called after every step. With `save_every`, the
    folder is also written every that many steps (its record says `"partial": true`), so an
    interrupted run leaves a usable checkpoint; the weights are not affected.
    """
    config = config or TrainConfig()

    def record(history: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
        return training_record(config, TASK_VERSION, history, seconds)

    return fit(
        out_dir,
        config,
        lambda step: _batch(config, step),
        record,
        progress=progress,
        save_every=save_every,
    )


def fit(
    out_dir: str | Path,
    config: Schedule,
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
