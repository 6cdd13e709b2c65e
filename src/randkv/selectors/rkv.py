"""R-KV: attention importance minus key redundancy (Cai et al. 2025, arXiv 2505.24133)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from randkv.selectors.base import PromptChoice, ScoredSelector
from randkv.selectors.pooling import check_odd_kernel, pool_by_position, window_queries
from randkv.selectors.view import AttentionStep, RoundView

__all__ = ["RKV"]


@dataclass(frozen=True)
class RKV(PromptChoice, ScoredSelector):
    """Score = lam * importance - (1 - lam) * redundancy; the r lowest candidates go.

    - Importance: attention each token receives from the observation window (the recent
      queries), averaged over the window's queries and the query heads of its KV head's group,
      then max-pooled over `kernel` neighbouring positions (in position order).
    - Redundancy: cosine similarity of the token's cached key with every other older-than-the-
      window key of its head; for each token, its similarity to the newest token it resembles
      (above `threshold`) is zeroed, so that the newest of a group of similar tokens is not
      penalised for the older ones; the mean over the others, softmax-normalised over the
      tokens of the head.

    Adapted to the per-head cadence: R-KV compresses every time its buffer fills, observing
    the last 8 queries; here each round is one such compression and the window is the buffer,
    the r tokens written since the previous round (as for SnapKV). The prompt is protected by
    default (the same candidates as RandKV).
    """

    lam: float = 0.1
    kernel: int = 7
    threshold: float = 0.5
    label = "rkv"
    needs_positions = True
    needs_attention = True
    needs_keys = True
    resets_after_round = True

    def __post_init__(self) -> None:
        check_odd_kernel(self.kernel)

    def observe(self, step: AttentionStep, statistic: torch.Tensor) -> None:
        window = window_queries(step)
        if window is not None:
            heads = step.weights.shape[1] // step.num_kv_heads
            # The mean over the window's r queries, however many of them this forward holds
            # (one per decode step, or all r in a chunked forward).
            votes = step.received(window) / (heads * step.config.buffer_size)
            statistic[..., : votes.shape[-1]] += votes

    def score(self, view: RoundView) -> torch.Tensor:
        limit = view.config.compacted_length
        positions = view.need("positions")[..., :limit]
        importance = pool_by_position(
            view.need("attention")[..., :limit], positions, self.kernel,
            torch.nn.functional.max_pool1d,
        )  # fmt: skip
        redundancy = self._redundancy(view.need("keys")[..., :limit, :], positions)
        return self.lam * importance - (1 - self.lam) * redundancy

    def _redundancy(self, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        unit = keys / keys.norm(dim=-1, keepdim=True).clamp(min=1e-8)
        similar = unit @ unit.transpose(-1, -2)  # (..., slots, slots)
        similar.diagonal(dim1=-2, dim2=-1).fill_(0.0)
        over = similar > self.threshold
        # The newest (by position) token each token resembles keeps its similarity at zero.
        newest = torch.where(over, positions[..., None, :], -1).argmax(-1, keepdim=True)
        resembles = over.gather(-1, newest)
        similar.scatter_(-1, newest, torch.where(resembles, 0.0, similar.gather(-1, newest)))
        return similar.mean(-1).softmax(-1)
