"""RandKV's side of vLLM's workers: the CPU and GPU workers (`cpu`, `gpu`, sharing `base`),
the model runner's hooks (`runner`, with `runner_v1` / `runner_v2` for vLLM's two model
runners, assembled by `runner_class`), the state RandKV owns in each worker (`state`: the
rounds it plans and applies, `records`: per-request records and slot maps), the
physical/absolute length shift (`lengths`), speculative drafters' physical slots
(`drafters_v1`, `drafters_v2`), a mixed model's window lengths
(`window_lengths`), the parallel layout (`parallel`) and the round timer (`round_timer`).

Empty on purpose: importing `randkv.vllm.worker.gpu` must not import vLLM's CPU worker
package (it patches torch's CUDA API process-wide), so nothing here imports a worker.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    # `worker_cls="randkv.vllm.worker.RandKVCPUWorker"`, the CPU worker's path before the
    # package had rooms, still resolves (lazily: only when asked for).
    if name == "RandKVCPUWorker":
        from randkv.vllm.worker.cpu import RandKVCPUWorker

        return RandKVCPUWorker
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
