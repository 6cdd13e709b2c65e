"""Request keys: a caller key alone decides; otherwise content decides, never arrival."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402

from randkv import request_key_from_content, request_key_from_text  # noqa: E402
from randkv.vllm.sched.request_identity import derive_request_key, sampling_fingerprint  # noqa: E402


def test_caller_key_ignores_prompt_sampling_and_internal_id():
    a = SamplingParams(temperature=0, extra_args={"randkv_key": "conv-17"})
    b = SamplingParams(temperature=0.7, top_p=0.9, seed=5, extra_args={"randkv_key": "conv-17"})
    want = request_key_from_text("conv-17")
    assert derive_request_key([1, 2, 3], a, "req-a") == want
    assert derive_request_key([9, 9], b, "req-b") == want
    other = SamplingParams(temperature=0, extra_args={"randkv_key": "conv-18"})
    assert derive_request_key([1, 2, 3], other, "req-a") != want


def test_content_key_depends_on_prompt_and_sampling_not_on_internal_id():
    greedy = SamplingParams(temperature=0, max_tokens=10)
    longer = SamplingParams(temperature=0, max_tokens=500)  # length limits only truncate
    key = derive_request_key([1, 2, 3], greedy, "req-1")
    assert key == derive_request_key([1, 2, 3], greedy, "req-2")
    assert key == derive_request_key([1, 2, 3], longer, "req-3")
    assert key == request_key_from_content([1, 2, 3], sampling_fingerprint(greedy))
    assert key != derive_request_key([1, 2, 4], greedy, "req-1")
    seeded = SamplingParams(temperature=0.8, seed=1)
    assert derive_request_key([1, 2, 3], seeded, "x") != key


def test_unseeded_sampling_mixes_in_the_internal_id():
    params = SamplingParams(temperature=0.8)
    assert derive_request_key([1], params, "a") != derive_request_key([1], params, "b")
