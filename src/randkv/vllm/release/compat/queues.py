"""How many requests a vLLM scheduler has waiting (for RandKV's per-step timeline)."""

from __future__ import annotations

from typing import Any


def num_waiting(scheduler: Any) -> int:
    """Requests waiting to run: not yet started, preempted, or held back.

    vLLM 0.32 counts its several waiting queues in `get_request_counts()`; 0.28 has the
    `waiting` queue plus `skipped_waiting`.
    """
    counts = getattr(scheduler, "get_request_counts", None)
    if counts is not None:
        return int(counts()[1])
    return len(scheduler.waiting) + len(scheduler.skipped_waiting)
