"""Turn the one RandKV call-site option into vLLM engine arguments, and refuse what RandKV
cannot serve correctly before the engine starts."""

from __future__ import annotations

import dataclasses
from typing import Any

from randkv.config import RandKVConfig

ADDITIONAL_CONFIG_KEY = "randkv"
SCHEDULER_CLS = "randkv.vllm.scheduler.RandKVScheduler"
CPU_WORKER_CLS = "randkv.vllm.worker.RandKVCPUWorker"
GPU_WORKER_CLS = "randkv.vllm.worker.RandKVGPUWorker"


class UnsupportedModeError(ValueError):
    """A vLLM feature whose correctness under RandKV eviction is not shown."""


def config_from_vllm(vllm_config: Any) -> RandKVConfig | None:
    """The RandKVConfig carried in vLLM's `additional_config`, or None if RandKV is off."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    values = extra.get(ADDITIONAL_CONFIG_KEY) if isinstance(extra, dict) else None
    return RandKVConfig(**values) if values else None


_REFUSED_KWARGS = {
    "speculative_config": "speculative decoding",
    "kv_transfer_config": "KV transfer / disaggregated serving",
    "ec_transfer_config": "encoder-cache transfer",
}


def randkv_engine_kwargs(randkv: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """vLLM keyword arguments with RandKV's scheduler, worker and config filled in."""
    config = RandKVConfig.coerce(randkv)
    if config is None:
        return dict(kwargs)
    for key, what in _REFUSED_KWARGS.items():
        if kwargs.get(key):
            raise UnsupportedModeError(f"RandKV does not support {what} ({key} is set)")
    for key in ("scheduler_cls", "worker_cls"):
        if kwargs.get(key) not in (None, "auto"):
            raise UnsupportedModeError(
                f"RandKV installs its own {key}; remove {key}={kwargs[key]!r} or turn RandKV off"
            )
    if int(kwargs.get("pipeline_parallel_size", 1)) > 1:
        raise UnsupportedModeError(
            "RandKV under vLLM pipeline parallelism is not verified (vLLM 0.28.0's CPU "
            "pipeline parallel fails on its own); use tensor parallelism"
        )
    if kwargs.get("async_scheduling"):
        raise UnsupportedModeError(
            "RandKV needs synchronous scheduling (a round's directive must reach the workers "
            "in the step it fires); remove async_scheduling=True"
        )
    out = dict(kwargs)
    # vLLM would otherwise turn async scheduling on by default on GPUs.
    out["async_scheduling"] = False
    from vllm.platforms import current_platform

    out["scheduler_cls"] = SCHEDULER_CLS
    out["worker_cls"] = CPU_WORKER_CLS if current_platform.is_cpu() else GPU_WORKER_CLS
    additional = dict(out.get("additional_config") or {})
    additional[ADDITIONAL_CONFIG_KEY] = dataclasses.asdict(config)
    out["additional_config"] = additional
    return out


def check_engine_supported(vllm_config: Any) -> None:
    """Refuse engine configurations RandKV cannot serve; runs in the engine process."""
    problems = []
    model = vllm_config.model_config
    if vllm_config.speculative_config is not None:
        problems.append("speculative decoding")
    if vllm_config.kv_transfer_config is not None:
        problems.append("KV transfer / disaggregated serving")
    if getattr(vllm_config, "ec_transfer_config", None) is not None:
        problems.append("encoder-cache transfer")
    if getattr(model, "use_mla", False):
        problems.append("MLA attention (one shared latent cache, not per-head KV)")
    if getattr(model, "is_hybrid", False) or getattr(model, "is_attention_free", False):
        problems.append("hybrid / attention-free models (state-space or linear layers)")
    if getattr(model, "uses_alibi", False):
        problems.append("ALiBi (its bias depends on slot distance)")
    if getattr(model, "is_encoder_decoder", False):
        problems.append("encoder-decoder models (cross attention)")
    if model.get_sliding_window() is not None:
        problems.append("sliding-window attention")
    if getattr(model, "uses_mrope", False):
        problems.append("M-RoPE multimodal positions")
    parallel = vllm_config.parallel_config
    if parallel.pipeline_parallel_size > 1:
        problems.append("pipeline parallelism (not verified)")
    # vLLM runs the data-parallel ranks of a dense model as independent engines (each sees
    # data_parallel_size == 1 here), which RandKV supports like separate replicas; MoE ranks
    # step in lockstep with dummy batches.
    if parallel.data_parallel_size > 1:
        problems.append(
            "lockstep data parallelism of MoE models (not verified; run independent replicas)"
        )
    if getattr(parallel, "decode_context_parallel_size", 1) > 1:
        problems.append("decode context parallelism")
    if getattr(parallel, "prefill_context_parallel_size", 1) > 1:
        problems.append("prefill context parallelism")
    if vllm_config.scheduler_config.async_scheduling:
        problems.append("async scheduling (set async_scheduling=False)")
    if getattr(vllm_config, "use_v2_model_runner", False):
        problems.append("vLLM's V2 model runner (unset VLLM_USE_V2_MODEL_RUNNER)")
    if vllm_config.cache_config.cache_dtype not in ("auto", None):
        problems.append(
            f"quantized KV cache (kv_cache_dtype={vllm_config.cache_config.cache_dtype})"
        )
    if problems:
        raise UnsupportedModeError("RandKV does not support: " + "; ".join(problems))


def check_kv_cache_groups(kv_cache_config: Any) -> None:
    """Exactly one full-attention KV cache group, no windows, sinks or latent caches."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    groups = kv_cache_config.kv_cache_groups
    names = [type(group.kv_cache_spec).__name__ for group in groups]
    if len(groups) != 1:
        raise UnsupportedModeError(
            f"RandKV needs one full-attention KV cache group; this model has {names} "
            "(hybrid or mixed attention)"
        )
    spec = groups[0].kv_cache_spec
    allowed = type(spec) is FullAttentionSpec or type(spec).__name__ == "RandKVFullAttentionSpec"
    if (
        not allowed
        or getattr(spec, "sliding_window", None)
        or getattr(spec, "attention_chunk_size", None)
    ):
        raise UnsupportedModeError(
            f"RandKV supports full attention only; this model's KV cache is {names[0]}"
        )
