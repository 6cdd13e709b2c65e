"""The Transformers adapter and vLLM agree on the real SmolLM2-135M-Instruct: one greedy chat
answer, long enough for many rounds, gives the same tokens and the same slot maps (every
layer and KV head) in `randkv.hf.generate` and in the vLLM 0.28.0 CPU engine, both float32.

float32 because bf16 rounds differently in vLLM's CPU kernels and in Transformers, and over
hundreds of greedy tokens a 135M model meets near ties that bf16 would flip.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from randkv import RandKVConfig, request_key_from_text, slot_positions  # noqa: E402
from randkv.models import DEFAULT_MODEL, fetch_model  # noqa: E402

# K + 2r = 80 tokens: a ~40-token chat prompt reaches it after ~40 answer tokens, and a
# round fires every 8 tokens after that.
CONFIG = RandKVConfig(budget=64, buffer_size=8, seed=11)
NEW_TOKENS = 200
KEY = "smollm2-adapter-vs-engine"
QUESTION = "Write a long story about a lighthouse keeper who finds a message in a bottle."


@pytest.fixture(scope="module")
def folder() -> str:
    return str(fetch_model(DEFAULT_MODEL))


@pytest.fixture(scope="module")
def prompt_ids(folder: str) -> list[int]:
    from transformers import AutoTokenizer

    from randkv.bench.workload import chat_prompt_ids

    return chat_prompt_ids(AutoTokenizer.from_pretrained(folder), QUESTION)


@pytest.fixture(scope="module")
def engine_run(folder: str, prompt_ids: list[int]):
    """(answer token ids, slot maps [layer][head][slot], rounds) from the vLLM engine."""
    from vllm.inputs import TokensPrompt

    from randkv.vllm import LLM

    llm = LLM(
        model=folder,
        randkv=CONFIG,
        dtype="float32",
        block_size=32,
        max_model_len=512,
        num_gpu_blocks_override=16,
        gpu_memory_utilization=0.2,
        enforce_eager=True,
        seed=0,
    )
    params = SamplingParams(
        temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True, extra_args={"randkv_key": KEY}
    )
    output = llm.generate([TokensPrompt(prompt_token_ids=prompt_ids)], params)[0]
    assert list(output.prompt_token_ids) == prompt_ids
    result = (
        list(output.outputs[0].token_ids),
        llm.randkv_slot_positions(output.request_id),
        llm.randkv_request_stats(output.request_id).rounds,
    )
    llm.llm_engine.engine_core.shutdown()  # before the next engine starts (conftest.py)
    del llm
    return result


@pytest.mark.engine
def test_adapter_and_engine_agree_on_smollm2(folder, prompt_ids, engine_run):
    from transformers import AutoModelForCausalLM

    from randkv.hf import RandKVCache, generate

    engine_tokens, engine_slots, engine_rounds = engine_run
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = torch.tensor([prompt_ids])
    cache = RandKVCache.from_inputs(model, ids, None, randkv=CONFIG, request_keys=[KEY])
    out = generate(
        model,
        ids,
        randkv=CONFIG,
        cache=cache,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        eos_token_id=[],  # like vLLM's ignore_eos: exactly NEW_TOKENS tokens
    )
    adapter_tokens = out[0, len(prompt_ids) :].tolist()
    assert adapter_tokens == engine_tokens

    prompt = len(prompt_ids)
    tokens_seen = prompt + NEW_TOKENS - 1  # the last token is sampled, never cached
    assert cache.tokens_seen(0) == tokens_seen
    assert cache.rounds(0) == engine_rounds >= 10
    config = model.config
    assert len(engine_slots) == config.num_hidden_layers == 30
    key = request_key_from_text(KEY)
    for layer, heads in enumerate(engine_slots):
        assert len(heads) == config.num_key_value_heads == 3
        for head, engine_positions in enumerate(heads):
            adapter_positions = cache.slot_positions(0, layer, head)
            assert tuple(engine_positions) == adapter_positions
            # ...and both are what the spec says, computed without either engine.
            assert adapter_positions == slot_positions(
                CONFIG,
                prompt_length=prompt,
                tokens_seen=tokens_seen,
                request_key=key,
                layer=layer,
                kv_head=head,
            )
    assert engine_slots[0][0] != engine_slots[0][1]  # heads draw independently
