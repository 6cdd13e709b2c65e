"""What the compactors are checked against: poisoned paged KV caches and a reference
compaction straight from the plan's definition.

Used by `randkv check` (on the machine's own device) and by the kernel tests. A cache is
poisoned with random bit patterns (NaN payloads included), so a stray write or a missed
move shows bitwise (`same_bits`).

Layouts by vLLM's names: "NHD" and "HND" are FlashAttention's (blocks, heads, slots, 2D)
view with the slots or the heads physically first, `KVLayout.BLOCK_HEAD_SLOT`; "split" is
(2, blocks, slots, heads, D), keys then values, `KVLayout.KV_BLOCK_SLOT_HEAD`.
"""

from __future__ import annotations

from typing import Literal

import torch

from randkv.kernels.compactor import KVLayout
from randkv.spec.rounds import RoundPlan

__all__ = [
    "CacheLayout",
    "LAYOUTS",
    "kv_layout",
    "poisoned",
    "poisoned_caches",
    "reference_compact",
    "same_bits",
]

CacheLayout = Literal["NHD", "HND", "split"]
LAYOUTS: tuple[CacheLayout, ...] = ("NHD", "HND", "split")


def kv_layout(layout: CacheLayout) -> KVLayout:
    """The compactors' layout of a cache of `layout`."""
    return KVLayout.KV_BLOCK_SLOT_HEAD if layout == "split" else KVLayout.BLOCK_HEAD_SLOT


def poisoned(
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Random bit patterns (NaN payloads included) of `dtype`: any stray write shows.

    With a `generator` the bits are drawn on its device (then moved), so they depend on its
    seed only; without, on `device` from torch's global generator.
    """
    where = generator.device if generator is not None else device
    size = (*shape[:-1], shape[-1] * dtype.itemsize)
    bits = torch.randint(0, 256, size, dtype=torch.uint8, generator=generator, device=where)
    return bits.to(device).view(dtype)


def poisoned_caches(
    layout: CacheLayout,
    layers: int,
    blocks: int,
    block_size: int,
    heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device | str,
    *,
    generator: torch.Generator | None = None,
) -> list[torch.Tensor]:
    """One poisoned paged cache per layer, as vLLM's backends lay them out (see the module)."""
    caches = []
    for _ in range(layers):
        if layout == "split":
            shape: tuple[int, ...] = (2, blocks, block_size, heads, head_dim)
            caches.append(poisoned(shape, dtype, device, generator=generator))
        elif layout == "NHD":  # physical (blocks, slots, heads, 2D)
            shape = (blocks, block_size, heads, 2 * head_dim)
            caches.append(poisoned(shape, dtype, device, generator=generator).permute(0, 2, 1, 3))
        else:
            shape = (blocks, heads, block_size, 2 * head_dim)
            caches.append(poisoned(shape, dtype, device, generator=generator))
    return caches


def reference_compact(
    layout: KVLayout, plan: RoundPlan, caches: list[torch.Tensor], block_tables: torch.Tensor
) -> None:
    """Apply `plan` to paged `caches` in place straight from its definition: for every
    (request b, layer, head), the token in slot sources[i] moves into slot evicted[b, layer,
    head, i], each slot found through request b's row of `block_tables`.

    One head's r moves at a time (holes and sources never overlap, so they may go together);
    the block size is the caches' own (dimension 2 of both layouts).
    """
    if layout not in (KVLayout.BLOCK_HEAD_SLOT, KVLayout.KV_BLOCK_SLOT_HEAD):
        raise ValueError(f"no reference compaction for {layout}")
    device = caches[0].device
    block_size = caches[0].shape[2]
    evicted, tables = plan.evicted.cpu(), block_tables.cpu()
    batch, layers, heads, _ = evicted.shape
    for b in range(batch):
        sources = plan.row_sources(b).cpu()
        src_block = tables[b, sources // block_size].to(device)
        src_offset = (sources % block_size).to(device)
        for layer in range(layers):
            cache = caches[layer]
            for head in range(heads):
                holes = evicted[b, layer, head]
                dst_block = tables[b, holes // block_size].to(device)
                dst_offset = (holes % block_size).to(device)
                if layout is KVLayout.KV_BLOCK_SLOT_HEAD:
                    for half in (0, 1):
                        moved = cache[half][src_block, src_offset, head]
                        cache[half][dst_block, dst_offset, head] = moved
                else:
                    cache[dst_block, head, dst_offset] = cache[src_block, head, src_offset]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors hold the same bits (NaNs with the same payload are equal)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.view(view), b.view(view))
