"""The Transformers adapter on a mixed model: RandKV on the full-attention layers, Transformers'
own window cache on the sliding-window layers (the Gemma 3 layout), against the from-scratch
oracle (recompute_oracle.py) and the spec.

A small Gemma 3 with random weights (built here, seeded) has two layer kinds and a window
shorter than the generated text, so both the window and the rounds change what is attended.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch
from recompute_oracle import assert_rows_decode_what_the_oracle_recomputes, recompute_logprobs
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig

import randkv.hf as rh
from randkv import RandKVConfig, request_key_from_content, spec

PAD = 0
left_pad = partial(rh.left_pad, pad_id=PAD)
CONFIG = RandKVConfig(budget=24, buffer_size=4, seed=3)  # K + 2r = 32
WINDOW = 8
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
FULL_LAYERS = (1, 3)
PROMPTS = [[5, 9, 17, 33, 2], list(range(3, 40, 3)), [7] * 3 + list(range(50, 70))]
NEW_TOKENS = 48  # several rounds per row, far past the window

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _config(**overrides) -> Gemma3TextConfig:
    params = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=WINDOW,
        layer_types=LAYER_TYPES,
        max_position_embeddings=256,
        initializer_range=0.2,  # with untied embeddings: varied tokens that follow the context
        tie_word_embeddings=False,
        pad_token_id=PAD,
        bos_token_id=1,
        eos_token_id=2,
    )
    params.update(overrides)
    return Gemma3TextConfig(**params)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("gemma3-mixed")
    Gemma3ForCausalLM(_config()).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def model(ckpt: Path):
    return Gemma3ForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation="sdpa")


def _no_eos(model) -> dict:
    return dict(max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None)


@pytest.fixture(scope="module")
def batch_new(model) -> list[list[int]]:
    """New tokens of each row from one left-padded batched RandKV generation."""
    ids, mask = left_pad(PROMPTS)
    out = rh.generate(model, ids, mask, randkv=CONFIG, **_no_eos(model))
    return [out[b, ids.shape[1] :].tolist() for b in range(len(PROMPTS))]


def test_the_cache_bounds_the_full_layers_and_leaves_the_window_to_transformers(model):
    cache = rh.RandKVCache(model, CONFIG, request_keys=[1])
    assert cache.layer_ids == FULL_LAYERS and cache.sliding_window == WINDOW
    assert cache.is_sliding == [True, False, True, False]
    with pytest.raises(ValueError, match="layer 0 is a sliding-window layer"):
        cache.slot_positions(0, 0, 0)


def test_each_row_decodes_what_the_oracle_recomputes(ckpt, model, batch_new):
    """Left-padded batch rows (own prompts, own rounds) against a from-scratch recompute that
    applies the window on sliding layers and the spec's per-head sets on full layers."""
    assert_rows_decode_what_the_oracle_recomputes(
        ckpt, model, CONFIG, PROMPTS, batch_new, atol=1e-4, min_rounds=3
    )


def test_evictions_change_the_answer(model, batch_new):
    """The oracle test can fail: without RandKV (window only) the model says other things."""
    ids, mask = left_pad(PROMPTS)
    dense = model.generate(ids, attention_mask=mask, **_no_eos(model))
    assert [dense[b, ids.shape[1] :].tolist() for b in range(len(PROMPTS))] != batch_new


def test_slot_maps_are_the_specs_on_every_full_layer(model, batch_new):
    ids, mask = left_pad(PROMPTS)
    cache = rh.RandKVCache.from_inputs(model, ids, mask, randkv=CONFIG)
    rh.generate(model, ids, mask, randkv=CONFIG, cache=cache, **_no_eos(model))
    for row, prompt in enumerate(PROMPTS):
        key = request_key_from_content(prompt)
        seen = cache.tokens_seen(row)
        assert seen == len(prompt) + NEW_TOKENS - 1
        for layer in FULL_LAYERS:
            for head in range(2):
                assert cache.slot_positions(row, layer, head) == spec.slot_positions(
                    CONFIG,
                    prompt_length=len(prompt),
                    tokens_seen=seen,
                    request_key=key,
                    layer=layer,
                    kv_head=head,
                )
    # Different layers and heads keep different sets (per-head independent draws).
    sets = {cache.retained_positions(0, layer, head) for layer in FULL_LAYERS for head in (0, 1)}
    assert len(sets) == 4


def test_model_generate_with_the_cache_gives_the_batch_rows_tokens(model, batch_new):
    """Transformers' own masks (batch 1, `model.generate`) and randkv.hf's per-row masks agree."""
    for row, prompt in enumerate(PROMPTS):
        cache = rh.RandKVCache(model, CONFIG, request_keys=[request_key_from_content(prompt)])
        out = model.generate(torch.tensor([prompt]), past_key_values=cache, **_no_eos(model))
        assert out[0, len(prompt) :].tolist() == batch_new[row], f"row {row}"
        assert cache.rounds(0) >= 3


def _scoring_rows(batch_new) -> tuple[torch.Tensor, list[int], list[list[int]]]:
    """Two unpadded rows of one length (own prompts, their own decoded answers), as the
    quality study scores them: ids, prompt lengths, and each row's answer part."""
    length = len(PROMPTS[1]) + NEW_TOKENS
    answers = [batch_new[b][: length - len(PROMPTS[b])] for b in (1, 2)]
    ids = torch.tensor([PROMPTS[b] + answer for b, answer in zip((1, 2), answers, strict=True)])
    return ids, [len(PROMPTS[1]), len(PROMPTS[2])], answers


