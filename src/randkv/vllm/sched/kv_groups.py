"""The KV cache spec RandKV's workers report (full attention bounded by K + 2r tokens), and
which KV cache group RandKV bounds (the full-attention one; a mixed model's sliding-window
groups and a hybrid model's state groups stay vLLM's)."""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm.utils.math_utils import cdiv
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

from randkv.vllm.options import config_from_vllm
from randkv.vllm.refusals import UnsupportedModeError


def _bounded_memory_bytes(spec: FullAttentionSpec, vllm_config: Any) -> int:
    """One request's most KV bytes under RandKV: K + 2r tokens of blocks (the largest K a
    request may ask for), plus a drafter's lookahead under speculative decoding; under
    `min_generated` a long prompt's own K grows with it, up to max_model_len."""
    config = config_from_vllm(vllm_config)
    tokens = vllm_config.model_config.max_model_len
    if config is not None and config.min_generated is None:
        lookahead = vllm_config.num_lookahead_tokens
        bound = config.largest_budget + 2 * config.buffer_size + lookahead
        tokens = min(tokens, bound)
    return cdiv(tokens, spec.block_size) * spec.page_size_bytes


@dataclasses.dataclass(frozen=True, kw_only=True)
class RandKVFullAttentionSpec(FullAttentionSpec):
    """Full attention whose per-request footprint is bounded by RandKV, not max_model_len
    (vLLM's start-up check sizes one max_model_len sequence from this method)."""

    def max_memory_usage_bytes(self, vllm_config: Any) -> int:
        return _bounded_memory_bytes(self, vllm_config)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RandKVMLAAttentionSpec(MLAAttentionSpec):
    """MLA's latent cache (one row per token shared by every head: DeepSeek-V2/V3, Kimi K2),
    bounded by RandKV like full attention."""

    def max_memory_usage_bytes(self, vllm_config: Any) -> int:
        return _bounded_memory_bytes(self, vllm_config)


def bounded_spec(spec: FullAttentionSpec) -> FullAttentionSpec:
    """`spec` as RandKV's bounded spec of its kind (dataclasses.replace cannot change the
    class): a latent (MLA) spec stays one, so vLLM's MLA managers and checks still apply."""
    bounded = (
        RandKVMLAAttentionSpec if isinstance(spec, MLAAttentionSpec) else RandKVFullAttentionSpec
    )
    return bounded(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)})


@dataclasses.dataclass(frozen=True)
class KVGroupLayout:
    """Which of an engine's KV cache groups RandKV bounds.

    `randkv` is the one full-attention group (its blocks follow RandKV's rounds); `windows`
    are the sliding-window groups of a mixed model (Gemma 3, gpt-oss), and `states` the
    fixed-size state groups of a hybrid model (Mamba2, Gated DeltaNet, short convolutions:
    vLLM's `MambaSpec`): vLLM's own managers bound both, and RandKV leaves them exactly as
    vLLM runs them, at absolute lengths. A dense model has one group and neither."""

    randkv: int
    windows: tuple[int, ...] = ()
    states: tuple[int, ...] = ()

    @property
    def absolute(self) -> tuple[int, ...]:
        """The groups vLLM runs at absolute lengths (every group but RandKV's), in order."""
        return tuple(sorted(self.windows + self.states))


EVERY_LAYER_SLIDES = (
    "every layer of this model slides or keeps a fixed-size state ({kinds}): vLLM already "
    "bounds its KV cache, and RandKV has no full-attention layer to evict from; serve it "
    "without RandKV"
)


def is_randkv_spec(spec: Any) -> bool:
    """Full attention (or MLA's latent cache) without a window or chunks: the layers RandKV
    evicts from."""
    return (
        (type(spec) in (FullAttentionSpec, RandKVFullAttentionSpec) or is_latent_spec(spec))
        and not getattr(spec, "sliding_window", None)
        and not getattr(spec, "attention_chunk_size", None)
    )


