"""RandKV's side of vLLM's engine core: the scheduler (`scheduler`), its KV cache manager
(`cache_manager`) and their pure block arithmetic (`allocation`), what a step sends the
workers (`output`), which KV cache groups RandKV bounds (`kv_groups`), a request's identity
(`request_identity`), sync or async scheduling (`scheduling_mode`), and the per-step timeline
the benchmark reads (`timeline`).

Nothing here imports `randkv.vllm.worker` or `randkv.vllm.entrypoints`; the workers import
`output` and `kv_groups`, as vLLM's workers import its scheduler output. Empty on purpose:
importing a module of this package must not import vLLM's scheduler.
"""