def _scoring_cache(model, prompts: list[int], selector: str) -> rh.RandKVCache:
    from randkv.selectors.registry import make_selector

    keys = [request_key_from_content(PROMPTS[b]) for b in (1, 2)]
    return rh.RandKVCache(
        model, CONFIG, request_keys=keys, prompt_lengths=prompts, selector=make_selector(selector)
    )


def test_chunked_scoring_equals_the_oracle_on_a_mixed_model(ckpt, model, batch_new):
    """The quality study's teacher-forced scoring (chunks up to the next round, a mask per
    layer kind) against the from-scratch recompute, every vocabulary entry."""
    from randkv.hf.scoring import score_sequences

    ids, prompts, answers = _scoring_rows(batch_new)
    got = torch.full((*ids.shape, 96), float("nan"))

    def on_chunk(start: int, logprobs: torch.Tensor) -> None:
        got[:, start + 1 : start + 1 + logprobs.shape[1]] = logprobs

    cache = _scoring_cache(model, prompts, "randkv")
    score_sequences(model, ids, cache, on_chunk)
    for row, (prompt, answer) in enumerate(zip(prompts, answers, strict=True)):
        prompt_ids = ids[row, :prompt].tolist()
        want = recompute_logprobs(ckpt, CONFIG, prompt_ids, answer, cache.request_keys[row])
        torch.testing.assert_close(got[row, prompt:], want, atol=1e-4, rtol=0)
        assert cache.rounds(row) >= 3


@pytest.mark.parametrize("selector", ["randkv", "h2o"])
def test_chunked_scoring_keeps_what_decoding_keeps_on_a_mixed_model(ckpt, batch_new, selector):
    """A scored policy reads attention on the full layers only; chunked and token-by-token
    feeding keep the same positions there."""
    from randkv.hf.scoring import score_sequences

    # Eager attention: the scored policies read its weights.
    model = Gemma3ForCausalLM.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager"
    )
    ids, _, _ = _scoring_rows(batch_new)
    prompts = [len(PROMPTS[1])] * 2  # forced_decode feeds one prompt width
    chunked = _scoring_cache(model, prompts, selector)
    score_sequences(model, ids, chunked, lambda start, logprobs: None)
    stepped = _scoring_cache(model, prompts, selector)
    # Every token dictated: forced_decode feeds what score_sequences scored, one at a time.
    rh.forced_decode(model, ids[:, : prompts[0]], None, ids[:, prompts[0] :].clone(),
                     cache=stepped)  # fmt: skip
    assert [chunked.rounds(b) for b in (0, 1)] == [stepped.rounds(b) for b in (0, 1)]
    same = (chunked.positions == stepped.positions).float().mean().item()
    assert same == 1.0 if selector == "randkv" else same > 0.995


def test_what_stays_refused_says_why():
    every_layer_slides = _config(layer_types=["sliding_attention"] * 4)
    with pytest.raises(rh.UnsupportedModelError, match="every layer .* 'sliding_attention'"):
        rh.RandKVCache(every_layer_slides, CONFIG, request_keys=[1])
    mistral = MistralConfig(num_hidden_layers=2, hidden_size=32, sliding_window=16)
    with pytest.raises(rh.UnsupportedModelError, match="every layer .*sliding_window=16"):
        rh.RandKVCache(mistral, CONFIG, request_keys=[1])
    chunked = _config(layer_types=["chunked_attention", "full_attention"] * 2)
    with pytest.raises(rh.UnsupportedModelError, match="layer 0 .* 'chunked_attention'"):
        rh.RandKVCache(chunked, CONFIG, request_keys=[1])


def test_gemma3_270m_decodes_what_the_oracle_recomputes():
    """The real Gemma 3 270M (five windowed layers to one global, W = 512), float32: a prompt
    past the window served whole (min_generated), rounds on its three full-attention layers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from randkv.models import fetch_model

    folder = fetch_model("gemma3-270m")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = " ".join(f"Item {i} is a {['red', 'blue', 'green'][i % 3]} box." for i in range(62))
    prompt = tokenizer(text + " The colour of item 37 is").input_ids
    config = RandKVConfig(budget=128, buffer_size=16, seed=5, min_generated=32)
    new_tokens = 100
    assert 512 < len(prompt) < 640  # past the window; K = P + 32
    real = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    key = request_key_from_content(prompt)
    cache = rh.RandKVCache(real, config, request_keys=[key], prompt_lengths=[len(prompt)])
    assert cache.layer_ids == (5, 11, 17)
    new, logprobs = rh.reference_decode(
        real, prompt, randkv=config, request_key=key, max_new_tokens=new_tokens
    )
    own = config.for_request(len(prompt))
    assert (
        spec.num_rounds(own, prompt_length=len(prompt), tokens_seen=len(prompt) + new_tokens - 1)
        >= 2
    )
    want = recompute_logprobs(folder, own, prompt, new, key)
    assert want.argmax(-1).tolist() == new
    chosen = want.gather(1, torch.tensor(new)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(logprobs), chosen, atol=2e-3, rtol=0)
