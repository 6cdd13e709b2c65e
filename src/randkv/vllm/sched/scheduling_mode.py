"""RandKV follows vLLM's scheduling mode: synchronous, or async (vLLM's GPU default).

vLLM builds its `AsyncScheduler` instead of its `Scheduler` only while no `scheduler_cls` is
set (`SchedulerConfig.get_scheduler_cls`). RandKV sets one, so the class it names makes the
choice vLLM would have made: each scheduler class of RandKV's has an async twin (the same
class over vLLM's `AsyncScheduler`), and building the named class builds the twin when the
engine's `scheduler_config.async_scheduling` is on. Nothing else differs between the two:
see docs/vllm-integration.md, "Async scheduling", for why a round needs no other change.
"""

from __future__ import annotations

from typing import Any, ClassVar

from vllm.v1.core.sched.async_scheduler import AsyncScheduler


class FollowsSchedulingMode:
    """Mixin for a scheduler class named in `scheduler_cls`; set `randkv_async_twin` after both
    classes are defined."""

    randkv_async_twin: ClassVar[type | None] = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        twin = cls.randkv_async_twin
        if twin is not None and not issubclass(cls, AsyncScheduler):
            vllm_config = kwargs.get("vllm_config", args[0] if args else None)
            if vllm_config is not None and vllm_config.scheduler_config.async_scheduling:
                cls = twin  # Python then runs the twin's __init__ with the same arguments
        return object.__new__(cls)
