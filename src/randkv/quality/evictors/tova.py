"""TOVA: evict by the current query's attention (Oren et al. 2024, arXiv 2401.06104)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from randkv.hf.cache import RandKVCache
from randkv.quality.evictors.base import AttentionScored, lowest

__all__ = ["TOVA"]


class TOVA(AttentionScored):
    """Token Omission Via Attention: score = attention weight from the newest query, averaged
    over all query heads of the layer (the paper's layer-wise variant, so every KV head of a
    layer makes the same choice). TOVA drops one token per step at a fixed cache size; on the
    RandKV cadence each round drops the r lowest-scoring candidates by the newest query's
    weights. The prompt is protected by default (the same candidates as RandKV).
    """

    def __init__(self, protect_prompt: bool = True) -> None:
        super().__init__()
        self.protects_prompt = protect_prompt
        self.name = "tova" if protect_prompt else "tova-noprompt"

    def observe(self, cache: RandKVCache, layer: int, weights: torch.Tensor) -> None:
        scores = self._scores(cache)
        newest = weights[:, :, -1, :].float().mean(1)  # (rows, slots): last column is real
        scores[:, layer] = 0.0
        scores[:, layer, :, : newest.shape[-1]] = newest[:, None, :]

    def select(
        self, cache: RandKVCache, rows: Sequence[int], round_indices: Sequence[int]
    ) -> torch.Tensor:
        limit = cache.config.compacted_length
        rows_t = torch.tensor(list(rows))
        scores = self._scores(cache)[rows_t][..., :limit]
        allowed = self.candidates(cache, rows)[:, None, None, :].expand_as(scores)
        return lowest(scores, allowed, cache.config.buffer_size)
