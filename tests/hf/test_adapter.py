"""The Transformers adapter against the spec, dense Transformers, and a from-scratch oracle.

CPU only, no network: the tiny random-weight Qwen3 checkpoint is built in a temp folder.
"""

from __future__ import annotations

import inspect
from functools import partial
from pathlib import Path

import pytest
import torch
from recompute_oracle import recompute_logprobs
from transformers import (
    AutoModelForCausalLM,
    BloomConfig,
    DynamicCache,
    MistralConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import randkv.hf as rh
from randkv import PromptTooLongError, RandKVConfig, request_key_from_content, spec
from randkv.models.tiny import PAD_ID

left_pad = partial(rh.left_pad, pad_id=PAD_ID)
CONFIG = RandKVConfig(budget=24, buffer_size=4, seed=7)
CAPACITY = CONFIG.max_physical_length  # K + 2r = 32
# Different lengths, so rows fire their rounds at different steps.
PROMPTS = [list(b"RandKV"), list(b"hello, world"), list(b"a"), list(b"the quick brown fox")]
NEW_TOKENS = 48  # 5 to 9 rounds per row


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def ckpt(tiny_model_path: str) -> Path:
    return Path(tiny_model_path)


@pytest.fixture(scope="module")
def model(ckpt: Path):
    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)


