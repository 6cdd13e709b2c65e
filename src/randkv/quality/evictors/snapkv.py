"""SnapKV: observation-window voting with pooling (Li et al. 2024, arXiv 2404.14469)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from randkv.hf.cache import RandKVCache
from randkv.planner import RoundPlan
from randkv.quality.evictors.base import AttentionScored, lowest

__all__ = ["SnapKV"]


class SnapKV(AttentionScored):
    """Score = attention from the observation window, the r newest tokens (exactly the tokens
    written since the previous round, which sit in slots K + r .. K + 2r - 1), summed over the
    window's queries and the query heads of each KV head's group, then pooled over neighbouring
    positions (the paper's clustering step; average pooling with kernel 5, the defaults of the
    authors' code) so that kept tokens come with their context. Each round empties the r
    lowest-scoring candidates.

    SnapKV compresses the prompt once after prefill; applied on the decode cadence, every
    round is one SnapKV compression whose window is the buffer. The prompt is protected by
    default (the same candidates as RandKV).
    """

    def __init__(self, protect_prompt: bool = True, kernel: int = 5) -> None:
        super().__init__()
        if kernel % 2 == 0:
            raise ValueError("the pooling kernel must be odd")
        self.protects_prompt = protect_prompt
        self.kernel = kernel
        self.name = "snapkv" if protect_prompt else "snapkv-noprompt"

    def observe(self, cache: RandKVCache, layer: int, weights: torch.Tensor) -> None:
        scores = self._scores(cache)
        # Only queries in the buffer slots vote: the window of the next round.
        window = (cache.last_query_slots >= cache.config.compacted_length).float()
        if not bool(window.any()):
            return
        grouped = self.per_kv_head(cache, weights)
        votes = torch.einsum("bhqs,bq->bhs", grouped, window)
        scores[:, layer, :, : votes.shape[-1]] += votes

    def select(
        self, cache: RandKVCache, rows: Sequence[int], round_indices: Sequence[int]
    ) -> torch.Tensor:
        positions = cache.positions
        if positions is None:
            raise ValueError("SnapKV needs RandKVCache(track_positions=True) for its pooling")
        limit = cache.config.max_physical_length
        rows_t = torch.tensor(list(rows))
        votes = self._scores(cache)[rows_t][..., :limit]
        # Pool in position order: slot order is arbitrary after hole-filling rounds.
        order = positions[rows_t][..., :limit].argsort(dim=-1)
        in_order = votes.gather(-1, order)
        flat = in_order.reshape(-1, 1, limit)
        pad = self.kernel // 2
        pooled = torch.nn.functional.avg_pool1d(flat, self.kernel, stride=1, padding=pad)
        pooled = pooled.reshape(in_order.shape)
        smoothed = torch.empty_like(votes).scatter_(-1, order, pooled)
        candidates = cache.config.compacted_length
        allowed = self.candidates(cache, rows)[:, None, None, :].expand(
            *votes.shape[:3], candidates
        )
        return lowest(smoothed[..., :candidates], allowed, cache.config.buffer_size)

    def after_round(self, cache: RandKVCache, rows: torch.Tensor, plan: RoundPlan) -> None:
        # A new observation window starts: the next round's votes come from the next r tokens.
        self._scores(cache)[rows] = 0.0
