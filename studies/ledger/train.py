"""`python -m studies train --task ledger`: train the ledger model on CPU.

Same model and optimisation loop as the pointer-chain model (`studies.training.fit`). The
loss is taken only on the values of uses, the tokens that need the skill (copy the value of
the variable just asked for from any earlier copy); forced tokens (defines, ``?X``, spaces)
carry no loss. Curriculum: the longest body of a batch grows linearly from `min_events` to
`max_events` over the first `ramp` of the steps (short examples first), and `max_events`
exceeds the evaluation body, so the evaluation length is covered (no length-generalisation
confound). Each row draws its own number of variables and the budget its age bands refer to,
so every age up to the evaluation's occurs in training.

Deterministic given the seed: the initialisation comes from `torch.manual_seed(seed)` and every
batch is a pure function of (seed, step).
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
from studies.ledger.task import LEDGER_VERSION, LedgerConfig, make_ledger
from studies.model import encode
from studies.training import fit, training_record

__all__ = ["LedgerTrainConfig", "ledger_batch", "train_ledger"]

#: Budgets whose age bands the training rows are drawn for (every band of each occurs).
TRAIN_BUDGETS = (24, 32, 48, 72)


@dataclass(frozen=True)
class LedgerTrainConfig:
    """Settings of `python -m studies train --task ledger` (defaults: the shipped run)."""

    seed: int = 0
    steps: int = 1400
    tokens_per_batch: int = 4096  # rows per batch = this // the batch's sequence length
    lr: float = 1e-3
    warmup: int = 100
    weight_decay: float = 0.01
    min_events: int = 8
    max_events: int = 88  # the evaluation body is 80 events
    ramp: float = 0.7  # fraction of the steps over which the longest body grows
    buffer: int = 4
    threads: int = 1

    def longest(self, step: int) -> int:
        """The longest body (events) a batch may have at `step`."""
        grow = min(1.0, step / max(1.0, self.ramp * self.steps))
        return round(self.min_events + grow * (self.max_events - self.min_events))


def ledger_batch(config: LedgerTrainConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, labels) of one batch; labels are -100 except on the values of uses."""
    rng = random.Random(f"randkv-ledger-train:{config.seed}:{step}")
    events = rng.randint(config.min_events, config.longest(step))
    rows = max(1, config.tokens_per_batch // (8 + 4 * events))
    ids_rows, label_rows = [], []
    for i in range(rows):
        task = LedgerConfig(
            events=events,
            variables=rng.randint(2, max(2, min(20, events // 3))),
            budget=rng.choice(TRAIN_BUDGETS),
            buffer=config.buffer,
        )
        problem = make_ledger(TRAIN_FAMILY + config.seed, step * 1024 + i, task)
        ids = encode(problem.prompt + problem.body)
        labels = [-100] * len(ids)
        for offset in problem.generated_offsets:
            labels[len(problem.prompt) + offset] = ids[len(problem.prompt) + offset]
        ids_rows.append(ids)
        label_rows.append(labels)
    width = max(map(len, ids_rows))
    ids_t = torch.full((rows, width), PAD_ID, dtype=torch.long)
    labels_t = torch.full((rows, width), -100, dtype=torch.long)
    for b, (ids, labels) in enumerate(zip(ids_rows, label_rows, strict=True)):
        ids_t[b, : len(ids)] = torch.tensor(ids)
        labels_t[b, : len(labels)] = torch.tensor(labels)
    return ids_t, labels_t


def train_ledger(
    out_dir: str | Path,
    config: LedgerTrainConfig | None = None,
    *,
    progress: Callable[[int, float, float], None] | None = None,
    save_every: int = 0,
) -> dict[str, Any]:
    """Train the ledger model and save its checkpoint folder; returns the training record."""
    config = config or LedgerTrainConfig()

    def record(history: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
        return {"task": "ledger", **training_record(config, LEDGER_VERSION, history, seconds)}

    return fit(
        out_dir,
        config,
        lambda step: ledger_batch(config, step),
        record,
        progress=progress,
        save_every=save_every,
    )
