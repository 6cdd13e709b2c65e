"""A per-step record of running/waiting requests and KV blocks in use, written by the
scheduler in the engine process when RANDKV_TIMELINE names a file.

The serving benchmark reads it for both arms: sampling /metrics from a client misses
seconds at a time on a busy machine, while the scheduler sees every step. Recording
changes no scheduling decision.
"""

from __future__ import annotations

import os
import time
from typing import Any, TextIO

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from randkv.vllm.release.compat.queues import num_waiting
from randkv.vllm.sched.scheduling_mode import FollowsSchedulingMode

TIMELINE_ENV = "RANDKV_TIMELINE"


class TimelineMixin:
    """Appends `unix_time running waiting kv_blocks_used` after every schedule() call, after
    a first line `# scheduling async|sync` (the mode vLLM runs this scheduler in)."""

    _timeline: TextIO | None
    # vLLM's scheduler state the record reads (declared for the type checker).
    kv_cache_manager: Any
    running: list[Any]

    def _open_timeline(self) -> None:
        path = os.environ.get(TIMELINE_ENV)
        self._timeline = open(path, "a", buffering=1) if path else None  # noqa: SIM115
        if self._timeline is not None:
            mode = "async" if isinstance(self, AsyncScheduler) else "sync"
            self._timeline.write(f"# scheduling {mode}\n")

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        output = super().schedule(*args, **kwargs)  # type: ignore[misc]  # vLLM's Scheduler
        if self._timeline is not None:
            pool = self.kv_cache_manager.block_pool
            used = pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()  # minus the null block
            waiting = num_waiting(self)
            self._timeline.write(f"{time.time():.6f} {len(self.running)} {waiting} {used}\n")
        return output


class TimelineScheduler(FollowsSchedulingMode, TimelineMixin, Scheduler):
    """vLLM's own scheduler plus the timeline record: the benchmark's plain-vLLM arm (under
    vLLM's async scheduling, `AsyncTimelineScheduler`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open_timeline()


class AsyncTimelineScheduler(TimelineScheduler, AsyncScheduler):
    """`TimelineScheduler` over vLLM's `AsyncScheduler`."""


TimelineScheduler.randkv_async_twin = AsyncTimelineScheduler


def read_timeline(path: str | os.PathLike[str]) -> list[tuple[float, int, int, int]]:
    rows = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.startswith("#"):
                continue
            t, running, waiting, used = line.split()
            rows.append((float(t), int(running), int(waiting), int(used)))
    return rows


def timeline_scheduling(path: str | os.PathLike[str]) -> str | None:
    """The scheduling mode a timeline's scheduler ran in ("async" or "sync")."""
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if line.startswith("# scheduling "):
                return line.split()[-1]
    return None
