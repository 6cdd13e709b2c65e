"""RandKV (Random Attention, arXiv 2609.03430): the default selector of `RandKVCache`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import torch

from randkv.kernels.planner import RoundPlanner
from randkv.selectors.base import PromptChoice
from randkv.selectors.view import RoundView
from randkv.spec.config import RandKVConfig

__all__ = ["RandKV", "SharedRandKV"]


@lru_cache(maxsize=16)
def _planner(
    config: RandKVConfig, layers: Sequence[int], kv_heads: Sequence[int], device: torch.device
) -> RoundPlanner:
    return RoundPlanner(config, layers, kv_heads, device)


@dataclass(frozen=True)
class RandKV(PromptChoice):
    """Uniform random candidates per KV head, drawn by the shipped planner (`randkv.spec`).

    With ``protect_prompt=True`` (the default) this is the policy itself, bit for bit the
    spec's decisions. ``protect_prompt=False`` is the ablation: the same hash draws over all
    of [0, K + r) (the planner with prompt length 0), so prompt tokens can go too.
    """

    label = "randkv"
    random = True

    def select(self, view: RoundView) -> torch.Tensor:
        planner = _planner(view.config, view.layers, view.kv_heads, view.device)
        return planner.plan(self.first_slot(view), view.request_keys, view.round_indices).evicted


@dataclass(frozen=True)
class SharedRandKV(RandKV):
    """Ablation: one uniform draw per layer, shared by all its KV heads (the draw of KV head
    0 of the shipped planner, applied to every head). Isolates the cross-head independence
    argument: with it, a token is either kept in every head of a layer or in none."""

    label = "randkv-shared"

    def select(self, view: RoundView) -> torch.Tensor:
        evicted = super().select(view)
        return evicted[:, :, :1].expand_as(evicted).contiguous()
