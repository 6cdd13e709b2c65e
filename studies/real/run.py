"""One arm of the real-model study over a batch of traces: teacher-forced scores per position.

Every arm feeds the same token sequences through `randkv.hf.scoring.score_sequences` over a
`RandKVCache` with the same (K, r); dense is the same loop with a budget no round reaches.
Per position it records the NLL of the actual next token and whether it was the arm's top-1
token; given the dense arm's log-probabilities, also the KL divergence from dense and
whether the two top-1 tokens agree. Row b's request key is ``real:<seed>:<trace name>``, so
RandKV's draws differ between traces and seeds. At the end it audits, per (layer, KV head),
whether any token of each fact's statements is still held (what the model reads when it
answers the questions at the very end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from randkv.hf.cache import RandKVCache
from randkv.hf.scoring import score_sequences
from randkv.spec.config import RandKVConfig
from studies.arms import Arm
from studies.real.traces import Trace

__all__ = ["ArmScores", "score_arm"]


@dataclass
class ArmScores:
    """Per trace and position p (the prediction of token p; position 0 is NaN/False)."""

    evictor: str
    budget: int | None
    seed: int | None
    nll: torch.Tensor  # (traces, length) float32
    top1: torch.Tensor  # (traces, length) int64: the arm's most likely token at p
    kl: torch.Tensor | None = None  # (traces, length): KL(dense || arm) at p
    agree: torch.Tensor | None = None  # (traces, length) bool: top-1 equal to dense's
    #: fact -> per trace, the share of (layer, KV head) holding a token of a statement.
    held: dict[str, list[float]] = field(default_factory=dict)
    rounds: list[int] = field(default_factory=list)
    eviction_seconds: float = 0.0


def score_arm(
    model: Any,
    traces: Sequence[Trace],
    arm: Arm,
    name: str,
    *,
    budget: int,
    buffer: int,
    seed: int,
    dense_logprobs: torch.Tensor | None = None,
    keep_logprobs: bool = False,
) -> tuple[ArmScores, torch.Tensor | None]:
    """Score every trace (one batch) with one arm; returns the scores and, with
    `keep_logprobs`, the (traces, length, vocab) log-probabilities (for the dense arm)."""
    ids = torch.tensor([t.ids for t in traces], dtype=torch.long)
    rows, length = ids.shape
    limit = length + 1 if arm.dense else budget
    cache = RandKVCache(
        model,
        RandKVConfig(budget=max(limit, max(t.prompt for t in traces) + 1), buffer_size=buffer,
                     seed=seed),
        request_keys=[f"real:{seed}:{t.name}" for t in traces],
        prompt_lengths=[t.prompt for t in traces],
        selector=arm.selector(),
        track_positions=True,
    )  # fmt: skip
    nll = torch.full((rows, length), float("nan"))
    top1 = torch.full((rows, length), -1, dtype=torch.long)
    kl = torch.full((rows, length), float("nan")) if dense_logprobs is not None else None
    agree = torch.zeros((rows, length), dtype=torch.bool) if dense_logprobs is not None else None
    vocab = int(model.config.get_text_config(decoder=True).vocab_size)
    full = torch.full((rows, length, vocab), float("nan")) if keep_logprobs else None

    def on_chunk(start: int, logprobs: torch.Tensor) -> None:
        cols = logprobs.shape[1]
        at = slice(start + 1, start + 1 + cols)  # the positions these columns predict
        target = ids[:, at]
        nll[:, at] = -logprobs.gather(-1, target[..., None])[..., 0]
        top1[:, at] = logprobs.argmax(-1)
        if dense_logprobs is not None:
            assert kl is not None and agree is not None
            dense = dense_logprobs[:, at]
            kl[:, at] = (dense.exp() * (dense - logprobs)).sum(-1).clamp(min=0.0)
            agree[:, at] = dense.argmax(-1) == top1[:, at]
        if full is not None:
            full[:, at] = logprobs

    score_sequences(model, ids, cache, on_chunk)
    scores = ArmScores(
        evictor=name,
        budget=None if arm.dense else budget,
        seed=seed if arm.random else None,
        nll=nll,
        top1=top1,
        kl=kl,
        agree=agree,
        held=_held(cache, traces),
        rounds=[cache.rounds(b) for b in range(rows)],
        eviction_seconds=cache.eviction_seconds,
    )
    return scores, full


def _held(cache: RandKVCache, traces: Sequence[Trace]) -> dict[str, list[float]]:
    """fact -> per trace, the share of (layer, KV head) holding a token of its statements."""
    positions = cache.positions
    assert positions is not None
    out: dict[str, list[float]] = {}
    for b, trace in enumerate(traces):
        for fact, starts in trace.stated_at.items():
            size = trace.statement_tokens.get(fact, 0)
            wanted = torch.tensor([s + i for s in starts for i in range(size)], dtype=torch.long)
            if wanted.numel() == 0:
                continue
            held = torch.isin(positions[b], wanted).any(-1)  # (layers, kv_heads)
            out.setdefault(fact, []).append(float(held.float().mean()))
    return out
