"""Where users start RandKV: `llm` (`randkv.vllm.LLM`), `serve` (`randkv serve`), the
engine arguments RandKV fills in (`engine_args`), the HTTP server's request checks
(`front_door`), and which engine request a caller's request became (`engine_ids`). The
plugin (`randkv.vllm.plugin`, vLLM's entry point) calls into `engine_args` and
`front_door`."""
