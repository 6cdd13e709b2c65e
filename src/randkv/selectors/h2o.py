"""H2O: heavy hitters by accumulated attention + a recent window (Zhang et al. 2023,
arXiv 2306.14048)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from randkv.selectors.base import PromptChoice, ScoredSelector
from randkv.selectors.view import AttentionStep, RoundView

__all__ = ["H2O"]


@dataclass(frozen=True)
class H2O(PromptChoice, ScoredSelector):
    """A token's score is the attention it has received, summed over every query so far (and
    over the query heads of its KV head's group). The kept set is `recent_fraction` recent
    tokens, the rest heavy hitters (the paper's default split is half and half); each round
    empties the r lowest-scoring tokens outside the recent part.

    With ``protect_prompt=True`` (the default here) the prompt is kept and the split applies to
    the non-prompt budget: of the K + r - P generated tokens kept after a round, the newest
    part (including the r buffer) is "recent" and the rest are heavy hitters. With False, as
    in the paper, prompt tokens compete like any other token.
    """

    recent_fraction: float = 0.5
    label = "h2o"
    needs_positions = True
    needs_attention = True

    def observe(self, step: AttentionStep, statistic: torch.Tensor) -> None:
        received = step.received(step.query_slots >= 0)  # pad query columns add nothing
        statistic[..., : received.shape[-1]] += received

    def score(self, view: RoundView) -> torch.Tensor:
        return view.need("attention")

    def candidates(self, view: RoundView) -> torch.Tensor:
        r, limit = view.config.buffer_size, view.config.compacted_length
        held = view.need("positions")[..., :limit]  # (n, layers, heads, K + r)
        allowed = super().candidates(view).expand_as(held).clone()
        for i, low in enumerate(self.first_slot(view).tolist()):
            kept = limit - low  # candidate tokens kept after the round, buffer included
            # The newest `recent` of them are the recent window; r of those are the buffer.
            protected = max(0, int(kept * self.recent_fraction) - r)
            if protected:
                newest = held[i, :, :, low:].topk(protected, dim=-1).indices + low
                allowed[i].scatter_(-1, newest, False)
        return allowed
