"""Test helpers shared by the engine tests of the model families built in the tests
(`randkv.models.tiny_families`: hybrid and MLA models): one engine run with twins, a
preemption and a repeated prompt, the Transformers adapter teacher-forced on the engine's
tokens, and the checks every family shares."""

from __future__ import annotations

import torch

from randkv import RandKVConfig, request_key_from_text, slot_positions
from randkv.models.tiny_families import FAMILIES

KEYS = ("family-one", "family-two")


def byte_prompts(*lengths: int) -> list[list[int]]:
    """Printable byte prompts of these lengths (different texts)."""
    return [[32 + (7 * i + 3 * j * (i + 1)) % 90 for j in range(n)] for i, n in enumerate(lengths)]


def run_engine(folder: str, family: str, config: RandKVConfig, prompts, new_tokens, **engine):
    """Each prompt twice with the same key (4 requests at once: a small pool preempts some),
    then the first prompt again, twice (the second a prefix-cache hit where caching is on,
    whatever the pool's pressure left cached before)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from randkv.vllm import LLM

    llm = LLM(model=folder, randkv=config, dtype=FAMILIES[family].dtype, seed=0, **engine)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler

    def params(key: str) -> SamplingParams:
        return SamplingParams(
            temperature=0, max_tokens=new_tokens, ignore_eos=True, extra_args={"randkv_key": key}
        )

    requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompts]
    outputs = llm.generate(requests * 2, [params(k) for k in KEYS] * 2)
    first = outputs[: len(KEYS)]
    run = {
        "tokens": [list(o.outputs[0].token_ids) for o in first],
        "twins": [list(o.outputs[0].token_ids) for o in outputs[len(KEYS) :]],
        "slots": [llm.randkv_slot_positions(o.request_id) for o in first],
        "stats": [llm.randkv_request_stats(o.request_id) for o in first],
        "counters": dict(scheduler.counters),
        "groups": [
            type(g.kv_cache_spec).__name__ for g in scheduler.kv_cache_config.kv_cache_groups
        ],
        "block_size": scheduler.kv_cache_manager.block_size,
        "scheduler": type(scheduler).__name__,
    }
    llm.generate(requests[:1], params(KEYS[0]))
    again = llm.generate(requests[:1], params(KEYS[0]))[0]
    run["again"] = list(again.outputs[0].token_ids)
    run["again_cached"] = again.num_cached_tokens
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    run["held_after"] = [sum(map(len, m.req_to_blocks.values())) for m in managers]
    run["free_after"] = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    run["pool"] = engine["num_gpu_blocks_override"]
    llm.llm_engine.engine_core.shutdown()  # before the next engine starts (conftest.py)
    del llm
    return run


def adapter_caches(folder: str, family: str, config, prompts, tokens):
    """Teacher-forced through the Transformers adapter: the log-probabilities it gives each of
    the engine's tokens, and its caches (for the slot maps)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=getattr(torch, FAMILIES[family].dtype)
    )
    runs = [
        teacher_forced(model, config, ids, generated, key)
        for ids, generated, key in zip(prompts, tokens, KEYS, strict=True)
    ]
    return model, runs


def teacher_forced(model, config, ids: list[int], generated: list[int], key: str):
    """`ids + generated` fed through the adapter's `RandKVCache` (request key `key`): the
    log-distribution it gives at each position (`scores[p]`: of the token at p), and the
    cache."""
    from randkv.hf import RandKVCache
    from randkv.hf.scoring import score_sequences

    cache = RandKVCache(model, config, request_keys=[key], prompt_lengths=[len(ids)])
    scores: dict[int, torch.Tensor] = {}

    def keep(start: int, logprobs: torch.Tensor) -> None:
        for j in range(logprobs.shape[1]):
            scores[start + 1 + j] = logprobs[0, j]

    with torch.inference_mode():
        score_sequences(model, torch.tensor([ids + generated]), cache, keep)
    return scores, cache


def plain_then_randkv(folder: str, config, prompts, max_tokens: int, **engine):
    """The same greedy requests through plain vLLM, then through RandKV (one engine after
    the other, the same settings): per prompt (plain tokens, RandKV tokens, RandKV's record
    of it), and the KV block size."""
    import vllm
    from vllm import SamplingParams

    from randkv.vllm import LLM

    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    requests = [{"prompt_token_ids": ids} for ids in prompts]
    plain = vllm.LLM(model=folder, **engine)
    expected = [list(o.outputs[0].token_ids) for o in plain.generate(requests, params)]
    plain.llm_engine.engine_core.shutdown()
    del plain
    llm = LLM(model=folder, randkv=config, **engine)
    outputs = llm.generate(requests, params)
    block = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_size
    runs = [
        (want, list(output.outputs[0].token_ids), llm.randkv_request_stats(output.request_id))
        for output, want in zip(outputs, expected, strict=True)
    ]
    llm.llm_engine.engine_core.shutdown()
    del llm
    return runs, block


def assert_slots_are_the_specs(run, prompts, config, caches, new_tokens) -> None:
    for i, (ids, key) in enumerate(zip(prompts, KEYS, strict=True)):
        cache = caches[i]
        slots = run["slots"][i]
        assert len(slots) == len(cache.layer_ids)
        seen = len(ids) + new_tokens - 1  # the last token is sampled, never cached
        for ordinal, layer in enumerate(cache.layer_ids):
            spec = slot_positions(
                config, prompt_length=len(ids), tokens_seen=seen,
                request_key=request_key_from_text(key), layer=layer, kv_head=0,
            )  # fmt: skip
            assert tuple(slots[ordinal][0]) == spec


def assert_blocks_bounded_and_returned(run, config) -> None:
    block = run["block_size"]
    for stats in run["stats"]:
        assert stats.blocks_held <= -(-(config.max_physical_length - 1) // block)
        assert stats.blocks_held < -(-stats.tokens_seen // block)  # plain vLLM holds them all
    assert run["counters"]["preemptions"] >= 1, run["counters"]  # and the tokens still match
    assert run["held_after"] == [0] * len(run["groups"])  # every group's blocks given back
    assert run["free_after"] == run["pool"] - 1  # vLLM's null block
