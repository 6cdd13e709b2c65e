"""The KV cache spec RandKV's workers report: full attention bounded by K + 2r tokens."""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm.utils.math_utils import cdiv
from vllm.v1.kv_cache_interface import FullAttentionSpec

from randkv.vllm.engine_args import config_from_vllm


@dataclasses.dataclass(frozen=True, kw_only=True)
class RandKVFullAttentionSpec(FullAttentionSpec):
    """Full attention whose per-request footprint is bounded by RandKV, not max_model_len.

    vLLM's start-up check sizes one max_model_len sequence from this method; with RandKV
    a request never holds more than K + 2r tokens of blocks.
    """

    def max_memory_usage_bytes(self, vllm_config: Any) -> int:
        config = config_from_vllm(vllm_config)
        tokens = vllm_config.model_config.max_model_len
        if config is not None:
            tokens = min(tokens, config.max_physical_length)
        return cdiv(tokens, self.block_size) * self.page_size_bytes

    @classmethod
    def wrap(cls, spec: FullAttentionSpec) -> RandKVFullAttentionSpec:
        # dataclasses.replace cannot change the class: copy the fields.
        return cls(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)})
