"""RandKV (Random Attention, arXiv 2609.03430) and its no-prompt-protection ablation."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from randkv.hf.cache import RandKVCache
from randkv.planner import RoundPlanner, to_key_tensor
from randkv.quality.evictors.base import Evictor

__all__ = ["RandKV", "RandKVNoPrompt"]


class RandKV(Evictor):
    """The policy itself: uniform random candidates among non-prompt, non-buffer tokens.

    `select` is never called: the cache runs with ``selector=None``, RandKV's own planner, so
    the benchmark measures exactly the shipped code path.
    """

    name = "randkv"
    random = True

    def select(
        self, cache: RandKVCache, rows: Sequence[int], round_indices: Sequence[int]
    ) -> torch.Tensor:
        raise RuntimeError("RandKV runs through RandKVCache's own planner (selector=None)")


class RandKVNoPrompt(Evictor):
    """Ablation: the same hash draws, but over all of [0, K + r): prompt tokens can go.

    It is the spec's planner run with prompt length 0 for every row, so the draws are uniform
    r-subsets of the K + r oldest slots of each (layer, head).
    """

    name = "randkv-noprompt"
    protects_prompt = False
    random = True

    def __init__(self) -> None:
        self._planner: RoundPlanner | None = None

    def select(
        self, cache: RandKVCache, rows: Sequence[int], round_indices: Sequence[int]
    ) -> torch.Tensor:
        if self._planner is None or self._planner.config != cache.config:
            self._planner = RoundPlanner(
                cache.config, range(cache.num_layers), range(cache.num_kv_heads)
            )
        keys = to_key_tensor([cache.request_keys[b] for b in rows])
        return self._planner.plan([0] * len(rows), keys, list(round_indices)).evicted