def is_latent_spec(spec: Any) -> bool:
    """MLA's plain latent cache (DeepSeek-V2/V3, Kimi K2: every kept token attended), not
    DeepSeek V3.2/V4's sparse-attention caches (an indexer picks which tokens attend, from
    cached index keys RandKV would have to move in step; compressed or aligned rows)."""
    return (
        type(spec) in (MLAAttentionSpec, RandKVMLAAttentionSpec)
        and getattr(spec, "model_version", None) is None
        and getattr(spec, "alignment", None) is None
        and getattr(spec, "compress_ratio", 1) == 1  # vLLM 0.28's field; 1: uncompressed
    )


def is_window_spec(spec: Any) -> bool:
    """vLLM's sliding-window attention (its own manager frees what leaves the window)."""
    return type(spec) is SlidingWindowSpec


def is_state_spec(spec: Any) -> bool:
    """A hybrid model's fixed-size state (Mamba2, Gated DeltaNet, short convolutions): one
    state per request however long it gets, which vLLM's own manager keeps."""
    return isinstance(spec, MambaSpec)


def kv_group_layout(kv_cache_config: Any) -> KVGroupLayout:
    """One full-attention KV cache group, and only sliding-window or state groups beside it."""
    groups = kv_cache_config.kv_cache_groups
    names = [type(group.kv_cache_spec).__name__ for group in groups]
    full = [i for i, group in enumerate(groups) if is_randkv_spec(group.kv_cache_spec)]
    windows = [i for i, group in enumerate(groups) if is_window_spec(group.kv_cache_spec)]
    states = [i for i, group in enumerate(groups) if is_state_spec(group.kv_cache_spec)]
    others = sorted(set(range(len(groups))) - set(full) - set(windows) - set(states))
    if any(getattr(groups[i].kv_cache_spec, "sliding_window", None) for i in others):
        raise UnsupportedModeError(
            "vLLM runs this model's sliding-window layers in full-attention KV cache groups "
            f"({names}: its hybrid KV cache manager is off); RandKV needs the window layers in "
            "their own groups: do not pass disable_hybrid_kv_cache_manager"
        )
    if others:
        raise UnsupportedModeError(
            f"RandKV supports full attention, with sliding-window attention or state-space / "
            f"linear-attention layers beside it; this model's KV cache groups are {names} "
            f"({names[others[0]]}: chunked-local, cross-attention or latent caches are not "
            "supported)"
        )
    if not full:
        raise UnsupportedModeError(EVERY_LAYER_SLIDES.format(kinds=names))
    if len(full) > 1:
        raise UnsupportedModeError(
            f"vLLM split this model's full-attention layers into {len(full)} KV cache groups "
            f"({names}); RandKV supports one full-attention group for now (vLLM makes one "
            "when the model has no more full-attention layers than it puts in a group)"
        )
    return KVGroupLayout(randkv=full[0], windows=tuple(windows), states=tuple(states))


@dataclasses.dataclass(frozen=True)
class AbsoluteCaps:
    """What footprint admission reserves for a request in the groups vLLM runs at absolute
    lengths (a mixed model's windows, a hybrid's states), beside the full-attention group's
    K + 2r.

    decode: the most blocks a decoding request holds at once there, summed over the groups:
        a window W - 1 tokens plus those of the steps in flight (one token and the drafts
        per step, two steps under async scheduling), a state vLLM's own bound (its blocks
        and prefill checkpoints).
    window_groups: how many window groups there are: a request still prefilling holds up to
        a chunk more in each (vLLM frees what left the window before each chunk)."""

    decode: int = 0
    window_groups: int = 0


def absolute_group_caps(
    kv_cache_config: Any, vllm_config: Any, layout: KVGroupLayout
) -> AbsoluteCaps:
    groups = kv_cache_config.kv_cache_groups
    decode_in_flight = 2 * (1 + vllm_config.num_lookahead_tokens)
    max_model_len = vllm_config.model_config.max_model_len
    decode = 0
    for group in layout.absolute:
        spec = groups[group].kv_cache_spec
        if is_window_spec(spec):
            decode += spec.max_admission_blocks_per_request(decode_in_flight, max_model_len)
        else:
            decode += cdiv(spec.max_memory_usage_bytes(vllm_config), spec.page_size_bytes)
    return AbsoluteCaps(decode=decode, window_groups=len(layout.windows))
