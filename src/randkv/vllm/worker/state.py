"""What RandKV keeps in a worker: one object, held as `runner.randkv` on vLLM's model runner
(as vLLM's V2 runner keeps its request states, block tables and input buffers as objects).

The runner mixins (`randkv.vllm.worker.runner`, `runner_v1`, `runner_v2`) keep only the hooks
into vLLM's runner; what RandKV decides and records lives here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from randkv.spec.config import RandKVConfig
from randkv.vllm.metrics import RandKVRecorder, RankStats
from randkv.vllm.sched.kv_groups import KVGroupLayout
from randkv.vllm.sched.output import RandKVSchedulerOutput, RandKVStepPlan
from randkv.vllm.worker.lengths import StepBudgets
from randkv.vllm.worker.records import RequestRecords
from randkv.vllm.worker.rounds import RoundApplier
from randkv.vllm.worker.window_lengths import WindowLengths

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

NO_PLAN = (
    "RandKV: this step's plan (RandKVSchedulerOutput) did not reach the worker; the engine "
    "must run randkv.vllm.sched.scheduler.RandKVScheduler"
)


@dataclass
class RandKVWorkerState:
    """RandKV's state in one worker.

    groups: which KV cache group RandKV bounds (a mixed model's window groups stay vLLM's).
    rounds: plans and applies the step's rounds on this worker's KV caches.
    records: per-request records and slot maps.
    block_size: the KV cache block size (tokens per block).
    budgets: this step's per-request K (replaced every step).
    window_lengths: a mixed model's window layers' absolute lengths for this step.
    step_evicted: the slots each batch row's rounds have emptied (device, by row of this
        step's batch; None while no row has had a round), for a drafter's own slots.
    warming_up: True while vLLM warms up or compiles through real steps it builds itself
        (plain SchedulerOutputs of a few short requests, which never reach a round)."""

    config: RandKVConfig
    groups: KVGroupLayout
    rounds: RoundApplier
    records: RequestRecords
    metrics: RandKVRecorder
    block_size: int
    budgets: StepBudgets = field(init=False)
    window_lengths: WindowLengths = field(default_factory=WindowLengths)
    step_evicted: torch.Tensor | None = None
    warming_up: bool = False

    def __post_init__(self) -> None:
        self.budgets = StepBudgets(self.config.budget)

    def begin_step(self, scheduler_output: SchedulerOutput) -> RandKVStepPlan | None:
        """This step's plan (None for a step RandKV's scheduler did not make: vLLM's own
        warm-up steps, or an empty step); its budgets become the step's."""
        if not isinstance(scheduler_output, RandKVSchedulerOutput):
            if scheduler_output.total_num_scheduled_tokens and not self.warming_up:
                # Skipping a round on one rank would silently desynchronize its KV heads.
                raise RuntimeError(NO_PLAN)
            return None
        plan = scheduler_output.randkv
        self.budgets = StepBudgets(self.config.budget, plan.budgets)
        self.rounds.harvest_timings()
        self.records.finish(scheduler_output.finished_req_ids)
        return plan

    def stats(self) -> RankStats:
        """This worker's statistics (every round timing included: blocks on a GPU)."""
        self.rounds.harvest_timings(wait=True)
        return RankStats(
            counters=self.metrics.stats("counters"),
            seconds=self.metrics.stats("seconds"),
            layers=self.rounds.layers,
            kv_heads=self.rounds.kv_heads,
            counts_evictions=self.rounds.shard.counts_evictions,
            requests=dict(self.records.records),
        )