def with_cache(model, cache) -> dict:
    """The forward/generate keyword for a cache: `cache` (5.24+) or `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache}


@pytest.fixture(scope="module")
def batch_new(model) -> list[list[int]]:
    """New tokens of each row from one left-padded batched RandKV generation."""
    ids, mask = left_pad(PROMPTS)
    out = rh.generate(model, ids, mask, randkv=CONFIG, max_new_tokens=NEW_TOKENS)
    assert out.shape == (len(PROMPTS), ids.shape[1] + NEW_TOKENS)
    return [row[ids.shape[1] :].tolist() for row in out]


@pytest.fixture(scope="module")
def dense_new(model) -> list[list[int]]:
    """New tokens of each prompt from plain dense `model.generate`, batch 1."""
    out = []
    for prompt in PROMPTS:
        seq = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
        out.append(seq[0, len(prompt) :].tolist())
    return out


def test_batch_equals_separate_rows_and_model_generate(model, batch_new):
    for prompt, new in zip(PROMPTS, batch_new, strict=True):
        single = rh.generate(
            model, torch.tensor([prompt]), randkv=CONFIG, max_new_tokens=NEW_TOKENS
        )
        assert single[0, len(prompt) :].tolist() == new
        # The same request through the stock `model.generate` loop (batch 1).
        cache = rh.RandKVCache(model, CONFIG, request_keys=[request_key_from_content(prompt)])
        seq = model.generate(
            torch.tensor([prompt]),
            **with_cache(model, cache),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
        )
        assert seq[0, len(prompt) :].tolist() == new
        assert cache.rounds(0) == spec.num_rounds(
            CONFIG, prompt_length=len(prompt), tokens_seen=len(prompt) + NEW_TOKENS - 1
        )


def test_model_generate_with_unpadded_batch(model):
    ids = torch.tensor([list(b"first prompt"), list(b"other prompt")])
    expected = rh.generate(model, ids, randkv=CONFIG, max_new_tokens=40)
    cache = rh.RandKVCache.from_inputs(model, ids, randkv=CONFIG)
    got = model.generate(ids, **with_cache(model, cache), max_new_tokens=40, do_sample=False)
    assert torch.equal(got, expected)
    assert cache.retained_positions(0, 1, 0) != cache.retained_positions(1, 1, 0)  # own keys
    # A chunked prefill needs the prompt lengths up front, which from_inputs records.
    cache = rh.RandKVCache.from_inputs(model, ids, randkv=CONFIG)
    chunked = model.generate(
        ids, **with_cache(model, cache), max_new_tokens=40, do_sample=False, prefill_chunk_size=5
    )
    assert torch.equal(chunked, expected)


def test_padded_batch_is_refused_inside_model_generate(model):
    ids, mask = left_pad(PROMPTS[:2])
    cache = rh.RandKVCache.from_inputs(model, ids, mask, randkv=CONFIG)
    with pytest.raises(ValueError, match="Use randkv.hf.generate"):
        model.generate(ids, attention_mask=mask, **with_cache(model, cache), max_new_tokens=4)
    if "cache" not in inspect.signature(model.forward).parameters:
        return  # older 5.x do not pass position_ids to Cache.update: needs from_inputs
    # Not told the prompt lengths: the padded position ids give it away.
    cache = rh.RandKVCache(model, CONFIG, request_keys=[1, 2])
    with pytest.raises(ValueError, match="Use randkv.hf.generate"):
        model.generate(ids, attention_mask=mask, **with_cache(model, cache), max_new_tokens=4)


def test_stepwise_slots_match_spec_and_lengths_stay_bounded(model, batch_new):
    """Drive the cache by hand; after every step compare with the spec (independent oracle)."""
    ids, mask = left_pad(PROMPTS)
    keys = [request_key_from_content(p) for p in PROMPTS]
    cache = rh.RandKVCache.from_inputs(model, ids, mask, randkv=CONFIG)
    step_ids, real = ids, mask.bool()
    generated: list[list[int]] = [[] for _ in PROMPTS]
    with torch.inference_mode():
        for _ in range(NEW_TOKENS):
            allowed, positions = cache.begin_step(real)
            logits = model(
                input_ids=step_ids,
                attention_mask=allowed,
                position_ids=positions,
                **with_cache(model, cache),
                use_cache=True,
            ).logits[:, -1]
            step_ids = logits.argmax(-1)[:, None]
            real = torch.ones_like(step_ids, dtype=torch.bool)
            for row, prompt in enumerate(PROMPTS):
                generated[row].append(int(step_ids[row]))
                seen = cache.tokens_seen(row)
                assert seen == len(prompt) + len(generated[row]) - 1
                want_length = spec.physical_length(
                    CONFIG, prompt_length=len(prompt), tokens_seen=seen
                )
                assert cache.physical_length(row) == want_length <= CAPACITY - 1
                assert cache.buffer_length(row) <= CAPACITY
                for layer in range(cache.num_layers):
                    for head in range(cache.num_kv_heads):
                        args = dict(prompt_length=len(prompt), tokens_seen=seen)
                        want = spec.slot_positions(
                            CONFIG, **args, request_key=keys[row], layer=layer, kv_head=head
                        )
                        assert cache.slot_positions(row, layer, head) == want
                        assert cache.retained_positions(row, layer, head) == (
                            spec.retained_positions(
                                CONFIG, **args, request_key=keys[row], layer=layer, kv_head=head
                            )
                        )
                assert cache.buffer_length(row) <= CAPACITY - 1  # the observer applied the round
    assert generated == batch_new
    assert min(cache.rounds(row) for row in range(len(PROMPTS))) >= 5
    # The moved bytes are the right ones: layer-0 keys/values depend only on (token, position),
    # so a dense forward over each row's sequence must hold them at the mapped positions.
    for row, prompt in enumerate(PROMPTS):
        sequence = torch.tensor([prompt + generated[row][:-1]])
        dense = DynamicCache(config=model.config)
        with torch.inference_mode():
            model(sequence, **with_cache(model, dense), use_cache=True)
        keys_now, values_now = cache.kv(row, 0)
        for head in range(cache.num_kv_heads):
            held = torch.tensor(cache.slot_positions(row, 0, head))
            torch.testing.assert_close(keys_now[head], dense.layers[0].keys[0, head, held])
            torch.testing.assert_close(values_now[head], dense.layers[0].values[0, head, held])


def test_tokens_before_the_first_round_equal_dense_generate(batch_new, dense_new):
    for prompt, ours, dense in zip(PROMPTS, batch_new, dense_new, strict=True):
        # Token at position T comes from a query that saw everything while T <= K + 2r.
        unaffected = CAPACITY + 1 - len(prompt)
        assert ours[:unaffected] == dense[:unaffected]


def test_eviction_changes_the_output(batch_new, dense_new):
    assert any(ours != dense for ours, dense in zip(batch_new, dense_new, strict=True))


# --------------------------------------------------------------------------- naive oracle


def test_full_recompute_oracle_over_retained_positions(ckpt, model, batch_new):
    for row in (0, 3):
        prompt, new = PROMPTS[row], batch_new[row]
        key = request_key_from_content(prompt)
        want = recompute_logprobs(ckpt, CONFIG, prompt, new, key)
        got = rh.teacher_forced_logprobs(model, prompt, new, randkv=CONFIG, request_key=key)
        torch.testing.assert_close(got.logprobs, want, atol=1e-4, rtol=0)
        assert want.argmax(-1).tolist() == new


def test_a_long_prompt_is_served_whole_under_min_generated(ckpt, model):
    """A prompt longer than K (min_generated): the cache takes the request's own K = P + G
    and decodes exactly what the from-scratch oracle with the spec's retained sets does."""
    config = RandKVConfig(budget=24, buffer_size=4, seed=7, min_generated=6)
    prompt = list(b"a prompt longer than the budget K, kept whole")  # 45 tokens > 24
    key = request_key_from_content(prompt)
    new, _ = rh.reference_decode(model, prompt, randkv=config, request_key=key, max_new_tokens=60)
    cache = rh.RandKVCache(model, config, request_keys=[key], prompt_lengths=[len(prompt)])
    assert cache.config.budget == len(prompt) + 6  # its own K
    want = recompute_logprobs(ckpt, config, prompt, new, key)
    got = rh.teacher_forced_logprobs(model, prompt, new, randkv=config, request_key=key)
    torch.testing.assert_close(got.logprobs, want, atol=1e-4, rtol=0)
    assert want.argmax(-1).tolist() == new
    rounds = spec.num_rounds(config, prompt_length=len(prompt), tokens_seen=len(prompt) + 59)
    assert rounds >= 3  # evictions ran among the generated tokens
    # Rows with different budgets cannot share one cache's buffers: a clear refusal.
    ids, mask = left_pad([prompt, list(b"short")])
    with pytest.raises(ValueError, match="different RandKV budgets"):
        rh.generate(model, ids, mask, randkv=config, max_new_tokens=2)


