"""Where vLLM releases differ, in one place: one small module per behaviour.

RandKV's scheduler and workers call these instead of testing versions. Each reads what the
running release has (by name, not by version number), so a release that moves a thing again
fails a `randkv.vllm.release.drift` check before it can change a decision:

- `cpu_attention`: the ISA of vLLM's CPU attention kernels (on the kernel object up to 0.28,
  on the attention layer from 0.32).
- `queues`: how many requests wait (one queue plus `skipped_waiting` up to 0.28,
  `get_request_counts()` from 0.32).
- `entrypoints`: `cli_env_setup`, which moved to `vllm.entrypoints.common.startup` in 0.34,
  and where the API server app gets its middleware.
- `runner`: which model runner RandKV runs on (V1 up to 0.32, V2 in 0.32 and alone in 0.34;
  the release table says which RandKV supports) and the environment variable that picks it.

(The layers that share another layer's KV cache are read by each runner mixin, where its
runner keeps them: `randkv_shared_kv_layers` in `randkv.vllm.worker.runner_v1` / `runner_v2`.)
"""
