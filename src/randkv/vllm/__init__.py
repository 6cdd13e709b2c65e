"""RandKV inside vLLM (the releases of `randkv.vllm.versions`), through vLLM's own
`scheduler_cls` / `worker_cls` hooks.

from randkv.vllm import LLM
llm = LLM(model=..., randkv=RandKVConfig(budget=1024))

Importing this package does not import vLLM: vLLM loads `randkv.vllm.plugin` in every one of
its processes, under any vLLM version, and the plugin must stay silent where it does not
apply. The names below check the vLLM version when first used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LLM", "randkv_engine_kwargs"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from randkv.vllm.support import check_vllm_version

    check_vllm_version()
    if name == "LLM":
        from randkv.vllm.llm import LLM

        return LLM
    from randkv.vllm.engine_args import randkv_engine_kwargs

    return randkv_engine_kwargs
