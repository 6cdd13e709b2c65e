"""Shutting down an in-process vLLM engine while others in the process keep running."""

from __future__ import annotations

from typing import Any
from unittest import mock


def shut_down_beside_others(llm: Any) -> None:
    """Stop `llm` (and any TP worker processes it has) mid-module.

    An in-process EngineCore's shutdown ends with `cleanup_dist_env_and_memory()`, which
    destroys this process's distributed groups: the ones the module's shared engines still
    use ("pipeline model parallel group is not initialized" on their next step). That one
    step is skipped here; the module's last engine cleans up for real (conftest.py). The
    client's shutdown is final, so collecting it later does not tear the groups down either.
    """
    import vllm.v1.engine.core as engine_core

    with mock.patch.object(engine_core, "cleanup_dist_env_and_memory", lambda *_, **__: None):
        llm.llm_engine.engine_core.shutdown()
