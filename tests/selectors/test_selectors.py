"""The selector interface: the worked examples of docs/selectors.md run through RandKVCache,
the registry's names, and what the cache records for which policy."""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import randkv.hf as rh
from randkv import RandKVConfig
from randkv.models.tiny import PAD_ID
from randkv.selectors import H2O, RandKV, Selector
from randkv.selectors.registry import POLICIES, make_selector, policy_names

DOC = Path(__file__).resolve().parents[2] / "docs" / "selectors.md"
left_pad = partial(rh.left_pad, pad_id=PAD_ID)
CONFIG = RandKVConfig(budget=24, buffer_size=4, seed=5)
PROMPTS = [list(b"selectors"), list(b"hi"), list(b"a longer prompt here")]
NEW_TOKENS = 50  # 6 to 10 rounds per row

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def examples() -> dict:
    """The policies defined in the documentation's code blocks."""
    namespace: dict = {}
    for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S):
        if "class " in block:
            exec(compile(block, str(DOC), "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def eager(tiny_model_path: str):
    return AutoModelForCausalLM.from_pretrained(
        tiny_model_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def run(model, selector: Selector) -> tuple[torch.Tensor, rh.RandKVCache]:
    ids, mask = left_pad(PROMPTS)
    cache = rh.RandKVCache.from_inputs(model, ids, mask, randkv=CONFIG, selector=selector)
    out = rh.generate(model, ids, mask, randkv=None, cache=cache, max_new_tokens=NEW_TOKENS)
    return out, cache


def test_documented_example_keeps_the_first_k_and_the_newest(eager, examples):
    policy = examples["KeepEarliest"]()
    assert policy.name == "keep-earliest"
    _, cache = run(eager, policy)
    k, r = CONFIG.budget, CONFIG.buffer_size
    assert cache.rounds_applied >= 6 * len(PROMPTS)
    for row in range(len(PROMPTS)):
        seen = cache.tokens_seen(row)
        length = k + r + (seen - k - 2 * r) % r  # the cadence once rounds have fired
        # Evicting the newest candidates each round leaves positions 0 .. K - 1 untouched
        # and the tokens that arrived since the last round plus the r before them.
        want = set(range(k)) | set(range(seen - (length - k), seen))
        for layer in range(cache.num_layers):
            for head in range(cache.num_kv_heads):
                assert set(cache.retained_positions(row, layer, head)) == want


def test_documented_attention_example_is_h2o_without_a_recent_window(eager, examples):
    out, cache = run(eager, examples["LeastAttended"]())
    h2o_out, h2o_cache = run(eager, H2O(recent_fraction=0.0))
    assert torch.equal(out, h2o_out)
    for row in range(len(PROMPTS)):
        for layer in range(cache.num_layers):
            for head in range(cache.num_kv_heads):
                held = cache.retained_positions(row, layer, head)
                assert held == h2o_cache.retained_positions(row, layer, head)
    assert cache.last_query_slots is not None  # recorded: the policy reads attention


def test_default_selector_is_randkv_and_records_no_attention(eager):
    ids, mask = left_pad(PROMPTS)
    plain = rh.generate(eager, ids, mask, randkv=CONFIG, max_new_tokens=NEW_TOKENS)
    cache = rh.RandKVCache.from_inputs(eager, ids, mask, randkv=CONFIG, track_positions=False)
    assert cache.selector == RandKV()
    out = rh.generate(eager, ids, mask, randkv=None, cache=cache, max_new_tokens=NEW_TOKENS)
    assert torch.equal(plain, out)
    assert cache.last_query_slots is None


def test_registry_names_are_the_selectors_names():
    names = policy_names()
    assert len(set(names)) == len(names) == len(POLICIES)
    for name, policy in zip(names, POLICIES, strict=True):
        assert policy.name == name
        assert make_selector(name) == policy  # the registered parameters
        assert make_selector(name) is not make_selector(name)  # a fresh copy each time
    assert H2O(protect_prompt=False).name == "h2o-noprompt"
    with pytest.raises(ValueError, match=r"unknown policy 'nope'; choose from \['randkv', "):
        make_selector("nope")


def test_cache_checks_what_a_selector_declares(eager, tiny_model_path):
    with pytest.raises(ValueError, match="track_positions=True"):
        rh.RandKVCache(eager, CONFIG, request_keys=[1], track_positions=False, selector=H2O())
    with pytest.raises(TypeError, match="randkv.selectors.Selector"):
        rh.RandKVCache(eager, CONFIG, request_keys=[1], selector=object())
    sdpa = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    ids = torch.tensor([PROMPTS[0]])
    cache = rh.RandKVCache.from_inputs(sdpa, ids, randkv=CONFIG, selector=H2O())
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        rh.generate(sdpa, ids, randkv=None, cache=cache, max_new_tokens=2)
