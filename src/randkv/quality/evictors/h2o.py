"""H2O: heavy hitters by accumulated attention + a recent window (Zhang et al. 2023,
arXiv 2306.14048)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from randkv.hf.cache import RandKVCache
from randkv.quality.evictors.base import AttentionScored, lowest

__all__ = ["H2O"]


class H2O(AttentionScored):
    """Each token's score is the attention it has received, summed over every query so far
    (and over the query heads of its KV head's group). The kept set is half recent tokens,
    half heavy hitters (the paper's default split); each round empties the r lowest-scoring
    tokens outside the recent half.

    With ``protect_prompt=True`` (the default here) the prompt is kept and the split applies to
    the non-prompt budget: of the K + r - P generated tokens kept after a round, the newest half
    (including the r buffer) are kept as "recent" and the rest are heavy hitters. With False,
    as in the paper, prompt tokens compete like any other token.
    """

    def __init__(self, protect_prompt: bool = True, recent_fraction: float = 0.5) -> None:
        super().__init__()
        self.protects_prompt = protect_prompt
        self.recent_fraction = recent_fraction
        self.name = "h2o" if protect_prompt else "h2o-noprompt"

    def observe(self, cache: RandKVCache, layer: int, weights: torch.Tensor) -> None:
        scores = self._scores(cache)
        real = (cache.last_query_slots >= 0).float()  # pad query columns add nothing
        grouped = self.per_kv_head(cache, weights)  # (rows, kv_heads, queries, slots)
        received = torch.einsum("bhqs,bq->bhs", grouped, real)
        scores[:, layer, :, : received.shape[-1]] += received

    def select(
        self, cache: RandKVCache, rows: Sequence[int], round_indices: Sequence[int]
    ) -> torch.Tensor:
        positions = cache.positions
        if positions is None:
            raise ValueError("H2O needs RandKVCache(track_positions=True) for its recent window")
        r, limit = cache.config.buffer_size, cache.config.compacted_length
        rows_t = torch.tensor(list(rows))
        allowed = self.candidates(cache, rows)  # (rows, K + r)
        held = positions[rows_t][..., :limit]  # (rows, layers, heads, K + r)
        allowed = allowed[:, None, None, :].expand_as(held).clone()
        for i, row in enumerate(rows):
            low = self.first_candidate(cache, row)
            kept = limit - low  # candidate tokens kept after the round, buffer included
            # The newest `recent` of them are the recent window; r of those are the buffer.
            protected = max(0, int(kept * self.recent_fraction) - r)
            if protected:
                newest = held[i, :, :, low:].topk(protected, dim=-1).indices + low
                allowed[i].scatter_(-1, newest, False)
        return lowest(self._scores(cache)[rows_t][..., :limit], allowed, r)
