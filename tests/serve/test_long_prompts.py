"""Prompts longer than K over HTTP: a four-turn chat whose context outgrows K, served by
`randkv serve --randkv-min-generated` with prefix caching on, token for token what the
Transformers reference decodes with the same evictions."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

import httpx  # noqa: E402
from serving import ENGINE_ARGS, one_cpu  # noqa: E402

from randkv import RandKVConfig, request_key_from_text  # noqa: E402
from randkv.bench.server import SERVED_MODEL_NAME, running_server  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.vllm_part_1]

LONG = RandKVConfig(budget=64, buffer_size=8, seed=5, min_generated=24)
QUESTIONS = [
    "Tell me a story about a lighthouse.",
    "Now make the keeper a cat.",
    "What did the cat see at night?",
    "End the story in one line.",
]
ANSWER_TOKENS = 48


@pytest.fixture(scope="module")
def server(tiny_model_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("long") / "server.log"
    # Under min_generated a request may hold up to max_model_len tokens: the pool fits one.
    engine_args = {
        **ENGINE_ARGS,
        "max_model_len": 512,
        "enable_prefix_caching": True,
        "enable_prompt_tokens_details": True,
    }
    with one_cpu(), running_server(str(tiny_model_path), LONG, engine_args, log) as running:
        yield running


def test_a_four_turn_chat_past_k_equals_the_reference(server, tiny_model_path):
    import torch
    from transformers import AutoModelForCausalLM

    from randkv.hf import reference_decode

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, torch_dtype=torch.float32)
    before = server.metrics()
    messages: list[dict[str, str]] = []
    prompts, cached = [], []
    with httpx.Client(timeout=300.0) as http:
        for turn, question in enumerate(QUESTIONS):
            messages.append({"role": "user", "content": question})
            key = f"chat-turn-{turn}"
            response = http.post(
                f"{server.base_url}/v1/chat/completions",
                json={
                    "model": SERVED_MODEL_NAME,
                    "messages": messages,
                    "max_tokens": ANSWER_TOKENS,
                    "temperature": 0,
                    "ignore_eos": True,
                    "return_token_ids": True,
                    "vllm_xargs": {"randkv_key": key},
                },
            )
            assert response.status_code == 200, response.text
            body = response.json()
            choice = body["choices"][0]
            prompt_ids, served = body["prompt_token_ids"], choice["token_ids"]
            assert len(served) == ANSWER_TOKENS
            reference, _ = reference_decode(
                model,
                prompt_ids,
                randkv=LONG,
                request_key=request_key_from_text(key),
                max_new_tokens=ANSWER_TOKENS,
            )
            assert served == reference, f"turn {turn}"
            prompts.append(len(prompt_ids))
            details = body["usage"].get("prompt_tokens_details") or {}
            cached.append(details.get("cached_tokens") or 0)
            messages.append({"role": "assistant", "content": choice["message"]["content"]})
    # The context passed K, and later turns reused the earlier turns' prompt blocks.
    assert prompts[0] < LONG.budget < prompts[-1]
    assert all(c > 0 for c in cached[1:]), cached
    after = server.metrics()
    long_turns = sum(p > LONG.budget for p in prompts)
    assert after["randkv:long_prompts_total"] - before["randkv:long_prompts_total"] == long_turns
    assert after["randkv:rounds_total"] > before["randkv:rounds_total"]
    assert after["randkv:rejected_prompts_total"] == before["randkv:rejected_prompts_total"]
