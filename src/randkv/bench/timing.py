"""Small timing and machine-description helpers shared by the benchmarks."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any


def time_calls(fn: Callable[[], Any], *, repeats: int, warmup: int = 2) -> dict[str, float]:
    """Median and min wall time of `fn` in milliseconds."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "repeats": repeats}


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


def machine_info(threads: int | None = None) -> dict[str, Any]:
    import torch

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": threads if threads is not None else torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }
