"""`randkv demo`: the core benchmarks and a short RandKV-vs-plain vLLM run on the tiny model.

(The full iso-memory serving benchmark is `randkv bench serve`, a separate piece of work.)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


def _engine_comparison(model: str | None, results: Path) -> dict[str, Any]:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm
    from vllm import SamplingParams

    from randkv import RandKVConfig
    from randkv.models import build_tiny_checkpoint
    from randkv.vllm import LLM

    path = model or str(build_tiny_checkpoint())
    common = dict(
        dtype="float32",
        max_model_len=4096,
        block_size=16,
        gpu_memory_utilization=0.2,
        enforce_eager=True,
        max_num_seqs=16,
        num_gpu_blocks_override=256,
        seed=0,
    )
    prompts = [f"Request {i}: think step by step about problem {i}." for i in range(16)]
    params = SamplingParams(temperature=0, max_tokens=1500, ignore_eos=True)
    arms: dict[str, Any] = {}
    for name, build in (
        ("plain vLLM", lambda: vllm.LLM(model=path, **common)),
        (
            "vLLM + RandKV",
            lambda: LLM(model=path, randkv=RandKVConfig(budget=256, buffer_size=32), **common),
        ),
    ):
        llm = build()
        start = time.perf_counter()
        outputs = llm.generate(prompts, params)
        elapsed = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        arm = {"output_tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed}
        if isinstance(llm, LLM):
            stats = llm.randkv_stats()
            arm["rounds"] = stats["counters"]["rounds"]
            arm["eviction_seconds"] = sum(stats["seconds"].values())
        arms[name] = arm
        del llm
    plain, ours = arms["plain vLLM"], arms["vLLM + RandKV"]
    arms["ratio_tokens_per_s"] = ours["tokens_per_s"] / plain["tokens_per_s"]
    (results / "engine.json").write_text(json.dumps(arms, indent=2))
    return arms


def run(model: str | None = None, results_dir: str = "results/demo") -> None:
    from randkv.bench import compact, select

    results = Path(results_dir)
    results.mkdir(parents=True, exist_ok=True)
    print("RandKV demo: results go to", results.resolve())
    sel = select.run(layers=36, kv_heads=8, budget=2048, buffer=64, prompt=256, repeats=20)
    comp = compact.run(
        layers=36,
        kv_heads=8,
        head_dim=128,
        budget=2048,
        buffer=64,
        prompt=256,
        requests=2,
        repeats=10,
    )
    (results / "select.json").write_text(json.dumps(sel, indent=2))
    (results / "compact.json").write_text(json.dumps(comp, indent=2))
    print("\nOne eviction round, 36 layers x 8 KV heads, K=2048, r=64 (1 CPU thread):")
    for name in ("randkv", "rand_topk", "python_sample"):
        print(f"  {name:14s} {sel[name]['median_ms']:8.3f} ms")
    print(
        f"  RandKV batched, per request of 64: {sel['randkv_batched_64']['per_request_ms']:.3f} ms"
    )
    print("\nBytes moved per round (2 requests):")
    for name, value in comp["bytes_per_round"].items():
        print(f"  {name:16s} {value / 1e6:9.1f} MB")
    arms = _engine_comparison(model, results)
    print("\nTiny model, 16 requests x 1500 tokens, same pool of 256 blocks:")
    for name in ("plain vLLM", "vLLM + RandKV"):
        arm = arms[name]
        print(f"  {name:14s} {arm['tokens_per_s']:8.1f} output tokens/s")
    print(f"  ratio: {arms['ratio_tokens_per_s']:.2f}x")