def test_reference_decode_and_teacher_forcing_agree(ckpt, model, batch_new):
    prompt = PROMPTS[1]
    tokens, logprobs = rh.reference_decode(
        model,
        prompt,
        randkv=CONFIG,
        request_key=request_key_from_content(prompt),
        max_new_tokens=NEW_TOKENS,
    )
    assert tokens == batch_new[1]
    forced = rh.teacher_forced_logprobs(model, prompt, tokens, randkv=CONFIG)
    torch.testing.assert_close(forced.token_logprobs, torch.tensor(logprobs), atol=1e-5, rtol=0)
    assert forced.logprobs.shape == (NEW_TOKENS, model.config.vocab_size)
    dense_tokens, _ = rh.reference_decode(model, prompt, randkv=None, max_new_tokens=NEW_TOKENS)
    dense = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
    assert dense_tokens == dense[0, len(prompt) :].tolist()
    # The eager attention path takes an additive float mask instead of a boolean one.
    eager = AutoModelForCausalLM.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager"
    )
    eager_forced = rh.teacher_forced_logprobs(eager, prompt, tokens, randkv=CONFIG)
    torch.testing.assert_close(eager_forced.logprobs, forced.logprobs, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="float32"):
        rh.reference_decode(
            Qwen3ForCausalLM(_small_qwen3()).to(torch.bfloat16),
            prompt,
            randkv=CONFIG,
            max_new_tokens=1,
        )


def test_request_keys_default_to_prompt_content(model, batch_new):
    ids, mask = left_pad(PROMPTS[:2])
    keys = [request_key_from_content(p) for p in PROMPTS[:2]]
    explicit = rh.generate(model, ids, mask, randkv=CONFIG, request_keys=keys, max_new_tokens=40)
    assert [row[ids.shape[1] :].tolist() for row in explicit] == [b[:40] for b in batch_new[:2]]
    other = rh.generate(model, ids, mask, randkv=CONFIG, request_keys=[5, 6], max_new_tokens=40)
    assert not torch.equal(other, explicit)  # other keys, other evictions


