"""Which vLLM model runner an engine uses.

vLLM 0.28 and 0.32 ship two model runners, V1 (`vllm.v1.worker.gpu_model_runner`) and V2
(`vllm.v1.worker.gpu.model_runner`), picked by `VllmConfig.use_v2_model_runner` (from
`VLLM_USE_V2_MODEL_RUNNER` and the platform); 0.34 removed V1 and the property, and refuses
the variable set to anything but 1.
"""

from __future__ import annotations

import importlib.util
from typing import Any

V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"


def has_v1_runner() -> bool:
    """Whether the installed vLLM still ships the V1 model runner."""
    return importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is not None


def uses_v2_runner(vllm_config: Any) -> bool:
    """Whether an engine with this configuration runs vLLM's V2 model runner."""
    choice = getattr(vllm_config, "use_v2_model_runner", None)
    return (not has_v1_runner()) if choice is None else bool(choice)
