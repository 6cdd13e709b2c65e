"""The KV cache spec RandKV's workers report (full attention bounded by K + 2r tokens), and
the scheduler's check that an engine's KV cache is one such group."""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm.utils.math_utils import cdiv
from vllm.v1.kv_cache_interface import FullAttentionSpec

from randkv.vllm.options import config_from_vllm
from randkv.vllm.refusals import UnsupportedModeError


@dataclasses.dataclass(frozen=True, kw_only=True)
class RandKVFullAttentionSpec(FullAttentionSpec):
    """Full attention whose per-request footprint is bounded by RandKV, not max_model_len.

    vLLM's start-up check sizes one max_model_len sequence from this method; with RandKV
    a request never holds more than K + 2r tokens of blocks (the largest K a request may ask
    for). Under `min_generated` a long prompt's own K grows with it, up to max_model_len.
    """

    def max_memory_usage_bytes(self, vllm_config: Any) -> int:
        config = config_from_vllm(vllm_config)
        tokens = vllm_config.model_config.max_model_len
        if config is not None and config.min_generated is None:
            tokens = min(tokens, config.largest_budget + 2 * config.buffer_size)
        return cdiv(tokens, self.block_size) * self.page_size_bytes


def bounded_spec(spec: FullAttentionSpec) -> RandKVFullAttentionSpec:
    """`spec` as a RandKVFullAttentionSpec (dataclasses.replace cannot change the class)."""
    return RandKVFullAttentionSpec(
        **{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    )


def check_kv_cache_groups(kv_cache_config: Any) -> None:
    """Exactly one full-attention KV cache group, no windows, sinks or latent caches."""
    groups = kv_cache_config.kv_cache_groups
    names = [type(group.kv_cache_spec).__name__ for group in groups]
    if len(groups) != 1:
        raise UnsupportedModeError(
            f"RandKV needs one full-attention KV cache group; this model has {names} "
            "(hybrid or mixed attention)"
        )
    spec = groups[0].kv_cache_spec
    if (
        type(spec) not in (FullAttentionSpec, RandKVFullAttentionSpec)
        or getattr(spec, "sliding_window", None)
        or getattr(spec, "attention_chunk_size", None)
    ):
        raise UnsupportedModeError(
            f"RandKV supports full attention only; this model's KV cache is {names[0]}"
        )
