"""Shared machinery of the benchmark's evictors.

Every evictor is an `randkv.hf.selector.EvictionSelector`: it runs inside `RandKVCache` on the
RandKV cadence (a round fires when a row's physical length reaches K + 2r and empties r slots
per (layer, KV head); the r newest tokens are always kept) and differs only in *which* r slots
of [0, K + r) it empties. The budget therefore counts the prompt for every method: K + r
tokens per head after a round, K + 2r at most.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from randkv.hf.cache import RandKVCache
from randkv.planner import RoundPlan

__all__ = [
    "AttentionScored",
    "Evictor",
    "attention_hooks",
    "lowest",
]


class Evictor:
    """Base class: a named selection rule (subclasses implement `select`)."""

    name = "evictor"
    #: True when the rule never evicts prompt tokens (its candidates start at slot P).
    protects_prompt = True
    #: True when the rule reads attention weights (needs eager attention and the hooks).
    needs_attention = False
    #: True when its decisions depend on the eviction seed.
    random = False

    def select(
        self, cache: RandKVCache, rows: Sequence[int], round_indices: Sequence[int]
    ) -> torch.Tensor:
        raise NotImplementedError

    def after_round(self, cache: RandKVCache, rows: torch.Tensor, plan: RoundPlan) -> None:
        """Stateless rules keep nothing per slot."""

    def observe(self, cache: RandKVCache, layer: int, weights: torch.Tensor) -> None:
        """Attention weights (rows, query heads, queries, slots) of one layer's forward."""

    def first_candidate(self, cache: RandKVCache, row: int) -> int:
        """Lowest evictable slot of a row: P when the prompt is protected, else 0."""
        if not self.protects_prompt:
            return 0
        prompt = cache.prompt_length(row)
        assert prompt is not None
        return prompt

    def candidates(self, cache: RandKVCache, rows: Sequence[int]) -> torch.Tensor:
        """Bool (rows, K + r): slots this rule may empty (the r newest never are)."""
        limit = cache.config.compacted_length
        lows = torch.tensor([self.first_candidate(cache, b) for b in rows])
        return torch.arange(limit)[None, :] >= lows[:, None]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def lowest(scores: torch.Tensor, allowed: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the `count` lowest scores among `allowed` entries of the last dimension.

    Ties go to the lower index (stable sort), so decisions are deterministic.
    """
    masked = scores.masked_fill(~allowed, float("inf"))
    order = torch.sort(masked, dim=-1, stable=True).indices[..., :count]
    taken = allowed.gather(-1, order)
    if not bool(taken.all()):
        raise ValueError(f"fewer than {count} evictable slots in some (row, layer, head)")
    return order


class AttentionScored(Evictor):
    """An evictor that keeps one float score per (row, layer, KV head, slot).

    Scores follow their tokens through the hole-filling moves of every round.
    """

    needs_attention = True

    def __init__(self) -> None:
        self.scores: torch.Tensor | None = None

    def _scores(self, cache: RandKVCache) -> torch.Tensor:
        if self.scores is None or self.scores.shape[0] != cache.batch_rows:
            self.scores = torch.zeros(
                cache.batch_rows,
                cache.num_layers,
                cache.num_kv_heads,
                cache.config.max_physical_length,
            )
        return self.scores

    @staticmethod
    def per_kv_head(cache: RandKVCache, weights: torch.Tensor) -> torch.Tensor:
        """Sum the query heads of each KV head's group: (rows, kv_heads, queries, slots)."""
        rows, heads, queries, slots = weights.shape
        group = heads // cache.num_kv_heads
        return weights.float().view(rows, cache.num_kv_heads, group, queries, slots).sum(2)

    def after_round(self, cache: RandKVCache, rows: torch.Tensor, plan: RoundPlan) -> None:
        scores = self._scores(cache)
        held = scores[rows]
        evicted = plan.evicted.cpu()
        held.scatter_(3, evicted, held[..., plan.sources.cpu()])
        held[..., cache.config.compacted_length :] = 0.0
        scores[rows] = held


@contextlib.contextmanager
def attention_hooks(model: Any, cache: RandKVCache, evictor: Evictor) -> Iterator[None]:
    """Feed every attention layer's weights to `evictor.observe` while the block runs.

    Needs a model loaded with attn_implementation="eager" (the only path that returns the
    weights). A no-op for evictors that do not read attention.
    """
    if not evictor.needs_attention:
        yield
        return
    if getattr(model.config, "_attn_implementation", None) != "eager":
        raise ValueError(
            f"{evictor.name} reads attention weights: load the model with "
            "attn_implementation='eager'"
        )
    handles = []

    def hook(module: Any, args: Any, output: Any) -> None:
        weights = output[1]
        if weights is None:
            raise RuntimeError("the attention layer returned no weights")
        evictor.observe(cache, module.layer_idx, weights.detach())

    for module in model.modules():
        if hasattr(module, "layer_idx") and hasattr(module, "q_proj"):
            handles.append(module.register_forward_hook(hook))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
