"""Test-only oracle: recompute a RandKV decode from scratch, without any cache.

One full-sequence forward where the query at position t sees, on a full-attention layer l and
KV head h, exactly the positions the spec says that head holds when t is decoded (retained
after t tokens, plus t itself), and on a sliding-window layer the positions (t - W, t], as
Transformers' window does; a hybrid model's state layers (Gated DeltaNet, Mamba2) run as
Transformers runs them, over every token. Nothing of `randkv.hf` runs here: only
`randkv.spec` and the model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AttentionInterface, AutoModelForCausalLM

from randkv import RandKVConfig, spec

ORACLE_NAME = "randkv_test_oracle"
_MASKS: dict[int, torch.Tensor] = {}  # layer -> (kv_heads, n, n) bool


def _oracle_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
    """Plain softmax attention with a per-(layer, KV head) mask over the whole sequence."""
    groups = query.shape[1] // key.shape[1]
    allowed = _MASKS[module.layer_idx].repeat_interleave(groups, 0)[None]
    scores = query @ key.repeat_interleave(groups, 1).transpose(-1, -2) * scaling
    probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
    out = probs @ value.repeat_interleave(groups, 1)
    return out.transpose(1, 2).contiguous(), probs


def recompute_logprobs(
    ckpt: str | Path, config: RandKVConfig, prompt: Sequence[int], new: Sequence[int], key: int
) -> torch.Tensor:
    """(len(new), vocab) float32 log-probabilities before each new token, recomputed."""
    AttentionInterface.register(ORACLE_NAME, _oracle_attention)
    oracle = AutoModelForCausalLM.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation=ORACLE_NAME
    )
    text = oracle.config.get_text_config(decoder=True)
    layer_types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    sequence = [*prompt, *new]
    n = len(sequence)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for layer, kind in enumerate(layer_types):
        if kind != "full_attention" and kind != "sliding_attention":
            continue  # a state (or MLP) layer: no attention, no mask
        if kind == "sliding_attention":
            window = causal & ~torch.ones(n, n, dtype=torch.bool).tril(-text.sliding_window)
            _MASKS[layer] = window[None].expand(text.num_key_value_heads, n, n)
            continue
        # MLA: one latent row per token shared by every head, one set per layer (kv_head 0).
        heads = 1 if getattr(text, "kv_lora_rank", None) else text.num_key_value_heads
        mask = torch.zeros(heads, n, n, dtype=torch.bool)
        for head in range(heads):
            for t in range(n):
                held = spec.retained_positions(
                    config,
                    prompt_length=len(prompt),
                    tokens_seen=t,
                    request_key=key,
                    layer=layer,
                    kv_head=head,
                )
                mask[head, t, [*held, t]] = True
        _MASKS[layer] = mask
    with torch.inference_mode():
        logits = oracle(torch.tensor([sequence]), use_cache=False).logits[0]
    return torch.log_softmax(logits[len(prompt) - 1 : n - 1].float(), dim=-1)


def assert_rows_decode_what_the_oracle_recomputes(
    ckpt: str | Path,
    model,
    config: RandKVConfig,
    prompts: Sequence[Sequence[int]],
    batch_new: Sequence[Sequence[int]],
    *,
    atol: float,
    min_rounds: int,
) -> None:
    """Each row's new tokens (decoded in one RandKV batch) against the from-scratch
    recompute: the adapter's teacher-forced log-probabilities within `atol`, the oracle's
    greedy tokens those rows decoded, at least `min_rounds` rounds per row."""
    import randkv.hf as rh
    from randkv import request_key_from_content

    for row, (prompt, new) in enumerate(zip(prompts, batch_new, strict=True)):
        key = request_key_from_content(list(prompt))
        want = recompute_logprobs(ckpt, config, prompt, new, key)
        got = rh.teacher_forced_logprobs(model, prompt, new, randkv=config, request_key=key)
        torch.testing.assert_close(got.logprobs, want, atol=atol, rtol=0)
        assert want.argmax(-1).tolist() == list(new), f"row {row}"
        seen = len(prompt) + len(new) - 1
        assert spec.num_rounds(config, prompt_length=len(prompt), tokens_seen=seen) >= min_rounds
