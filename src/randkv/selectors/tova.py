"""TOVA: evict by the current query's attention (Oren et al. 2024, arXiv 2401.06104)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from randkv.selectors.base import PromptChoice, ScoredSelector
from randkv.selectors.view import AttentionStep, RoundView

__all__ = ["TOVA"]


@dataclass(frozen=True)
class TOVA(PromptChoice, ScoredSelector):
    """Token Omission Via Attention: score = attention weight from the newest query, averaged
    over all query heads of the layer (the paper's layer-wise variant, so every KV head of a
    layer makes the same choice). TOVA drops one token per step at a fixed cache size; on the
    RandKV cadence each round drops the r lowest-scoring candidates by the newest query's
    weights. The prompt is protected by default (the same candidates as RandKV).
    """

    label = "tova"
    needs_attention = True

    def observe(self, step: AttentionStep, statistic: torch.Tensor) -> None:
        newest = step.weights[:, :, -1, :].float().mean(1)  # (rows, slots): last column is real
        statistic[:] = 0.0
        statistic[..., : newest.shape[-1]] = newest[:, None, :]

    def score(self, view: RoundView) -> torch.Tensor:
        return view.need("attention")
