"""Timing RandKV's rounds without stalling the device.

On CPU a mark is `time.perf_counter()`. On CUDA a mark is a recorded CUDA event: reading an
elapsed time would wait for the GPU, so durations are collected later, once their end event
has completed (`harvest`, polled at the next step without blocking), or on demand (`wait`,
used when statistics are read, off the step path).
"""

from __future__ import annotations

import time
from typing import Any

import torch


class RoundTimer:
    def __init__(self, device: torch.device) -> None:
        self.on_cuda = device.type == "cuda"
        self._pending: list[tuple[str, Any, Any]] = []
        self._done: dict[str, float] = {}

    def mark(self) -> Any:
        if not self.on_cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def record(self, name: str, start: Any, end: Any) -> None:
        """Account the time between two marks under `name` (in seconds)."""
        if self.on_cuda:
            self._pending.append((name, start, end))
        else:
            self._done[name] = self._done.get(name, 0.0) + (end - start)

    def harvest(self) -> dict[str, float]:
        """Seconds per name that completed since the last harvest; never blocks."""
        still = []
        for name, start, end in self._pending:
            if end.query():
                seconds = start.elapsed_time(end) / 1000.0
                self._done[name] = self._done.get(name, 0.0) + seconds
            else:
                still.append((name, start, end))
        self._pending = still
        done, self._done = self._done, {}
        return done

    def wait(self) -> None:
        """Block until every pending duration is measurable (for reading statistics)."""
        for _, _, end in self._pending:
            end.synchronize()
