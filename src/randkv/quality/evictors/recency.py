"""Position-only baselines: StreamingLLM's sink + recent window, and prompt + recent window."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from randkv.hf.cache import RandKVCache
from randkv.quality.evictors.base import Evictor, lowest

__all__ = ["PromptWindow", "StreamingLLM"]


def _oldest(cache: RandKVCache, rows: Sequence[int], allowed: torch.Tensor) -> torch.Tensor:
    """Per (row, layer, head): the r allowed slots holding the oldest positions."""
    positions = cache.positions
    if positions is None:
        raise ValueError("position-based evictors need RandKVCache(track_positions=True)")
    limit = cache.config.compacted_length
    held = positions[torch.tensor(list(rows))][..., :limit].float()
    return lowest(held, allowed[:, None, None, :].expand_as(held), cache.config.buffer_size)


class StreamingLLM(Evictor):
    """Attention sinks + sliding window (Xiao et al. 2023, arXiv 2309.17453).

    Keeps the first `sinks` positions (4 in the paper) and the most recent tokens: each round
    empties the r oldest non-sink slots. The prompt is not protected beyond the sinks.
    """

    name = "streamingllm"
    protects_prompt = False

    def __init__(self, sinks: int = 4) -> None:
        self.sinks = sinks

    def first_candidate(self, cache: RandKVCache, row: int) -> int:
        # Slots 0 .. sinks - 1 hold positions 0 .. sinks - 1 forever: they are never emptied.
        return self.sinks

    def select(
        self, cache: RandKVCache, rows: Sequence[int], round_indices: Sequence[int]
    ) -> torch.Tensor:
        return _oldest(cache, rows, self.candidates(cache, rows))


class PromptWindow(Evictor):
    """Control: the whole prompt + the most recent tokens (StreamingLLM with the prompt as
    its sink). Each round empties the r oldest generated tokens."""

    name = "window"

    def select(
        self, cache: RandKVCache, rows: Sequence[int], round_indices: Sequence[int]
    ) -> torch.Tensor:
        return _oldest(cache, rows, self.candidates(cache, rows))
