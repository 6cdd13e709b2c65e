"""What a policy may read: one round's view of the due rows, and one layer's attention step."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from randkv.spec.config import RandKVConfig

__all__ = ["AttentionStep", "RoundView"]


@dataclass(frozen=True)
class RoundView:
    """What a policy may read to choose one round's evictions, batched over the n rows due.

    Tensors are on CPU except where noted. Fields a policy did not declare a need for are
    None. The view is valid during `Selector.select` only: the cache then applies the round
    to `positions` and `attention` in place. Keys (for redundancy scores) are gathered only
    for a policy that declares `needs_keys`; what an oracle knows of the future is its own
    field, not the view's.
    """

    config: RandKVConfig
    rows: torch.Tensor  # (n,) int64: the cache's batch rows due for a round
    round_indices: torch.Tensor  # (n,) int64: 0-based index of each row's round
    prompt_lengths: torch.Tensor  # (n,) int64
    request_keys: torch.Tensor  # (n,) int64 bit patterns of the unsigned 64-bit keys
    layers: tuple[int, ...]  # global layer index of each entry of dimension 1
    kv_heads: tuple[int, ...]  # global KV head index of each entry of dimension 2
    device: torch.device  # where the KV cache lives (the choice may be made anywhere)
    #: (n, layers, kv_heads, K + 2r) int64: the absolute position each slot holds.
    positions: torch.Tensor | None = None
    #: (n, layers, kv_heads, K + 2r) float32: the statistic the policy's `observe` keeps.
    attention: torch.Tensor | None = None
    #: (n, layers, kv_heads, K + 2r, head_dim) float32: the cached (rotated) key of each slot.
    keys: torch.Tensor | None = None

    def need(self, name: str) -> torch.Tensor:
        """The optional field `name`, or a ValueError saying how to get it."""
        value = getattr(self, name)
        if value is None:
            raise ValueError(
                f"this policy reads {name}: declare needs_{name} = True on it (and keep "
                "RandKVCache(track_positions=True); attention comes from attention_hooks)"
            )
        return value

    def slots_from(self, first: torch.Tensor) -> torch.Tensor:
        """Bool (n, 1, 1, K + r): per row, the slots [first, K + r) a round may empty (the
        r newest tokens, in slots K + r .. K + 2r - 1, never are)."""
        limit = self.config.compacted_length
        return (torch.arange(limit)[None, :] >= first[:, None])[:, None, None, :]


@dataclass(frozen=True)
class AttentionStep:
    """One layer's attention weights in one forward, as an attention-reading policy sees it."""

    config: RandKVConfig
    layer: int
    weights: torch.Tensor  # (rows, query heads, queries, slots) float32, on CPU
    query_slots: torch.Tensor  # (rows, queries) int64: each query column's slot, -1 for pads
    num_kv_heads: int

    def per_kv_head(self) -> torch.Tensor:
        """Weights summed over each KV head's group of query heads: (rows, kv_heads, q, slots)."""
        rows, heads, queries, slots = self.weights.shape
        group = heads // self.num_kv_heads
        return self.weights.float().view(rows, self.num_kv_heads, group, queries, slots).sum(2)

    def received(self, queries: torch.Tensor) -> torch.Tensor:
        """Attention each slot received from the chosen query columns (bool (rows, queries)),
        summed over them and over its KV head's group: (rows, kv_heads, slots)."""
        return torch.einsum("bhqs,bq->bhs", self.per_kv_head(), queries.float())
