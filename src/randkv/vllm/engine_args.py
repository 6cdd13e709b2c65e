"""Turn the one RandKV call-site option into vLLM engine arguments, and refuse what RandKV
cannot serve correctly before the engine starts (the modes are listed in `refusals`)."""

from __future__ import annotations

import os
from typing import Any

from randkv.config import RandKVConfig
from randkv.vllm.compat.runner import V2_RUNNER_ENV, has_v1_runner
from randkv.vllm.options import ADDITIONAL_CONFIG_KEY
from randkv.vllm.refusals import (
    UnsupportedModeError,
    refuse_engine_kwargs,
    refused_modes,
)

__all__ = [
    "UnsupportedModeError",
    "check_engine_supported",
    "randkv_engine_kwargs",
    "use_v1_model_runner",
]

SCHEDULER_CLS = "randkv.vllm.scheduler.RandKVScheduler"
CPU_WORKER_CLS = "randkv.vllm.worker.RandKVCPUWorker"
GPU_WORKER_CLS = "randkv.vllm.gpu_worker.RandKVGPUWorker"

#: Engine arguments RandKV fills in itself.
INSTALLED_ENGINE_ARGS = ("scheduler_cls", "worker_cls", "additional_config", "async_scheduling")


def use_v1_model_runner() -> None:
    """Make vLLM pick its V1 model runner where it has one, or refuse a user's V2 choice.

    vLLM 0.28 and 0.32 pick the V2 runner by default on CUDA for dense models. The choice is
    an environment variable read in every engine process, so it is set in this process before
    the engine starts (spawned processes inherit it); it then also applies to other engines
    this process starts. vLLM 0.34 has only V2 (and refuses the variable set to 0).
    """
    if not has_v1_runner():
        return
    value = os.environ.get(V2_RUNNER_ENV)
    if value is not None and value.strip().lower() in ("1", "true"):
        raise UnsupportedModeError(
            f"RandKV needs vLLM's V1 model runner, but {V2_RUNNER_ENV}={value} asks for V2; "
            f"set {V2_RUNNER_ENV}=0 (or unset it)"
        )
    os.environ[V2_RUNNER_ENV] = "0"
    from vllm import envs

    # An engine that already ran in this process froze vLLM's environment cache.
    envs.disable_envs_cache()


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
    use_v1_model_runner()
    out = dict(kwargs)
    # vLLM would otherwise turn async scheduling on by default on GPUs.
    out["async_scheduling"] = False
    from vllm.platforms import current_platform

    out["scheduler_cls"] = SCHEDULER_CLS
    out["worker_cls"] = CPU_WORKER_CLS if current_platform.is_cpu() else GPU_WORKER_CLS
    additional = dict(out.get("additional_config") or {})
    additional[ADDITIONAL_CONFIG_KEY] = config
    out["additional_config"] = additional
    return out


def check_engine_supported(vllm_config: Any) -> None:
    """Refuse engine configurations RandKV cannot serve; runs in the engine process."""
    problems = refused_modes(vllm_config)
    if problems:
        raise UnsupportedModeError("RandKV does not support: " + "; ".join(problems))
