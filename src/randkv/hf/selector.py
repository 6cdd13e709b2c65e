"""Pluggable selection for `RandKVCache`: other eviction policies on RandKV's cadence.

A `RandKVCache` built with ``selector=None`` (the default) draws its rounds from the RandKV
spec. With a selector, everything else stays the same (a round fires when a row's physical
length reaches K + 2r; the r newest tokens, in slots K + r .. K + 2r - 1, move into the r slots
the round empties; the physical length drops to K + r), but the selector chooses which r slots
of [0, K + r) each (row, layer, KV head) empties. Selectors that read attention observe it
through `RandKVCache.last_query_slots` and their own forward hooks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from randkv.hf.cache import RandKVCache
    from randkv.planner import RoundPlan

__all__ = ["EvictionSelector"]


@runtime_checkable
class EvictionSelector(Protocol):
    """Chooses the slots a round empties."""

    def select(
        self, cache: RandKVCache, rows: Sequence[int], round_indices: Sequence[int]
    ) -> torch.Tensor:
        """Slots to empty: int64 (len(rows), layers, kv_heads, r), values in [0, K + r),
        distinct within each (row, layer, head). Called before the round is applied, so
        `cache.slot_positions`-style state (`cache.positions`) still shows the full buffer."""
        ...

    def after_round(self, cache: RandKVCache, rows: torch.Tensor, plan: RoundPlan) -> None:
        """Called once the round is applied (rows: int64 row indices), so per-slot state the
        selector keeps can follow the moves: slot plan.sources[i] moved to plan.evicted[..., i].
        """
        ...
