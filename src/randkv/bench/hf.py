"""`randkv bench hf`: decode throughput of dense Transformers generation vs RandKV, and the
share of RandKV's time spent on eviction (round planning + compaction).

Three ways to generate the same greedy tokens from the same equal-length prompts:
- dense_generate: stock `model.generate` with its default dynamic cache;
- randkv_generate: `randkv.hf.generate` (explicit per-row masks; any batch);
- randkv_model_generate: stock `model.generate` with a `RandKVCache` (unpadded batches).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from randkv.bench.records import JsonObject, to_json
from randkv.bench.timing import machine_info
from randkv.spec.config import RandKVConfig

if TYPE_CHECKING:
    from randkv.hf.cache import RandKVCache

#: One timed generation: its output ids, and the RandKV cache it used (None: dense).
Generation = tuple[torch.Tensor, "RandKVCache | None"]


def _prompts(batch: int, length: int, vocab: int) -> torch.Tensor:
    """Deterministic printable-byte prompts, a different one per row."""
    generator = torch.Generator().manual_seed(1234 + batch)
    span = min(vocab, 0x7F) - 0x20
    return torch.randint(0, span, (batch, length), generator=generator) + 0x20


def _measure(
    fn: Callable[[], Generation], *, repeats: int, prompt_length: int
) -> tuple[dict[str, float | int], torch.Tensor]:
    """Median wall time of `fn` (after one warm-up), and the tokens of that run."""
    fn()
    samples: list[tuple[float, torch.Tensor, RandKVCache | None]] = []
    for _ in range(repeats):
        start = time.perf_counter()
        out, cache = fn()
        samples.append((time.perf_counter() - start, out, cache))
    samples.sort(key=lambda s: s[0])
    seconds, out, cache = samples[len(samples) // 2]
    new_tokens = out.shape[0] * (out.shape[1] - prompt_length)
    result: dict[str, float | int] = {
        "seconds": seconds,
        "min_seconds": samples[0][0],
        "new_tokens": new_tokens,
        "tokens_per_s": new_tokens / seconds,
    }
    if cache is not None:
        result.update(
            {
                "eviction_seconds": cache.eviction_seconds,
                "plan_seconds": cache.plan_seconds,
                "compact_seconds": cache.compact_seconds,
                "eviction_share": cache.eviction_seconds / seconds,
                "rounds": cache.rounds_applied,
            }
        )
    return result, out


def run(
    *,
    batch_sizes: Sequence[int] = (1, 8),
    new_tokens: int = 256,
    budget: int = 64,
    buffer: int = 16,
    prompt: int = 32,
    model_path: str | Path | None = None,
    repeats: int = 3,
    threads: int = 1,
    device: str = "cpu",
    seed: int = 0,
) -> JsonObject:
    """Tokens/s of dense vs RandKV greedy generation; see the module docstring for the JSON.

    model_path defaults to the tiny random-weight checkpoint (built on first use).
    """
    from transformers import AutoModelForCausalLM

    import randkv.hf as rh
    from randkv.models.tiny import build_tiny_checkpoint

    torch.set_num_threads(threads)
    config = RandKVConfig(budget=budget, buffer_size=buffer, seed=seed)
    config.check_prompt(prompt)
    path = Path(model_path) if model_path is not None else build_tiny_checkpoint()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    # Transformers' decorator on `PreTrainedModel.to` loses the method's self binding.
    model = model.to(device)  # type: ignore[arg-type]
    model.eval()
    text = model.config.get_text_config(decoder=True)
    # No early stop: every run generates exactly new_tokens per row.
    common: dict[str, Any] = {
        "max_new_tokens": new_tokens,
        "do_sample": False,
        "eos_token_id": None,
    }
    runs: list[JsonObject] = []
    for batch in batch_sizes:
        ids = _prompts(batch, prompt, text.vocab_size).to(device)

        def dense(ids: torch.Tensor = ids) -> Generation:
            return model.generate(ids, **common), None

        def ours(ids: torch.Tensor = ids) -> Generation:
            cache = rh.RandKVCache.from_inputs(model, ids, randkv=config)
            return rh.generate(model, ids, cache=cache, randkv=config, **common), cache

        def stock(ids: torch.Tensor = ids) -> Generation:
            cache = rh.RandKVCache.from_inputs(model, ids, randkv=config)
            return model.generate(ids, past_key_values=cache, **common), cache

        dense_result, dense_out = _measure(dense, repeats=repeats, prompt_length=prompt)
        ours_result, ours_out = _measure(ours, repeats=repeats, prompt_length=prompt)
        stock_result, stock_out = _measure(stock, repeats=repeats, prompt_length=prompt)
        runs.append(
            {
                "batch": batch,
                "dense_generate": dense_result,
                "randkv_generate": ours_result,
                "randkv_model_generate": stock_result,
                "randkv_vs_dense_speed": ours_result["tokens_per_s"] / dense_result["tokens_per_s"],
                "same_tokens_both_randkv_paths": bool(torch.equal(ours_out, stock_out)),
                "differs_from_dense": not bool(torch.equal(ours_out, dense_out)),
            }
        )
    return {
        "model": str(path),
        "model_shape": {
            "layers": text.num_hidden_layers,
            "kv_heads": text.num_key_value_heads,
            "head_dim": getattr(text, "head_dim", text.hidden_size // text.num_attention_heads),
            "hidden_size": text.hidden_size,
        },
        "randkv": {"budget": budget, "buffer_size": buffer, "seed": seed},
        "prompt": prompt,
        "new_tokens": new_tokens,
        "dense_tokens_held_at_end": prompt + new_tokens - 1,
        "randkv_slots_max": config.max_physical_length,
        "repeats": repeats,
        "device": device,
        "runs": runs,
        "machine": to_json(machine_info(threads)),
    }
