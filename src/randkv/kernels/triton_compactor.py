"""One-launch compaction on GPU: every hole-filling move of a step in a single Triton kernel.

`TritonCompactor` has `PagedCompactor`'s interface and result, bit for bit, for the
`BLOCK_HEAD_SLOT` layout (FlashAttention's (num_blocks, H, block_size, 2D), NHD or HND
stride order) and the split `KV_BLOCK_SLOT_HEAD` layout. The kernel reaches every
layer through a table of per-layer base addresses (`cache.data_ptr()`), so one launch
covers all (request, layer, KV head) moves; each program copies a tile of token rows as
raw machine words (bf16/fp16/fp32 alike).

Reads and writes never overlap within a launch: sources are slots >= K + r and holes
slots < K + r of the same request, and requests hold disjoint blocks.

On CPU tensors the kernel runs in Triton's interpreter (for tests; the torch
`PagedCompactor` is the CPU path). Set TRITON_INTERPRET=1 before importing triton to
interpret it everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

from randkv.kernels.compactor import KVLayout, PagedCompactor, check_caches, moved_bytes
from randkv.kernels.hostsync import host_to_device
from randkv.kernels.triton_jit import Kernel
from randkv.spec.rounds import RoundPlan

_WORDS = {8: tl.int64, 4: tl.int32, 2: tl.int16, 1: tl.int8}


def _fill_holes(
    layer_addrs,  # (L,) int64: each layer's cache.data_ptr()
    evicted,  # (B, L, H, r) int64 hole slots, contiguous
    sources,  # (B, r) int64 source slots of each request
    tables,  # (B, table_width) int64 block ids, contiguous
    table_width,
    num_layers,
    chunks,  # programs per (request, layer)
    moves,  # H * r moves per (request, layer)
    r,
    block_size,
    num_blocks,
    stride_block,  # strides in words
    stride_head,
    stride_slot,
    stride_half,
    ROW: tl.constexpr,  # words per row
    ROW_BLOCK: tl.constexpr,  # ROW rounded up to a power of two
    HALVES: tl.constexpr,  # rows per token: 1, or 2 when K and V are split
    BLOCK_M: tl.constexpr,  # moves per program
    WORD: tl.constexpr,  # integer type the rows are copied as
    ALIGN: tl.constexpr,  # byte alignment of every layer's base address
):
    pid = tl.program_id(0).to(tl.int64)
    bl = pid // chunks  # request * num_layers + layer
    request = bl // num_layers
    layer = bl % num_layers
    m = (pid % chunks) * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)  # head * r + i
    valid = m < moves
    head = m // r
    dst_slot = tl.load(evicted + bl * moves + m, mask=valid, other=0)
    src_slot = tl.load(sources + request * r + m % r, mask=valid, other=0)
    dst_col = dst_slot // block_size
    src_col = src_slot // block_size
    # Bounds checks keep a malformed plan or table from touching memory outside the cache.
    valid &= (dst_slot >= 0) & (src_slot >= 0) & (dst_col < table_width)
    valid &= src_col < table_width
    table_row = tables + request * table_width
    dst_block = tl.load(table_row + dst_col, mask=valid, other=0)
    src_block = tl.load(table_row + src_col, mask=valid, other=0)
    valid &= (dst_block >= 0) & (dst_block < num_blocks) & (src_block >= 0)
    valid &= src_block < num_blocks
    dst = dst_block * stride_block + head * stride_head + (dst_slot % block_size) * stride_slot
    src = src_block * stride_block + head * stride_head + (src_slot % block_size) * stride_slot
    base = tl.load(layer_addrs + layer).to(tl.pointer_type(WORD))
    if ALIGN > 1:
        # Lets the compiler vectorize the row copies (a hint on the integer is lost in
        # the cast to a pointer; on the pointer it holds).
        base = tl.multiple_of(base, ALIGN)
    cols = tl.arange(0, ROW_BLOCK)
    mask = valid[:, None] & (cols < ROW)[None, :]
    for half in tl.static_range(HALVES):
        words = tl.load(base + (src + half * stride_half)[:, None] + cols[None, :], mask=mask)
        tl.store(base + (dst + half * stride_half)[:, None] + cols[None, :], words, mask=mask)


KERNEL = Kernel(
    _fill_holes,
    # The block-table width changes from step to step (the longest planned request);
    # the plan and table tensors are allocated per step. Everything else is fixed by the
    # engine's caches and config, so an engine compiles one variant (see `warmup`).
    do_not_specialize=("table_width",),
    do_not_specialize_on_alignment=("evicted", "sources", "tables"),
)


@dataclass(frozen=True)
class _Geometry:
    """How the kernel addresses one layer's cache: strides in words of `word` bytes."""

    word: int
    row: int
    halves: int
    stride_block: int
    stride_head: int
    stride_slot: int
    stride_half: int
    align: int


