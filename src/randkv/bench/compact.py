"""`randkv bench compact`: bytes moved per round by three compaction designs, and the
achieved bandwidth of RandKV's hole-filling compactor against a plain torch copy."""

from __future__ import annotations

import torch

from randkv.bench.records import JsonObject, to_json
from randkv.bench.timing import machine_info, time_calls
from randkv.kernels.compactor import KVLayout, PagedCompactor
from randkv.kernels.planner import RoundPlanner
from randkv.spec.config import RandKVConfig


def run(
    *,
    layers: int,
    kv_heads: int,
    head_dim: int,
    budget: int,
    buffer: int,
    prompt: int,
    requests: int,
    block_size: int = 16,
    dtype: str = "bfloat16",
    repeats: int = 20,
    threads: int = 1,
) -> JsonObject:
    torch.set_num_threads(threads)
    torch_dtype = getattr(torch, dtype)
    config = RandKVConfig(budget=budget, buffer_size=buffer)
    blocks_per_request = -(-config.max_physical_length // block_size)
    num_blocks = requests * blocks_per_request
    generator = torch.Generator().manual_seed(0)
    # Shuffled block ids, as a real pool hands them out.
    block_tables = torch.randperm(num_blocks, generator=generator).view(requests, -1)
    caches = [
        torch.randn(num_blocks, kv_heads, block_size, 2 * head_dim, generator=generator).to(
            torch_dtype
        )
        for _ in range(layers)
    ]
    plan = RoundPlanner(config, range(layers), range(kv_heads)).plan(
        [prompt] * requests, list(range(requests)), [3] * requests
    )
    compactor = PagedCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size)
    token_bytes = 2 * head_dim * torch.tensor([], dtype=torch_dtype).element_size()
    heads_total = requests * layers * kv_heads
    first_hole = plan.evicted.min(dim=-1).values
    bytes_per_round = {
        # r moves per head.
        "hole_filling": plan.num_moves * token_bytes,
        # Keep order: every retained token behind the first hole shifts forward.
        "forward_packing": int((config.compacted_length - first_hole).sum()) * token_bytes,
        # The public prototype: copy all K + r retained tokens into fresh blocks.
        "copy_retained": heads_total * config.compacted_length * token_bytes,
    }
    moved = bytes_per_round["hole_filling"]
    source = torch.randn(moved // token_bytes, 2 * head_dim, generator=generator).to(torch_dtype)
    target = torch.empty_like(source)
    hole = time_calls(lambda: compactor.apply(plan, caches, block_tables), repeats=repeats)
    copy = time_calls(lambda: target.copy_(source), repeats=repeats)
    hole_gbps, copy_gbps = (moved / (t.median_ms * 1e-3) / 1e9 for t in (hole, copy))
    # The prototype's design at its best: one contiguous copy of every retained token.
    retained = torch.empty(bytes_per_round["copy_retained"], dtype=torch.uint8)
    retained_target = torch.empty_like(retained)
    prototype = time_calls(lambda: retained_target.copy_(retained), repeats=max(3, repeats // 4))
    return {
        "shape": {
            "layers": layers,
            "kv_heads": kv_heads,
            "head_dim": head_dim,
            "budget": budget,
            "buffer": buffer,
            "prompt": prompt,
            "requests": requests,
            "block_size": block_size,
            "dtype": dtype,
        },
        "bytes_per_round": bytes_per_round,
        "bytes_ratio": {
            "forward_packing_vs_hole_filling": bytes_per_round["forward_packing"] / moved,
            "copy_retained_vs_hole_filling": bytes_per_round["copy_retained"] / moved,
        },
        "hole_filling": {**hole.as_dict(), "gb_per_s": hole_gbps},
        "torch_copy": {**copy.as_dict(), "gb_per_s": copy_gbps},
        "bandwidth_ratio": hole_gbps / copy_gbps,
        "copy_retained_contiguous": prototype.as_dict(),
        "round_speedup_vs_copy_retained": prototype.median_ms / hole.median_ms,
        "machine": to_json(machine_info(threads)),
    }
