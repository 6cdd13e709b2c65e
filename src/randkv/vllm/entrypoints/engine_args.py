"""Turn the one RandKV call-site option into vLLM engine arguments, and refuse what RandKV
cannot serve correctly before the engine starts (the modes are listed in `refusals`)."""

from __future__ import annotations

from typing import Any

from randkv.spec.config import RandKVConfig
from randkv.vllm.options import ADDITIONAL_CONFIG_KEY
from randkv.vllm.refusals import UnsupportedModeError, refuse_engine_kwargs
from randkv.vllm.release.compat.runner import ask_for_supported_runner

__all__ = ["UnsupportedModeError", "randkv_engine_kwargs"]

SCHEDULER_CLS = "randkv.vllm.sched.scheduler.RandKVScheduler"
CPU_WORKER_CLS = "randkv.vllm.worker.RandKVCPUWorker"
GPU_WORKER_CLS = "randkv.vllm.worker.gpu.RandKVGPUWorker"

#: Engine arguments RandKV fills in itself (the last one only where vLLM has it: 0.34).
INSTALLED_ENGINE_ARGS = (
    "scheduler_cls",
    "worker_cls",
    "additional_config",
    "enable_extensible_kv_cache",
)


def engine_arg_names() -> frozenset[str]:
    """The fields of the installed vLLM's `EngineArgs`."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return frozenset(f.name for f in dataclasses.fields(EngineArgs))


def randkv_engine_kwargs(randkv: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """vLLM keyword arguments with RandKV's scheduler, worker and config filled in; `randkv`
    takes the forms `RandKVConfig.coerce` does (a RandKVConfig passes through unparsed), and
    the RandKVConfig itself goes into `additional_config`."""
    config = RandKVConfig.coerce(randkv)
    if config is None:
        return dict(kwargs)
    refuse_engine_kwargs(kwargs)
    for key in ("scheduler_cls", "worker_cls"):
        if kwargs.get(key) not in (None, "auto"):
            raise UnsupportedModeError(
                f"RandKV installs its own {key}; remove {key}={kwargs[key]!r} or turn RandKV off"
            )
    ask_for_supported_runner()
    out = dict(kwargs)
    if "enable_extensible_kv_cache" in engine_arg_names():
        # vLLM 0.34 maps KV pages only after warm-up on CUDA and then replaces the cache
        # tensors; RandKV needs its caches (and its memory reserve) fixed at start-up.
        out["enable_extensible_kv_cache"] = False
    from vllm.platforms import current_platform

    out["scheduler_cls"] = SCHEDULER_CLS
    out["worker_cls"] = CPU_WORKER_CLS if current_platform.is_cpu() else GPU_WORKER_CLS
    additional = dict(out.get("additional_config") or {})
    additional[ADDITIONAL_CONFIG_KEY] = config
    out["additional_config"] = additional
    return out
