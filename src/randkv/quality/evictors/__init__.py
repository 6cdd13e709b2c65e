"""The evictors the quality benchmark compares, all on RandKV's cadence and budget.

| name | keeps | prompt protected |
|---|---|---|
| dense | everything (no round fires) | n/a |
| randkv | prompt + r newest + uniform random sample (per KV head) | yes |
| randkv-noprompt | r newest + uniform random sample of everything older | no |
| streamingllm | 4 sink tokens + most recent tokens | no |
| window | prompt + most recent tokens | yes |
| h2o | prompt + recent half + heavy hitters (accumulated attention) | yes |
| h2o-noprompt | recent half + heavy hitters, prompt competes (as in the paper) | no |
| snapkv | prompt + r newest + top observation-window votes, pooled | yes |
| tova | prompt + r newest + top attention of the newest query | yes |
"""

from __future__ import annotations

from collections.abc import Callable

from randkv.quality.evictors.base import AttentionScored, Evictor, attention_hooks, lowest
from randkv.quality.evictors.h2o import H2O
from randkv.quality.evictors.randkv import RandKV, RandKVNoPrompt
from randkv.quality.evictors.recency import PromptWindow, StreamingLLM
from randkv.quality.evictors.snapkv import SnapKV
from randkv.quality.evictors.tova import TOVA

__all__ = [
    "DENSE",
    "EVICTORS",
    "AttentionScored",
    "Evictor",
    "attention_hooks",
    "lowest",
    "make_evictor",
]

#: Name of the no-eviction reference (runs the same loop with a budget no round reaches).
DENSE = "dense"

#: Factories by name, in report order (dense is handled by the evaluation loop).
EVICTORS: dict[str, Callable[[], Evictor]] = {
    "randkv": RandKV,
    "randkv-noprompt": RandKVNoPrompt,
    "streamingllm": StreamingLLM,
    "window": PromptWindow,
    "h2o": H2O,
    "h2o-noprompt": lambda: H2O(protect_prompt=False),
    "snapkv": SnapKV,
    "tova": TOVA,
}


def make_evictor(name: str) -> Evictor:
    """A fresh evictor (they keep per-batch state) by its name."""
    try:
        return EVICTORS[name]()
    except KeyError:
        raise ValueError(f"unknown evictor {name!r}; choose from {[DENSE, *EVICTORS]}") from None
