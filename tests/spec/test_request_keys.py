"""Request keys in the core and the Transformers adapter: an unsigned 64-bit int or a str
(through `request_key_from_text`); anything else is refused with the accepted types named."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import randkv.hf as rh
from randkv import RandKVConfig, coerce_request_key, request_key_from_text

CONFIG = RandKVConfig(budget=16, buffer_size=4, seed=1)
PROMPT = list(b"keys")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model(tiny_model_path: str):
    return AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)


@pytest.mark.parametrize("key", [0, 1, 2**63, 2**64 - 1, np.uint64(2**64 - 1), np.int32(7)])
def test_ints_are_the_key(key):
    assert coerce_request_key(key) == int(key)
    assert type(coerce_request_key(key)) is int


@pytest.mark.parametrize("text", ["", "a", "conv-17", "123", "ключ"])
def test_strings_are_hashed_by_request_key_from_text(text):
    assert coerce_request_key(text) == request_key_from_text(text)


@pytest.mark.parametrize("bad", [1.0, 1.5, True, False, b"a", [1], (1,), None, {1: 2}])
def test_other_types_are_refused_naming_the_accepted_ones(bad):
    with pytest.raises(TypeError, match=r"an int in \[0, 2\*\*64 - 1\] or a str"):
        coerce_request_key(bad)


@pytest.mark.parametrize("bad", [-1, 2**64, -(2**63)])
def test_out_of_range_ints_are_refused(bad):
    with pytest.raises(
        ValueError,
        match=r"out of range: .* \(unsigned 64-bit\) or a str",
    ):
        coerce_request_key(bad)


def test_hf_cache_and_generate_take_str_keys(model):
    ids = torch.tensor([PROMPT, list(b"KEYS")])
    by_text = rh.RandKVCache(model, CONFIG, request_keys=["a", "b"])
    assert by_text.request_keys == [request_key_from_text("a"), request_key_from_text("b")]
    ints = [request_key_from_text("a"), 5]
    mixed = rh.generate(model, ids, randkv=CONFIG, request_keys=["a", 5], max_new_tokens=30)
    assert torch.equal(
        mixed, rh.generate(model, ids, randkv=CONFIG, request_keys=ints, max_new_tokens=30)
    )
    single = rh.reference_decode(model, PROMPT, randkv=CONFIG, request_key="a", max_new_tokens=30)
    assert single == rh.reference_decode(
        model, PROMPT, randkv=CONFIG, request_key=ints[0], max_new_tokens=30
    )
    forced = rh.teacher_forced_logprobs(model, PROMPT, single[0], randkv=CONFIG, request_key="a")
    assert torch.equal(forced.token_logprobs, torch.tensor(single[1]))


@pytest.mark.parametrize("bad", [[1.0], [True], [b"a"], [[1]], [-1], [2**64]])
def test_hf_adapter_refuses_other_keys(model, bad):
    with pytest.raises((TypeError, ValueError), match=r"an int in \[0, 2\*\*64 - 1\].* or a str"):
        rh.RandKVCache(model, CONFIG, request_keys=bad)
    with pytest.raises((TypeError, ValueError), match=r"an int in \[0, 2\*\*64 - 1\].* or a str"):
        rh.reference_decode(model, PROMPT, randkv=CONFIG, request_key=bad[0], max_new_tokens=1)


def test_one_string_is_not_a_list_of_keys(model):
    with pytest.raises(TypeError, match="one key per batch row"):
        rh.RandKVCache(model, CONFIG, request_keys="ab")
