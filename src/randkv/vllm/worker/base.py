"""What RandKV's CPU and GPU workers share: RandKV's KV cache spec, the runner adopted at
start-up, rounds applied at the top of every step.

This module must never import `vllm.v1.worker.cpu_*` (directly or through another module):
vLLM's CPU worker package replaces torch's CUDA stream and event API process-wide when
imported, which would break a GPU worker.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec

from randkv.kernels.compactor import KVLayout
from randkv.vllm.options import NO_CONFIG, config_from_vllm
from randkv.vllm.refusals import UnsupportedModeError
from randkv.vllm.sched.kv_groups import (
    EVERY_LAYER_SLIDES,
    bounded_spec,
    is_latent_spec,
    is_state_spec,
    is_window_spec,
)
from randkv.vllm.worker.runner_class import adopt_model_runner

if TYPE_CHECKING:
    from randkv.spec.config import RandKVConfig


class RandKVWorkerMixin:
    """Shared by the CPU and GPU workers; `randkv_platform_mixins` are the platform's
    additions to the model runner (the GPU's Triton compactor and start-up compile)."""

    randkv_platform_mixins: tuple[type, ...] = ()
    randkv_config: RandKVConfig
    # vLLM's worker attributes RandKV reads (declared for the type checker).
    vllm_config: Any
    model_runner: Any  # vLLM's runner, with RandKVRunnerMixin's methods after init_device

    def init_device(self) -> None:
        super().init_device()  # type: ignore[misc]
        config = config_from_vllm(self.vllm_config)
        if config is None:
            raise ValueError(NO_CONFIG.format(cls=type(self).__name__))
        self.randkv_config = config
        adopt_model_runner(self.model_runner, self.randkv_platform_mixins)

    def get_kv_cache_spec(self) -> dict[str, Any]:
        specs = super().get_kv_cache_spec()  # type: ignore[misc]
        wrapped = {}
        for name, spec in specs.items():
            if is_window_spec(spec) or is_state_spec(spec):
                # A mixed model's window layer, a hybrid model's state layer: vLLM bounds it.
                wrapped[name] = spec
                continue
            if is_latent_spec(spec):  # MLA: one latent row per token, bounded the same way
                wrapped[name] = bounded_spec(spec)
                continue
            if isinstance(spec, MLAAttentionSpec):
                raise UnsupportedModeError(
                    f"RandKV supports MLA's plain latent cache (DeepSeek-V2/V3, Kimi K2); layer "
                    f"{name} is a sparse-attention or compressed MLA cache (DeepSeek V3.2/V4: "
                    "an indexer picks the tokens each query reads, from caches RandKV does "
                    "not move); serve this model without RandKV"
                )
            if type(spec) is not FullAttentionSpec or spec.sliding_window is not None:
                raise UnsupportedModeError(
                    f"RandKV supports full attention, with sliding-window attention or "
                    f"state-space / linear-attention layers beside it; layer {name} uses "
                    f"{type(spec).__name__}"
                )
            wrapped[name] = bounded_spec(spec)
        if wrapped and all(
            is_window_spec(spec) or is_state_spec(spec) for spec in wrapped.values()
        ):
            kinds = sorted({type(spec).__name__ for spec in wrapped.values()})
            raise UnsupportedModeError(EVERY_LAYER_SLIDES.format(kinds=kinds))
        return wrapped

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        super().initialize_from_config(kv_cache_config)  # type: ignore[misc]
        self.model_runner.randkv_setup(self.randkv_config, self.randkv_layout())

    def compile_or_warm_up_model(self, *args: Any, **kwargs: Any) -> Any:
        # vLLM's GPU warm-up (and 0.34's CPU one) runs real steps it builds itself.
        state = self.model_runner.randkv
        state.warming_up = True
        try:
            return super().compile_or_warm_up_model(*args, **kwargs)  # type: ignore[misc]
        finally:
            state.warming_up = False

    def execute_model(self, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        self.model_runner.randkv_before_step(scheduler_output)
        output = super().execute_model(scheduler_output, *args, **kwargs)  # type: ignore[misc]
        self.model_runner.randkv.metrics.add("step_seconds", time.perf_counter() - start)
        return output

    def randkv_layout(self) -> KVLayout:
        raise NotImplementedError

    def randkv_stats(self) -> dict[str, Any]:
        return self.model_runner.randkv_stats()

    def randkv_slot_positions(self, req_ids: list[str]) -> dict[str, Any]:
        return self.model_runner.randkv_slot_positions(req_ids)
