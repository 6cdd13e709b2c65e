"""SnapKV: observation-window voting with pooling (Li et al. 2024, arXiv 2404.14469)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from randkv.selectors.base import PromptChoice, ScoredSelector
from randkv.selectors.pooling import check_odd_kernel, pool_by_position, window_queries
from randkv.selectors.view import AttentionStep, RoundView

__all__ = ["SnapKV"]


@dataclass(frozen=True)
class SnapKV(PromptChoice, ScoredSelector):
    """Score = attention from the observation window, the r newest tokens (exactly the tokens
    written since the previous round, which sit in slots K + r .. K + 2r - 1), summed over the
    window's queries and the query heads of each KV head's group, then average-pooled over
    `kernel` neighbouring positions (the paper's clustering step; 5 is the authors' default)
    so that kept tokens come with their context. Each round empties the r lowest candidates.

    SnapKV compresses the prompt once after prefill; applied on the decode cadence, every
    round is one SnapKV compression whose window is the buffer. The prompt is protected by
    default (the same candidates as RandKV).
    """

    kernel: int = 5
    label = "snapkv"
    needs_positions = True
    needs_attention = True
    resets_after_round = True  # the next round's votes come from the next r tokens

    def __post_init__(self) -> None:
        check_odd_kernel(self.kernel)

    def observe(self, step: AttentionStep, statistic: torch.Tensor) -> None:
        window = window_queries(step)  # only the next round's observation window votes
        if window is not None:
            votes = step.received(window)
            statistic[..., : votes.shape[-1]] += votes

    def score(self, view: RoundView) -> torch.Tensor:
        return pool_by_position(
            view.need("attention"), view.need("positions"), self.kernel,
            torch.nn.functional.avg_pool1d,
        )  # fmt: skip