def test_sampling_with_a_seed(model):
    prompt = torch.tensor([PROMPTS[1]])
    kwargs = dict(randkv=CONFIG, max_new_tokens=40, do_sample=True, top_k=20, temperature=0.9)

    def sample(seed: int) -> torch.Tensor:
        return rh.generate(model, prompt, generator=torch.Generator().manual_seed(seed), **kwargs)

    assert torch.equal(sample(1), sample(1))
    assert not torch.equal(sample(1), sample(2))
    # Without a generator, torch's global RNG: the same draws as stock `model.generate`.
    torch.manual_seed(3)
    ours = rh.generate(model, prompt, **kwargs)
    torch.manual_seed(3)
    cache = rh.RandKVCache.from_inputs(model, prompt, randkv=CONFIG)
    stock = model.generate(
        prompt,
        **with_cache(model, cache),
        max_new_tokens=40,
        do_sample=True,
        top_k=20,
        temperature=0.9,
    )
    assert torch.equal(ours, stock)


def test_beam_search_and_multiple_sequences_are_refused(model):
    prompt = torch.tensor([PROMPTS[0]])
    with pytest.raises(ValueError, match="beam search"):
        rh.generate(model, prompt, randkv=CONFIG, num_beams=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="num_return_sequences"):
        rh.generate(
            model, prompt, randkv=CONFIG, num_return_sequences=2, do_sample=True, max_new_tokens=4
        )
    with pytest.raises(TypeError, match="does not support"):
        rh.generate(model, prompt, randkv=CONFIG, output_scores=True, max_new_tokens=4)
    cache = rh.RandKVCache.from_inputs(model, prompt, randkv=CONFIG)
    with pytest.raises(ValueError, match="beam search"):
        model.generate(prompt, **with_cache(model, cache), num_beams=2, max_new_tokens=4)


def _small_qwen3(**overrides) -> Qwen3Config:
    params = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    params.update(overrides)
    return Qwen3Config(**params)


def test_sliding_window_only_and_alibi_models_are_refused():
    # Full attention beside sliding layers is served (tests/hf/test_mixed_layers.py).
    mixed = Qwen3ForCausalLM(
        _small_qwen3(use_sliding_window=True, sliding_window=8, max_window_layers=1)
    )
    assert mixed.config.layer_types == ["full_attention", "sliding_attention"]
    assert rh.RandKVCache(mixed, CONFIG, request_keys=[1]).layer_ids == (0,)
    mistral = MistralConfig(num_hidden_layers=2, hidden_size=32, sliding_window=16)
    with pytest.raises(rh.UnsupportedModelError, match=r"sliding_attention.*sliding_window=16"):
        rh.RandKVCache(mistral, CONFIG, request_keys=[1])
    with pytest.raises(rh.UnsupportedModelError, match="sliding_attention"):
        rh.generate(
            Qwen3ForCausalLM(_small_qwen3(layer_types=["sliding_attention"] * 2, sliding_window=8)),
            torch.tensor([[1, 2, 3]]),
            randkv=CONFIG,
            max_new_tokens=2,
        )
    with pytest.raises(rh.UnsupportedModelError, match="ALiBi"):
        rh.RandKVCache(BloomConfig(n_layer=2, hidden_size=32), CONFIG, request_keys=[1])
    assert rh.unsupported_reason(_small_qwen3()) is None


def test_prompt_over_budget_is_refused(model):
    prompt = list(b"x" * (CONFIG.budget + 1))
    message = "prompt of 25 tokens exceeds the RandKV budget K=24"
    with pytest.raises(PromptTooLongError, match=message):
        rh.generate(model, torch.tensor([prompt]), randkv=CONFIG, max_new_tokens=2)
    with pytest.raises(PromptTooLongError, match=message):
        rh.reference_decode(model, prompt, randkv=CONFIG, max_new_tokens=2)
    cache = rh.RandKVCache(model, CONFIG, request_keys=[1])
    with pytest.raises(PromptTooLongError, match=message):
        model.generate(torch.tensor([prompt]), **with_cache(model, cache), max_new_tokens=2)
