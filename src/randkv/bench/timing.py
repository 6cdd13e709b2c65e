"""Timing and machine-description helpers shared by the benchmarks and `randkv check`."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True, kw_only=True)
class Timing:
    """Wall time of repeated calls of one function, in milliseconds."""

    median_ms: float
    min_ms: float
    repeats: int

    def rounded(self, digits: int) -> Timing:
        return replace(
            self, median_ms=round(self.median_ms, digits), min_ms=round(self.min_ms, digits)
        )

    def as_dict(self) -> dict[str, float]:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "repeats": self.repeats}


def time_calls(
    fn: Callable[[], object],
    *,
    repeats: int,
    warmup: int = 2,
    device: torch.device | None = None,
) -> Timing:
    """Median and min time of `fn` over `repeats` calls, after `warmup` calls.

    On a CUDA `device` each call is timed by CUDA events around it (the device's own time for
    the work it queued); elsewhere by the host clock around the call.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for _ in range(warmup):
        fn()
    cuda = device is not None and device.type == "cuda"
    samples = []
    for _ in range(repeats):
        if cuda:
            import torch

            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - began) * 1e3)
    return Timing(median_ms=statistics.median(samples), min_ms=min(samples), repeats=repeats)


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@dataclass(frozen=True, kw_only=True)
class Machine:
    """Where a benchmark ran."""

    cpu: str
    cores: int | None
    torch_threads: int
    python: str
    torch: str
    platform: str


def machine_info(threads: int | None = None) -> Machine:
    import torch

    return Machine(
        cpu=cpu_model(),
        cores=os.cpu_count(),
        torch_threads=threads if threads is not None else torch.get_num_threads(),
        python=platform.python_version(),
        torch=torch.__version__,
        platform=platform.platform(),
    )
