"""Apply round plans to real paged KV caches: hole-filling, r slot moves per head.

Keys are cached after RoPE, so attention over a request's slots is a set operation
and slot order is free. A round therefore only moves the r newest tokens (slots
K + r .. K + 2r - 1) into the r holes it evicted; nothing else is touched.

Supported layouts, by logical shape (any dense stride order, e.g. vLLM's NHD):
- `BLOCK_HEAD_SLOT`: (num_blocks, num_kv_heads, block_size, X). vLLM 0.28.0's CPU
  backend and its FlashAttention backend (X = 2 * head_size, K and V side by side).
  A dense (batch, heads, seq, head_dim) tensor is this layout with one block per row.
- `KV_BLOCK_SLOT_HEAD`: (2, num_blocks, block_size, num_kv_heads, head_size), K and V
  split on the first dim (FlashAttention's classic layout, vLLM's ROCm backends).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import torch

from randkv.planner import RoundPlan


class KVLayout(enum.Enum):
    BLOCK_HEAD_SLOT = "block_head_slot"
    KV_BLOCK_SLOT_HEAD = "kv_block_slot_head"


def _row_view(cache: torch.Tensor) -> torch.Tensor:
    """All of `cache`'s elements as rows of its last dim, in storage order."""
    if cache.stride(-1) != 1:
        raise ValueError("KV cache's last dim must be contiguous")
    dims = sorted(range(cache.dim()), key=lambda d: cache.stride(d), reverse=True)
    if not cache.permute(*dims).is_contiguous():
        raise ValueError(
            f"KV cache must be dense (a permuted contiguous tensor); strides {cache.stride()}"
        )
    return cache.as_strided(
        (cache.numel() // cache.shape[-1], cache.shape[-1]), (cache.shape[-1], 1)
    )


def _flat_rows(cache: torch.Tensor, indices: Sequence[torch.Tensor]) -> torch.Tensor:
    """Row numbers in `_row_view(cache)` of the elements at `indices` (all dims but last)."""
    offset = indices[0] * cache.stride(0)
    for dim, index in enumerate(indices[1:], start=1):
        offset = offset + index * cache.stride(dim)
    return offset // cache.shape[-1]


def _slot_coordinates(
    slots: torch.Tensor, block_tables: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(block id, offset in block) of each slot; slots are (B, ...) with block_tables (B, M)."""
    batch = slots.shape[0]
    flat = slots.reshape(batch, -1)
    blocks = block_tables.gather(1, flat // block_size).view(slots.shape)
    return blocks, slots % block_size


class PagedCompactor:
    """Moves tokens inside paged KV caches according to round plans.

    Every layer's cache must have the same layout, block size and KV heads (the heads
    of this rank, in the order of the planner's `kv_heads`).
    """

    def __init__(self, layout: KVLayout, block_size: int) -> None:
        self.layout = layout
        self.block_size = block_size

    def moved_bytes(self, plan: RoundPlan, caches: Sequence[torch.Tensor]) -> int:
        """Bytes written by `apply` (keys and values)."""
        per_token = caches[0].shape[-1] * caches[0].element_size()
        if self.layout is KVLayout.KV_BLOCK_SLOT_HEAD:
            per_token *= 2
        return plan.num_moves * per_token

    @torch.inference_mode()
    def apply(
        self, plan: RoundPlan, caches: Sequence[torch.Tensor], block_tables: torch.Tensor
    ) -> None:
        """Apply `plan` to per-layer `caches` (in the plan's layer order), in place.

        block_tables (B, max_blocks) holds each planned request's block ids in row b.
        """
        if len(caches) != plan.evicted.shape[1]:
            raise ValueError(
                f"plan covers {plan.evicted.shape[1]} layers, got {len(caches)} caches"
            )
        if plan.evicted.shape[0] == 0:
            return
        device = caches[0].device
        evicted = plan.evicted.to(device)
        batch, _, heads, r = evicted.shape
        block_tables = block_tables.to(device=device, dtype=torch.int64)
        head_index = torch.arange(heads, device=device)[None, :, None]
        sources = plan.sources.to(device)[None, None, :].expand(batch, heads, r)
        src_blocks, src_offsets = _slot_coordinates(sources, block_tables, self.block_size)
        for layer, cache in enumerate(caches):
            dst_blocks, dst_offsets = _slot_coordinates(
                evicted[:, layer], block_tables, self.block_size
            )
            if self.layout is KVLayout.BLOCK_HEAD_SLOT:
                self._move(
                    cache,
                    (src_blocks, head_index, src_offsets),
                    (dst_blocks, head_index, dst_offsets),
                )
            else:
                for half in (cache[0], cache[1]):
                    self._move(
                        half,
                        (src_blocks, src_offsets, head_index),
                        (dst_blocks, dst_offsets, head_index),
                    )

    @staticmethod
    def _move(
        cache: torch.Tensor, source: Sequence[torch.Tensor], dest: Sequence[torch.Tensor]
    ) -> None:
        rows = _row_view(cache)
        src = _flat_rows(cache, source).reshape(-1)
        dst = _flat_rows(cache, dest).reshape(-1)
        # Sources (slots >= K + r) and holes (< K + r) never overlap: one gather, one scatter.
        rows.index_copy_(0, dst, rows.index_select(0, src))