def _geometry(layout: KVLayout, caches: Sequence[torch.Tensor]) -> _Geometry:
    first = caches[0]
    if first.stride(-1) != 1:
        raise ValueError("the KV cache's last dim must be contiguous")
    size = first.element_size()
    if layout is KVLayout.KV_BLOCK_SLOT_HEAD:
        half, block, slot, head = first.stride()[:4]
        halves = 2
    else:
        block, head, slot = first.stride()[:3]
        half, halves = 0, 1
    strides = (block, head, slot, half)
    addresses = [c.data_ptr() for c in caches]
    row_bytes = first.shape[-1] * size
    word = next(
        w
        for w in _WORDS
        if row_bytes % w == 0
        and all(s * size % w == 0 for s in strides)
        and all(a % w == 0 for a in addresses)
    )
    align = next(a for a in (16, 8, 4, 2, 1) if all(x % a == 0 for x in addresses))
    block, head, slot, half = (s * size // word for s in strides)
    return _Geometry(word, row_bytes // word, halves, block, head, slot, half, align)


class TritonCompactor:
    """`PagedCompactor` in one Triton launch per `apply` (CUDA; CPU tensors interpreted).

    Every layer's cache must have the same layout, shape, strides and dtype; the layer
    address table is uploaded once and reused while the caches stay put.
    """

    def __init__(
        self, layout: KVLayout, block_size: int, *, tile_bytes: int = 16384, num_warps: int = 4
    ) -> None:
        if layout is KVLayout.VLLM_CPU_VEC:
            raise ValueError(
                "layout vllm_cpu_vec is vLLM's CPU attention layout: use PagedCompactor"
            )
        self.layout = layout
        self.block_size = block_size
        self.tile_bytes = tile_bytes  # bytes each program moves per row tile
        self.num_warps = num_warps
        self._table_key: tuple[Any, ...] | None = None
        self._table: torch.Tensor | None = None

    def moved_bytes(self, plan: RoundPlan, caches: Sequence[torch.Tensor]) -> int:
        """Bytes written by `apply` (keys and values)."""
        return moved_bytes(self.layout, plan, caches)

    def _layer_table(self, caches: Sequence[torch.Tensor]) -> torch.Tensor:
        device = caches[0].device
        key = (device, *(c.data_ptr() for c in caches))
        if key != self._table_key or self._table is None:
            addresses = torch.tensor([c.data_ptr() for c in caches], dtype=torch.int64)
            self._table = host_to_device(addresses, device)
            self._table_key = key
        return self._table

    @torch.inference_mode()
    def apply(
        self, plan: RoundPlan, caches: Sequence[torch.Tensor], block_tables: torch.Tensor
    ) -> None:
        """Apply `plan` to per-layer `caches` (in the plan's layer order), in place.

        block_tables (B, max_blocks) holds each planned request's block ids in row b; a
        host tensor is copied to the device pinned and non-blocking. One kernel launch.
        """
        check_caches(self.layout, self.block_size, plan, caches)
        batch, layers, heads, r = plan.evicted.shape
        if batch == 0 or r == 0:
            return
        device = caches[0].device
        evicted = host_to_device(plan.evicted, device).to(torch.int64).contiguous()
        sources = host_to_device(plan.sources, device).to(torch.int64)
        sources = sources.expand(batch, r).contiguous()  # one row per request
        tables = host_to_device(block_tables.to(torch.int64).contiguous(), device)
        grid, args, options = self._launch(caches, evicted, sources, tables)
        KERNEL.launch(device, grid, *args, **options)

    def warmup(self, caches: Sequence[torch.Tensor], buffer_size: int) -> float:
        """Compile the one variant these caches and r meet, without moving anything.

        Seconds spent compiling (0.0 on CPU). Call it at start-up, after the KV caches
        are allocated: the first round then compiles nothing.
        """
        device = caches[0].device
        heads = caches[0].shape[3 if self.layout is KVLayout.KV_BLOCK_SLOT_HEAD else 1]
        evicted = torch.zeros(
            (1, len(caches), heads, buffer_size), dtype=torch.int64, device=device
        )
        sources = torch.zeros((1, buffer_size), dtype=torch.int64, device=device)
        tables = torch.zeros((1, 3), dtype=torch.int64, device=device)  # width: unspecialised
        grid, args, options = self._launch(caches, evicted, sources, tables)
        return KERNEL.warmup(device, grid, *args, **options)

    def _launch(
        self,
        caches: Sequence[torch.Tensor],
        evicted: torch.Tensor,
        sources: torch.Tensor,
        tables: torch.Tensor,
    ) -> tuple[tuple[int, ...], tuple[Any, ...], dict[str, Any]]:
        """(grid, positional args, constexprs and options) of one launch."""
        batch, layers, heads, r = evicted.shape
        first = caches[0]
        geo = _geometry(self.layout, caches)
        row_block = triton.next_power_of_2(geo.row)
        block_m = min(
            128, triton.next_power_of_2(max(1, self.tile_bytes // (row_block * geo.word)))
        )
        block_m = min(block_m, triton.next_power_of_2(heads * r))
        chunks = triton.cdiv(heads * r, block_m)
        args = (
            self._layer_table(caches),
            evicted,
            sources,
            tables,
            tables.shape[1],
            layers,
            chunks,
            heads * r,
            r,
            self.block_size,
            first.shape[1] if self.layout is KVLayout.KV_BLOCK_SLOT_HEAD else first.shape[0],
            geo.stride_block,
            geo.stride_head,
            geo.stride_slot,
            geo.stride_half,
        )
        options = {
            "ROW": geo.row,
            "ROW_BLOCK": row_block,
            "HALVES": geo.halves,
            "BLOCK_M": block_m,
            "WORD": _WORDS[geo.word],
            "ALIGN": geo.align,
            "num_warps": self.num_warps,
        }
        return (batch * layers * chunks,), args, options


def make_compactor(
    layout: KVLayout, block_size: int, device: torch.device | str
) -> PagedCompactor | TritonCompactor:
    """The compactor for caches on `device`: one Triton launch on CUDA, torch elsewhere."""
    if torch.device(device).type == "cuda" and layout is not KVLayout.VLLM_CPU_VEC:
        return TritonCompactor(layout, block_size)
    return PagedCompactor(layout, block_size)
