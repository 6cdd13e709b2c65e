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
- `VLLM_CPU_VEC`: vLLM 0.28.0's CPU attention with its `vec`/`vec16` kernels. The tensor
  is declared (num_blocks, num_kv_heads, block_size, 2 * head_size), but inside each
  (block, head) the kernels store K column-major as [head_size, block_size] followed by
  V row-major as [block_size, head_size]; a token's K is strided, its V contiguous.

Every layout's cache must hold exactly `block_size` slots per block (`check_caches`);
a backend that splits allocation blocks into smaller kernel blocks is refused. `apply`
makes no host sync: host block tables go to the device pinned and non-blocking, and
nothing is read back. On CUDA, `randkv.kernels.triton_compactor.TritonCompactor` does the same
moves in one kernel launch.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

import torch

from randkv.kernels.hostsync import host_to_device
from randkv.spec.rounds import RoundPlan


class KVLayout(enum.Enum):
    BLOCK_HEAD_SLOT = "block_head_slot"
    KV_BLOCK_SLOT_HEAD = "kv_block_slot_head"
    VLLM_CPU_VEC = "vllm_cpu_vec"


def cpu_vec_token_elements(
    block_size: int, head_size: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Offsets, inside one (block, head) of the VLLM_CPU_VEC layout, of each token's K then V.

    Row t lists the 2 * head_size elements that hold token t (t = offset in the block).
    """
    token = torch.arange(block_size, device=device)[:, None]
    dim = torch.arange(head_size, device=device)[None, :]
    keys = dim * block_size + token  # column-major [head_size, block_size]
    values = block_size * head_size + token * head_size + dim  # row-major after K
    return torch.cat((keys, values), dim=1)


# Row copies run per element: reinterpreting rows as the widest type that divides them
# makes index_copy_ several times faster. Copies move bits, never arithmetic.
_WIDE_TYPES = (torch.complex128, torch.int64, torch.int32, torch.int16, torch.uint8)


def _row_view(cache: torch.Tensor) -> torch.Tensor:
    """All of `cache`'s elements as rows of its last dim, in storage order, bit-viewed."""
    if cache.stride(-1) != 1:
        raise ValueError("the KV cache's last dim must be contiguous")
    order = sorted(range(cache.dim()), key=lambda d: cache.stride(d), reverse=True)
    if not cache.permute(*order).is_contiguous():
        raise ValueError(
            f"the KV cache must be dense (a permuted contiguous tensor); strides {cache.stride()}"
        )
    width = cache.shape[-1]
    rows = cache.as_strided((cache.numel() // width, width), (width, 1))
    row_bytes = width * cache.element_size()
    offset_bytes = cache.storage_offset() * cache.element_size()
    for wide in _WIDE_TYPES:
        size = torch.empty((), dtype=wide).element_size()
        if row_bytes % size == 0 and offset_bytes % size == 0:
            return rows.view(torch.uint8).view(wide)
    return rows


def _row_numbers(cache: torch.Tensor, indices: Sequence[torch.Tensor]) -> torch.Tensor:
    """Row numbers in `_row_view(cache)` of the elements at `indices` (all dims but last)."""
    offset = indices[0] * cache.stride(0)
    for dim, index in enumerate(indices[1:], start=1):
        offset = offset + index * cache.stride(dim)
    return offset // cache.shape[-1]


def _on_device(
    plan: RoundPlan, block_tables: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The plan's tensors and the block tables on `device`, without a host sync."""
    tables = host_to_device(block_tables.to(torch.int64), device)
    return host_to_device(plan.evicted, device), host_to_device(plan.sources, device), tables


def _per_request(sources: torch.Tensor, batch: int) -> torch.Tensor:
    """Source slots as (B, 1, 1, r): shared (r,) ones, or one row per request (B, r)."""
    if sources.dim() == 1:
        return sources[None, None, None, :].expand(batch, 1, 1, -1)
    return sources[:, None, None, :]


def _slot_coordinates(
    slots: torch.Tensor, block_tables: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(block id, offset in block) of each slot; slots are (B, ...) with block_tables (B, M)."""
    batch = slots.shape[0]
    blocks = block_tables.gather(1, (slots // block_size).reshape(batch, -1))
    return blocks.view(slots.shape), slots % block_size


def moved_bytes(layout: KVLayout, plan: RoundPlan, caches: Sequence[torch.Tensor]) -> int:
    """Bytes a compactor writes applying `plan` to `caches` (keys and values)."""
    per_token = caches[0].shape[-1] * caches[0].element_size()
    if layout is KVLayout.KV_BLOCK_SLOT_HEAD:
        per_token *= 2
    return plan.num_moves * per_token


def cache_geometry(layout: KVLayout, cache: torch.Tensor) -> tuple[int, int]:
    """(slots per block, KV heads) of one layer's cache in `layout`."""
    if layout is KVLayout.KV_BLOCK_SLOT_HEAD:
        if cache.dim() != 5 or cache.shape[0] != 2:
            raise ValueError(
                f"layout {layout.value} expects (2, num_blocks, block_size, num_kv_heads, "
                f"head_size), got a KV cache of shape {tuple(cache.shape)}"
            )
        return cache.shape[2], cache.shape[3]
    if cache.dim() != 4:
        raise ValueError(
            f"layout {layout.value} expects (num_blocks, num_kv_heads, block_size, X), "
            f"got a KV cache of shape {tuple(cache.shape)}"
        )
    return cache.shape[2], cache.shape[1]


def check_caches(
    layout: KVLayout, block_size: int, plan: RoundPlan, caches: Sequence[torch.Tensor]
) -> None:
    """Refuse caches a compactor would index wrongly (shared by every compactor)."""
    if len(caches) != plan.evicted.shape[1]:
        raise ValueError(f"plan covers {plan.evicted.shape[1]} layers, got {len(caches)} caches")
    if not caches:
        return
    first = caches[0]
    if any(
        c.shape != first.shape
        or c.stride() != first.stride()
        or c.dtype != first.dtype
        or c.device != first.device
        for c in caches
    ):
        raise ValueError(
            "all layers' KV caches must share one shape, stride order, dtype and device"
        )
    found, heads = cache_geometry(layout, first)
    if found != block_size:
        # vLLM splits each allocation block into kernel blocks when the attention
        # backend's kernel block size differs; block ids then index the wrong slots.
        raise ValueError(
            f"the KV cache holds {found} slots per block but the compactor's block size is "
            f"{block_size} (cache_config.block_size): the attention backend splits each "
            "allocation block into kernel blocks, which RandKV cannot compact. Use a block "
            "size the backend supports as its kernel block size (e.g. --block-size 16) or "
            "the FlashAttention backend"
        )
    if heads != plan.evicted.shape[2]:
        raise ValueError(
            f"plan covers {plan.evicted.shape[2]} KV heads, the KV caches hold {heads}"
        )


class Compactor(Protocol):
    """What applies round plans to paged caches: `PagedCompactor` (torch) and
    `randkv.kernels.triton_compactor.TritonCompactor` (one Triton launch)."""

    def moved_bytes(self, plan: RoundPlan, caches: Sequence[torch.Tensor]) -> int: ...

    def apply(
        self, plan: RoundPlan, caches: Sequence[torch.Tensor], block_tables: torch.Tensor
    ) -> None: ...


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
        return moved_bytes(self.layout, plan, caches)

    @torch.inference_mode()
    def apply(
        self, plan: RoundPlan, caches: Sequence[torch.Tensor], block_tables: torch.Tensor
    ) -> None:
        """Apply `plan` to per-layer `caches` (in the plan's layer order), in place.

        block_tables (B, max_blocks) holds each planned request's block ids in row b.
        """
        check_caches(self.layout, self.block_size, plan, caches)
        if plan.evicted.shape[0] == 0:
            return
        first = caches[0]
        if self.layout is KVLayout.VLLM_CPU_VEC:
            self._apply_cpu_vec(plan, caches, block_tables)
            return
        sources, holes = self._rows(plan, first, block_tables)
        # Sources (slots >= K + r) and holes (< K + r) never overlap: gather, then scatter.
        for layer, cache in enumerate(caches):
            rows = _row_view(cache)
            rows.index_copy_(0, holes[layer], rows.index_select(0, sources))

    def _apply_cpu_vec(
        self, plan: RoundPlan, caches: Sequence[torch.Tensor], block_tables: torch.Tensor
    ) -> None:
        first = caches[0]
        if not first.is_contiguous():
            raise ValueError("vLLM CPU KV caches must be contiguous")
        _, heads, block_size, two_d = first.shape
        device = first.device
        elements = cpu_vec_token_elements(block_size, two_d // 2, device)
        chunk = block_size * two_d  # elements per (block, head)
        evicted, sources, block_tables = _on_device(plan, block_tables, device)
        batch, _, _, r = evicted.shape
        head = torch.arange(heads, device=device)[None, None, :, None]
        sources = _per_request(sources, batch).expand(batch, 1, heads, r)

        def element_index(slots: torch.Tensor) -> torch.Tensor:
            blocks, offsets = _slot_coordinates(slots, block_tables, block_size)
            base = (blocks * heads + head) * chunk
            return base[..., None] + elements[offsets]  # (..., 2 * head_size)

        src = element_index(sources).reshape(-1)
        dst = element_index(evicted).transpose(0, 1).reshape(len(caches), -1)
        for layer, cache in enumerate(caches):
            flat = cache.view(-1)
            flat.index_copy_(0, dst[layer], flat.index_select(0, src))

    def _rows(
        self, plan: RoundPlan, cache: torch.Tensor, block_tables: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Row numbers of the moved tokens: sources (n,) shared by layers, holes (L, n)."""
        device = cache.device
        evicted, sources, block_tables = _on_device(plan, block_tables, device)
        batch, layers, heads, r = evicted.shape
        head = torch.arange(heads, device=device)[None, None, :, None]
        sources = _per_request(sources, batch).expand(batch, 1, heads, r)
        src_block, src_offset = _slot_coordinates(sources, block_tables, self.block_size)
        dst_block, dst_offset = _slot_coordinates(evicted, block_tables, self.block_size)
        if self.layout is KVLayout.BLOCK_HEAD_SLOT:
            src = _row_numbers(cache, (src_block, head, src_offset))
            dst = _row_numbers(cache, (dst_block, head, dst_offset))
        else:
            # Each token has a K row and, one half of the tensor further, a V row.
            half = torch.arange(2, device=device)[None, None, :, None, None]
            head = head[:, :, None]
            src = _row_numbers(cache, (half, src_block[:, :, None], src_offset[:, :, None], head))
            dst = _row_numbers(cache, (half, dst_block[:, :, None], dst_offset[:, :, None], head))
        return src.reshape(-1), dst.transpose(0, 1).reshape(layers, -1)
