"""A step's physical lengths, as both model runners need them: each request's own K, and how
many slots its rounds have emptied (its absolute length minus its physical length).

Attention reads physical lengths and slots; RoPE and the sampler keep absolute positions. Until
a request's first round the two agree, so a step whose requests have had no round leaves
vLLM's inputs untouched (`slots_evicted` returns None: decided on the host, no device work).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from randkv.kernels.hostsync import host_to_device
from randkv.spec.cadence import physical_lengths, rounds_completed
from randkv.spec.config import RandKVConfig


@dataclass(frozen=True)
class StepBudgets:
    """The K of each request scheduled this step: `default` (the server's) unless `own`
    names it (a long prompt under min_generated, or a request's own randkv_budget)."""

    default: int
    own: Mapping[str, int] = field(default_factory=dict)

    def of(self, req_id: str) -> int:
        return self.own.get(req_id, self.default)

    def rows(self, req_ids: Sequence[str]) -> np.ndarray | None:
        """The K of each of these requests (int64, host), or None when all have the
        server's K (the common case: one K for the whole batch)."""
        if not self.own:
            return None
        return np.array([self.of(r) for r in req_ids], dtype=np.int64)


def slots_evicted(
    config: RandKVConfig, tokens_seen: np.ndarray, budgets: np.ndarray | None
) -> np.ndarray | None:
    """Per row (host int64), the slots its rounds have emptied so far: r per round fired.
    None when no row has had a round yet (attention inputs stay vLLM's)."""
    seen = tokens_seen.astype(np.int64)
    if not rounds_completed(config, seen, budgets).any():
        return None
    return seen - physical_lengths(config, seen, budgets)


def physical_on_device(
    config: RandKVConfig, tokens_seen: torch.Tensor, budgets: np.ndarray | None
) -> torch.Tensor:
    """`physical_lengths` of device counts (int64), without a host sync; `budgets` (host,
    one K per row, or None for the server's) costs one small host-to-device copy."""
    seen = tokens_seen.to(torch.int64)
    if budgets is None:
        return physical_lengths(config, seen)
    budget = host_to_device(torch.from_numpy(budgets), seen.device)
    return physical_lengths(config, seen, budget)
