"""One worker's rounds: plan a step's round directives and apply them to its KV caches.

A worker holds a slice of the model (its tensor-parallel KV heads, its pipeline stage's
layers); draws are keyed by global layer and global KV head, so its plan is that slice of
the single-device plan (`randkv.vllm.worker.parallel`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from randkv.kernels.planner import RoundPlanner
from randkv.spec.config import RandKVConfig
from randkv.spec.rounds import RoundPlan
from randkv.vllm.metrics import RandKVRecorder
from randkv.vllm.sched.output import RoundDirective
from randkv.vllm.worker.parallel import KVHeadShard
from randkv.vllm.worker.round_timer import RoundTimer


class Compactor(Protocol):
    """What a compactor does (`randkv.kernels.compactor.PagedCompactor`, the Triton one)."""

    def apply(
        self, plan: RoundPlan, caches: Sequence[torch.Tensor], block_tables: torch.Tensor
    ) -> None: ...

    def moved_bytes(self, plan: RoundPlan, caches: Sequence[torch.Tensor]) -> int: ...


class RoundApplier:
    """Plans and applies rounds on the KV caches this worker holds, and counts what they do.

    layers: the global index of each cache in `caches` (the layers of the KV cache group
    RandKV bounds, in order); the planner draws for `shard.heads`, the global KV heads the
    caches hold."""

    def __init__(
        self,
        config: RandKVConfig,
        caches: list[torch.Tensor],
        layers: list[int],
        shard: KVHeadShard,
        compactor: Compactor,
        metrics: RandKVRecorder,
    ) -> None:
        device = caches[0].device
        self.config = config
        self.caches = caches
        self.shard = shard
        self.planner = RoundPlanner(config, layers, shard.heads, device=device)
        self.compactor = compactor
        self.metrics = metrics
        self.timer = RoundTimer(device)

    @property
    def layers(self) -> list[int]:
        return list(self.planner.layers)

    @property
    def kv_heads(self) -> list[int]:
        return list(self.planner.kv_heads)

    def apply(self, directives: Mapping[str, RoundDirective]) -> RoundPlan:
        """Plan and apply one round for each directive (rows in `directives`' order), before
        the step's forward pass."""
        rows = list(directives.values())
        width = max(len(d.block_ids) for d in rows)
        # Host data: the compactor copies it to the device without a sync.
        block_tables = torch.zeros((len(rows), width), dtype=torch.int64)
        for row, directive in enumerate(rows):
            blocks = torch.tensor(directive.block_ids, dtype=torch.int64)
            block_tables[row, : len(directive.block_ids)] = blocks
        start = self.timer.mark()
        plan = self.planner.plan(
            [d.prompt_length for d in rows],
            [d.request_key for d in rows],  # Python ints: the planner's fast path
            [d.round_index for d in rows],
            [d.budget for d in rows],
        )
        planned = self.timer.mark()
        self.compactor.apply(plan, self.caches, block_tables)
        done = self.timer.mark()
        self.timer.record("planning_seconds", start, planned)
        self.timer.record("compaction_seconds", planned, done)
        # A KV head replicated on several ranks (fewer KV heads than ranks) counts on one.
        entries = plan.evicted.numel() if self.shard.counts_evictions else 0
        self.metrics.add("rounds", len(rows))
        self.metrics.add("tokens_evicted", len(rows) * self.config.buffer_size)
        self.metrics.add("kv_entries_evicted", entries)
        self.metrics.add("kv_bytes_moved", self.compactor.moved_bytes(plan, self.caches))
        return plan

    def harvest_timings(self, wait: bool = False) -> None:
        """Add the round timings that have completed to the metrics (`wait`: all of them,
        blocking; for reading statistics off the step path)."""
        if wait:
            self.timer.wait()
        for name, seconds in self.timer.harvest().items():
            self.metrics.add(name, seconds)
