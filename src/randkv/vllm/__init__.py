"""RandKV inside vLLM 0.28.0, through vLLM's own `scheduler_cls` / `worker_cls` hooks.

from randkv.vllm import LLM
llm = LLM(model=..., randkv=RandKVConfig(budget=1024))
"""

from randkv.vllm.compat import check_vllm_version

check_vllm_version()

from randkv.vllm.engine_args import randkv_engine_kwargs  # noqa: E402
from randkv.vllm.llm import LLM  # noqa: E402

__all__ = ["LLM", "randkv_engine_kwargs"]
