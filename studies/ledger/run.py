"""One ledger arm over a set of problems: forced decoding, the checker, the survival audit.

Every arm runs `randkv.hf.forced_decode` over a `RandKVCache` with the same (K, r): the
schedule's tokens are written, each use's value is the model's greedy token. Each row is its
own request (request key ``ledger:<seed>:<index>``, so RandKV's draws differ between problems).

The survival audit reads `cache.positions` in `on_step` at every step that predicts a use's
value (what the model attends to in that forward, a due round not yet applied) and records,
per (layer, KV head), whether the value token of at least one right copy of the fact (the
define or a right earlier use, as the checker reads them from the written text) is held, and
whether the define's value token is (the copy the shipped model reads).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from randkv.hf.cache import RandKVCache
from randkv.hf.generate import forced_decode
from randkv.spec.config import RandKVConfig
from studies.ledger.arms import ledger_arm, oracle_needs
from studies.ledger.checker import check_ledger
from studies.ledger.task import LedgerProblem
from studies.model import decode, encode

__all__ = ["LedgerRun", "run_ledger_arm"]


@dataclass
class LedgerRun:
    """One arm at one budget and seed: per problem, per use (in order)."""

    evictor: str
    budget: int | None
    seed: int | None
    correct: list[list[bool]] = field(default_factory=list)
    #: Bit l * kv_heads + h set when (layer l, KV head h) holds a right copy's value token.
    value_held: list[list[int]] = field(default_factory=list)
    #: The same for the define's value token (the copy the shipped model reads).
    define_held: list[list[int]] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)  # structural errors (none expected)


def _forced(problems: Sequence[LedgerProblem]) -> torch.Tensor:
    rows = []
    for p in problems:
        row = encode(p.body)
        for offset in p.generated_offsets:
            row[offset] = -1
        rows.append(row)
    return torch.tensor(rows, dtype=torch.long)


def _held(snapshot: torch.Tensor, offsets: Sequence[int], prompt: int) -> int:
    """Bit l * kv_heads + h set when (layer l, KV head h) of a (layers, kv_heads, slots)
    snapshot holds the token at any of the body `offsets`."""
    flat = snapshot.flatten(0, 1)  # (layers * kv_heads, slots)
    wanted = torch.tensor([prompt + o for o in offsets], dtype=flat.dtype)
    held = torch.isin(flat, wanted).any(-1)
    return int((held.long() << torch.arange(flat.shape[0])).sum())


def run_ledger_arm(
    model: Any,
    problems: Sequence[LedgerProblem],
    evictor: str,
    *,
    budget: int,
    buffer: int,
    seed: int = 0,
    batch_size: int = 64,
    on_batch: Callable[[int], None] | None = None,
) -> LedgerRun:
    """Decode every problem with one arm; check every use; audit what each head held."""
    arm = ledger_arm(evictor)
    run = LedgerRun(evictor, None if arm.dense else budget, seed if arm.random else None)
    for start in range(0, len(problems), batch_size):
        batch = list(problems[start : start + batch_size])
        _run_batch(model, batch, arm, run, budget=budget, buffer=buffer, seed=seed)
        if on_batch is not None:
            on_batch(len(batch))
    return run


def _run_batch(
    model: Any,
    batch: list[LedgerProblem],
    arm: Any,
    run: LedgerRun,
    *,
    budget: int,
    buffer: int,
    seed: int,
) -> None:
    ids = torch.tensor([encode(p.prompt) for p in batch], dtype=torch.long)
    forced = _forced(batch)
    prompt = ids.shape[1]
    limit = prompt + forced.shape[1] if arm.dense else budget
    selector = arm.selector()
    if selector.knows_future:
        selector = replace(selector, future=tuple(oracle_needs(p) for p in batch))
    cache = RandKVCache.from_inputs(
        model,
        ids,
        None,
        randkv=RandKVConfig(budget=limit, buffer_size=buffer, seed=seed),
        request_keys=[f"ledger:{p.seed}:{p.index}" for p in batch],
        selector=selector,
        track_positions=True,
    )
    generated = forced < 0
    snapshots: dict[tuple[int, int], torch.Tensor] = {}

    def on_step(step: int, cache: RandKVCache) -> None:
        positions = cache.positions
        assert positions is not None
        for row in generated[:, step].nonzero().flatten().tolist():
            snapshots[(row, step)] = positions[row].clone()

    out = forced_decode(model, ids, None, forced, cache=cache, on_step=on_step)
    for row, problem in enumerate(batch):
        body = decode(out[row].tolist())
        check = check_ledger(problem.prompt, body, problem.config.events)
        run.errors.append(check.error)
        by_event = {u.event: u for u in check.uses}
        correct, value_bits, define_bits = [], [], []
        for use in problem.uses:
            seen = by_event.get(use.event)
            correct.append(seen is not None and seen.correct)
            snapshot = snapshots.pop((row, use.value_offset))
            copies = seen.copy_offsets if seen else ()
            value_bits.append(_held(snapshot, copies, prompt))
            define_bits.append(_held(snapshot, copies[:1], prompt))
        run.correct.append(correct)
        run.value_held.append(value_bits)
        run.define_held.append(define_bits)
