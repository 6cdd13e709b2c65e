"""Which Transformers models RandKV can serve: decoders with full-attention layers and
position-free caches, alone or mixed with sliding-window layers or with the fixed-size state
layers of hybrid models (Gated DeltaNet, Mamba2).

RandKV keeps each KV head's retained tokens in arbitrary slot order. That is exact only when
a layer attends to the whole retained set (full attention) and no bias depends on the
distance between query and key once keys are cached (RoPE is applied before caching; ALiBi
and relative-position biases are not). In a mixed model (Gemma 3, gpt-oss: `layer_types`
names each layer) RandKV bounds the full-attention layers and leaves the sliding-window ones
to Transformers' own window cache, which already bounds them. In a hybrid model (Qwen3-Next,
Nemotron-H) the linear-attention / state-space layers keep one fixed-size state per request
in Transformers' own cache layer: RandKV bounds the full-attention layers, the only memory
that grows. Anything else is refused up front: a model whose every layer slides or is
recurrent (nothing for RandKV to bound), chunked attention, ALiBi, hybrids that do not name
their layers' kinds in `layer_types`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["UnsupportedModelError", "check_supported", "randkv_layers", "unsupported_reason"]

# Layer types of Transformers' `config.layer_types`: plain (global, causal) attention, which
# RandKV bounds, and sliding-window attention, which Transformers' window cache bounds.
_FULL_ATTENTION = "full_attention"
_SLIDING_ATTENTION = "sliding_attention"
# Layer types of hybrid models without a per-token KV cache: a fixed-size recurrent or
# convolution state (Transformers' `LinearAttentionLayer`), or no cache at all (MLP / MoE
# blocks of Nemotron-H). RandKV leaves them exactly as Transformers runs them.
STATE_LAYER_TYPES = frozenset({"linear_attention", "conv", "mlp", "moe"})
# Model families whose attention adds ALiBi biases (no `layer_types` marks them).
_ALIBI_MODEL_TYPES = frozenset({"bloom", "mpt", "jais", "baichuan_13b"})
# Recurrent, state-space or otherwise cache-less families: no per-token KV to evict.
_RECURRENT_MODEL_TYPES = frozenset(
    {"mamba", "mamba2", "falcon_mamba", "rwkv", "xlstm", "recurrent_gemma", "lfm2"}
)
# Config attributes that describe per-layer block kinds of hybrid models.
_HYBRID_PATTERN_ATTRS = (
    "layers_block_type",
    "layers_block_types",
    "block_types",
    "hybrid_override_pattern",
    "attn_layer_indices",
)


class UnsupportedModelError(ValueError):
    """The model's attention cannot be served by RandKV (not full attention, or position biases)."""


def _get(config: Any, name: str, default: Any = None) -> Any:
    value = getattr(config, name, default)
    if value is default and isinstance(config, dict):
        value = config.get(name, default)
    return value


def _text_config(config: Any) -> Any:
    getter = getattr(config, "get_text_config", None)
    if getter is None:
        return config
    try:
        return getter(decoder=True)
    except TypeError:  # very old signatures without `decoder`
        return getter()


def unsupported_reason(config: Any) -> str | None:
    """Why RandKV cannot serve a model with this (Transformers) config, or None if it can."""
    if _get(config, "is_encoder_decoder", False):
        return "encoder-decoder models are not supported (decoder-only full attention only)"
    text = _text_config(config)
    model_type = str(_get(text, "model_type", "") or "")
    name = model_type or type(text).__name__
    if not _get(text, "is_causal", True):
        return f"{name} is configured with bidirectional attention (is_causal=False)"
    if model_type in _RECURRENT_MODEL_TYPES:
        return f"{name} layers are recurrent/state-space layers, not attention with a KV cache"
    attn_config = _get(text, "attn_config", None)
    if (
        model_type in _ALIBI_MODEL_TYPES
        or bool(_get(text, "alibi", False))
        or (attn_config is not None and bool(_get(attn_config, "alibi", False)))
        or _get(text, "position_embedding_type", None) == "alibi"
    ):
        return (
            f"{name} uses ALiBi position biases, which depend on the query-key distance at "
            "attention time; RandKV needs position-free cached keys (RoPE or none)"
        )
    layer_types = _get(text, "layer_types", None)
    if layer_types:
        for index, layer_type in enumerate(layer_types):
            if layer_type not in (_FULL_ATTENTION, _SLIDING_ATTENTION, *STATE_LAYER_TYPES):
                detail = ""
                if layer_type == "hybrid_sliding":
                    detail = f" (sliding_window={_get(text, 'sliding_window', None)})"
                elif layer_type == "chunked_attention":
                    detail = f" (attention_chunk_size={_get(text, 'attention_chunk_size', None)})"
                return (
                    f"layer {index} of this {name} model is {layer_type!r}{detail}; "
                    "RandKV supports 'full_attention' layers, beside 'sliding_attention' or "
                    "state layers ('linear_attention', 'conv', 'mlp', 'moe')"
                )
        if _FULL_ATTENTION not in layer_types:
            kinds = " or ".join(repr(kind) for kind in sorted(set(layer_types)))
            return (
                f"every layer of this {name} model is {kinds} (sliding_window="
                f"{_get(text, 'sliding_window', None)}): its memory is already bounded by the "
                "window or fixed-size states, and RandKV has no full-attention layer to bound"
            )
    for attr in _HYBRID_PATTERN_ATTRS:
        # `layer_types` names a hybrid's layers (checked above); without it, refuse.
        if not layer_types and _get(text, attr, None) is not None:
            return (
                f"{name} is a hybrid model ({attr}={_get(text, attr)!r}) whose config has no "
                "layer_types naming each layer's kind; RandKV needs them to find the "
                "full-attention layers"
            )
    sliding_window = _get(text, "sliding_window", None)
    windowed = sliding_window is not None and _get(text, "use_sliding_window", True) is not False
    if windowed and not layer_types:  # every layer slides (no layer_types says otherwise)
        return (
            f"every layer of this {name} model uses 'sliding_attention' (sliding_window="
            f"{sliding_window}): its KV is already bounded by the window and RandKV has no "
            "full-attention layer to bound"
        )
    chunk = _get(text, "attention_chunk_size", None)
    if chunk is not None:
        return (
            f"this {name} model uses 'chunked_attention' (attention_chunk_size={chunk}); "
            "RandKV supports 'full_attention' layers only"
        )
    if _get(text, "num_hidden_layers", None) is None:
        return f"{name} config has no num_hidden_layers; cannot size the cache"
    return None


def randkv_layers(config: Any) -> tuple[int, ...]:
    """The model layers RandKV bounds (its full-attention layers), for a supported config."""
    text = _text_config(config)
    layer_types = _get(text, "layer_types", None)
    count = int(_get(text, "num_hidden_layers"))
    if not layer_types:
        return tuple(range(count))
    return tuple(i for i, kind in enumerate(layer_types) if kind == _FULL_ATTENTION)


def check_supported(config: Any) -> None:
    """Raise UnsupportedModelError unless the config describes a full-attention decoder."""
    reason = unsupported_reason(config)
    if reason is not None:
        raise UnsupportedModelError(f"RandKV cannot serve this model: {reason}")
