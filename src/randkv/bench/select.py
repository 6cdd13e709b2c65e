"""`randkv bench select`: one steady-state round of selection, RandKV vs two baselines."""

from __future__ import annotations

import hashlib
import random

import torch

from randkv.bench.records import JsonObject, to_json
from randkv.bench.timing import machine_info, time_calls
from randkv.kernels.planner import RoundPlanner, to_key_tensor
from randkv.spec.config import RandKVConfig


def _python_sample_round(n: int, r: int, layers: int, heads: int, key: int, round_index: int):
    """Baseline: per (layer, head) Python `random.sample` seeded by a hash."""
    picks = []
    for layer in range(layers):
        for head in range(heads):
            label = f"{key}/{round_index}/{layer}/{head}".encode()
            seed = int.from_bytes(hashlib.blake2b(label, digest_size=8).digest(), "little")
            picks.append(random.Random(seed).sample(range(n), r))
    return picks


def _rand_topk_round(n: int, r: int, layers: int, heads: int, generator: torch.Generator):
    """Baseline: per layer, uniform scores for every candidate, top-r, sorted."""
    picks = []
    for _ in range(layers):
        scores = torch.rand(heads, n, generator=generator)
        picks.append(scores.topk(r, dim=-1).indices.sort(dim=-1).values)
    return picks


def run(
    *,
    layers: int,
    kv_heads: int,
    budget: int,
    buffer: int,
    prompt: int,
    batch: int = 64,
    repeats: int = 30,
    threads: int = 1,
) -> JsonObject:
    torch.set_num_threads(threads)
    config = RandKVConfig(budget=budget, buffer_size=buffer)
    config.check_prompt(prompt)
    n = config.compacted_length - prompt
    planner = RoundPlanner(config, range(layers), range(kv_heads))
    one_key = to_key_tensor([12345])
    batch_keys = to_key_tensor(range(batch))
    generator = torch.Generator().manual_seed(0)
    single = time_calls(lambda: planner.plan([prompt], one_key, [7]), repeats=repeats)
    python_sample = time_calls(
        lambda: _python_sample_round(n, buffer, layers, kv_heads, 12345, 7),
        repeats=max(5, repeats // 3),
    )
    rand_topk = time_calls(
        lambda: _rand_topk_round(n, buffer, layers, kv_heads, generator), repeats=repeats
    )
    batched = time_calls(
        lambda: planner.plan([prompt] * batch, batch_keys, [7] * batch),
        repeats=max(3, repeats // 6),
    )
    per_request_ms = batched.median_ms / batch
    results: JsonObject = {
        "shape": {
            "layers": layers,
            "kv_heads": kv_heads,
            "budget": budget,
            "buffer": buffer,
            "prompt": prompt,
            "candidates": n,
            "batch": batch,
        },
        "randkv": single.as_dict(),
        "python_sample": python_sample.as_dict(),
        "rand_topk": rand_topk.as_dict(),
        "randkv_batched_64": {**batched.as_dict(), "per_request_ms": per_request_ms},
    }
    base = single.median_ms
    results["speedup"] = {
        "vs_python_sample": python_sample.median_ms / base,
        "vs_rand_topk": rand_topk.median_ms / base,
        "batched_per_request_vs_single": base / per_request_ms,
    }
    results["launches_per_step"] = launches_per_step(planner)
    results["machine"] = to_json(machine_info(threads))
    return results


def launches_per_step(planner: RoundPlanner) -> JsonObject:
    """Kernel launches of one planned step of 1 and 64 rounds, per planner backend.

    Counted with the torch profiler (`randkv.kernels.launches`), so on any machine. The Triton
    planner runs on CPU only in Triton's interpreter (TRITON_INTERPRET=1), where it is
    counted on one (layer, head) site, the count not depending on the shape; without CUDA
    or the interpreter it is not measured.
    """
    from randkv.kernels.launches import planner_launches

    counts: JsonObject = {}
    config, layers, heads = planner.config, planner.layers, planner.kv_heads
    torch_planner = RoundPlanner(config, layers, heads, planner.device, backend="torch")
    counts["torch"] = {str(n): planner_launches(torch_planner, n)[0] for n in (1, 64)}
    try:
        triton_planner = RoundPlanner(config, layers, heads, planner.device, backend="triton")
        if planner.device.type != "cuda" and not _interpreting():
            raise RuntimeError("no CUDA and Triton not in interpreter mode")
        small = planner.device.type != "cuda"  # the interpreter is slow: one site
        if small:
            triton_planner = RoundPlanner(config, layers[:1], heads[:1], backend="triton")
        triton: JsonObject = {str(n): planner_launches(triton_planner, n)[0] for n in (1, 64)}
        if small:
            triton["shape"] = "1 layer x 1 KV head (the count does not depend on it)"
        counts["triton"] = triton
    except (ImportError, RuntimeError, ValueError) as error:
        counts["triton"] = f"not measured here: {error}"
    return counts


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"
