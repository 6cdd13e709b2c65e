"""The Transformers adapter on the model families beyond dense GQA, against the from-scratch
oracle (recompute_oracle.py) and the spec: hybrid models (RandKV on the full-attention layers,
Transformers' own linear-attention state on the Gated DeltaNet layers of Qwen3-Next and the
Mamba2 layers of Nemotron-H) and MLA (DeepSeek-V3: one latent "head" per layer, the spec's
draws with kv_head 0).

The tiny random checkpoints (`randkv.models.tiny_families`) run here in float32; a
left-padded batch checks that pad columns stay out of the state layers.
"""

from __future__ import annotations

import pytest
import torch
from recompute_oracle import assert_rows_decode_what_the_oracle_recomputes
from transformers import AutoModelForCausalLM

import randkv.hf as rh
from randkv import RandKVConfig, request_key_from_content, spec
from randkv.models.tiny_families import build_tiny_family_checkpoint

PAD = 258
CONFIG = RandKVConfig(budget=24, buffer_size=4, seed=3)  # K + 2r = 32
PROMPTS = [[40 + (5 * j) % 60 for j in range(7)], [33 + (11 * j) % 80 for j in range(19)]]
NEW_TOKENS = 40  # several rounds per row
FULL_LAYERS = {"qwen3_next": (3,), "nemotron_h": (1, 4), "deepseek_v3": (0, 1)}

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=sorted(FULL_LAYERS))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def ckpt(family: str) -> str:
    return str(build_tiny_family_checkpoint(family))


@pytest.fixture(scope="module")
def model(ckpt: str):
    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)


@pytest.fixture(scope="module")
def batch_new(model) -> list[list[int]]:
    """New tokens of each row from one left-padded batched RandKV generation."""
    ids, mask = rh.left_pad(PROMPTS, PAD)
    out = rh.generate(model, ids, mask, randkv=CONFIG, max_new_tokens=NEW_TOKENS, eos_token_id=[])
    return [out[b, ids.shape[1] :].tolist() for b in range(len(PROMPTS))]


def test_the_cache_bounds_the_full_layers_and_keeps_transformers_states(family, model):
    from transformers.cache_utils import LinearAttentionLayer

    cache = rh.RandKVCache(model, CONFIG, request_keys=[1])
    assert cache.layer_ids == FULL_LAYERS[family]
    states = [i for i, layer in enumerate(cache.layers) if isinstance(layer, LinearAttentionLayer)]
    assert sorted(states + list(cache.layer_ids)) == list(range(model.config.num_hidden_layers))


def test_each_row_decodes_what_the_oracle_recomputes(ckpt, model, batch_new):
    """Left-padded batch rows (own prompts, own rounds) against a from-scratch recompute that
    applies the spec's per-head sets on the full-attention layers."""
    assert_rows_decode_what_the_oracle_recomputes(
        ckpt, model, CONFIG, PROMPTS, batch_new, atol=2e-4, min_rounds=3
    )


def test_evictions_change_the_answer(model, batch_new):
    """The oracle test can fail: without RandKV the model says other things."""
    for prompt, new in zip(PROMPTS, batch_new, strict=True):
        dense = model.generate(
            torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None
        )
        assert dense[0, len(prompt) :].tolist() != new


def test_slot_maps_are_the_specs(model):
    prompt = PROMPTS[1]
    key = request_key_from_content(prompt)
    cache = rh.RandKVCache(model, CONFIG, request_keys=[key])
    rh.generate(
        model, torch.tensor([prompt]), randkv=CONFIG, cache=cache, max_new_tokens=NEW_TOKENS,
        eos_token_id=[],
    )  # fmt: skip
    seen = len(prompt) + NEW_TOKENS - 1
    for layer in cache.layer_ids:
        for head in range(cache.num_kv_heads):
            want = spec.slot_positions(
                CONFIG, prompt_length=len(prompt), tokens_seen=seen, request_key=key,
                layer=layer, kv_head=head,
            )  # fmt: skip
            assert cache.slot_positions(0, layer, head) == want
