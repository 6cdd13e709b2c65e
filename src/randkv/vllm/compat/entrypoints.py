"""vLLM's command-line environment set-up, which moved between releases."""

from __future__ import annotations

from collections.abc import Callable


def find_cli_env_setup() -> Callable[[], None]:
    """vLLM's `cli_env_setup` (`vllm.entrypoints.common.startup` from 0.34,
    `vllm.entrypoints.serve.utils.api_utils` before)."""
    try:
        from vllm.entrypoints.common.startup import cli_env_setup as setup
    except ImportError:
        from vllm.entrypoints.serve.utils.api_utils import cli_env_setup as setup
    return setup
