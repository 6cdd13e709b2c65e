"""`python -m studies train`: train the pointer-chain model on CPU and save a checkpoint.

The loop is `studies.training.fit`; every batch is a pure function of (seed, step)
through the seeded task generator, so a run is deterministic given the seed (and, bitwise,
the torch version and thread count).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from randkv.models.tiny import PAD_ID
from studies.families import TRAIN_FAMILY
from studies.model import encode
from studies.pointer.task import TASK_VERSION, TaskConfig, make_problem
from studies.training import fit, training_record

__all__ = ["TrainConfig", "train"]


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings of `python -m studies train` (defaults: the shipped checkpoint)."""

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
