"""RandKV on vLLM's V1 model runner (`vllm.v1.worker.gpu_model_runner.GPUModelRunner` and its
CPU subclass; vLLM 0.28 and 0.32, removed in 0.34).

Two seams: the worker's copy of each request's block ids and its block table rows, trimmed
when a round frees tail blocks, and `_prepare_inputs`, after which attention's slot mapping
and sequence lengths are rewritten to physical values while RoPE keeps absolute positions.
Imports no vLLM runner module: `randkv.vllm.worker.runner_class` combines this mixin with
the runner class the engine built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from randkv.vllm.sched.output import RoundDirective
from randkv.vllm.worker.drafters_v1 import adopt_v1_drafter
from randkv.vllm.worker.lengths import physical_on_device, slots_evicted
from randkv.vllm.worker.runner import RandKVRunnerMixin

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

    from randkv.kernels.compactor import KVLayout
    from randkv.spec.config import RandKVConfig


class V1RunnerMixin(RandKVRunnerMixin):
    """The V1 runner's seams (module docstring); a speculative drafter that writes KV in
    RandKV's group gets physical slots too (`randkv.vllm.worker.drafters_v1`)."""

    # vLLM's V1 runner state RandKV reads and rewrites (declared for the type checker).
    input_batch: Any
    requests: dict[str, Any]
    seq_lens: torch.Tensor
    optimistic_seq_lens_cpu: torch.Tensor
    num_computed_tokens: torch.Tensor
    positions: torch.Tensor
    req_indices: Any
    query_start_loc: Any

    def randkv_shared_kv_layers(self) -> dict[str, str]:
        return dict(getattr(self, "shared_kv_cache_layers", {}))

    def randkv_setup(self, config: RandKVConfig, layout: KVLayout) -> None:
        super().randkv_setup(config, layout)
        drafter = getattr(self, "drafter", None)
        adopt_v1_drafter(drafter, self.randkv, self.randkv.groups.randkv)

    def randkv_forget_tail_blocks(self, directives: dict[str, RoundDirective]) -> None:
        group = self.randkv.groups.randkv
        table = self.input_batch.block_table[group]
        for req_id, directive in directives.items():
            # The worker's own list of the request's blocks, which new blocks extend.
            del self.requests[req_id].block_ids[group][directive.keep_blocks :]
            index = self.input_batch.req_id_to_index.get(req_id)
            if index is not None:
                table.num_blocks_per_row[index] = directive.keep_blocks

    def _prepare_inputs(self, scheduler_output: SchedulerOutput, num_scheduled_tokens: Any) -> Any:
        result = super()._prepare_inputs(  # type: ignore[misc]  # vLLM's runner
            scheduler_output, num_scheduled_tokens
        )
        self.randkv.window_lengths.clear()
        self.randkv.step_evicted = None
        self.randkv_physical_inputs(scheduler_output)
        return result

    def randkv_physical_inputs(self, scheduler_output: SchedulerOutput) -> None:
        """After vLLM's inputs: physical slots and lengths for attention, while RoPE keeps the
        absolute positions. Computed on the device from vLLM's persistent buffers (no host
        sync, no host-to-device copy), written into the same buffers vLLM uses, so a full
        CUDA graph replays with physical lengths."""
        state = self.randkv
        num_reqs = self.input_batch.num_reqs
        # Host copy of the same counts: decide on the host whether any request is shifted.
        seen_host = self.input_batch.num_computed_tokens_cpu[:num_reqs]
        budgets = state.budgets.rows(self.input_batch.req_ids[:num_reqs])
        evicted_host = slots_evicted(state.config, seen_host, budgets)
        if evicted_host is None:
            return
        absolute_groups = state.groups.absolute
        if absolute_groups:  # before the shift: the window and state layers' lengths
            state.window_lengths.keep(self.seq_lens, self.optimistic_seq_lens_cpu, num_reqs)
        seen = self.num_computed_tokens[:num_reqs].to(torch.int64)
        evicted = seen - physical_on_device(state.config, seen, budgets)  # r per round fired
        state.step_evicted = evicted
        total = scheduler_output.total_num_scheduled_tokens
        per_token = evicted[self.req_indices.gpu[:total].to(torch.int64)]
        positions = self.positions[:total] - per_token
        # Only the full-attention group's slots move; window groups keep vLLM's own.
        table = self.input_batch.block_table
        if absolute_groups:
            table = table[state.groups.randkv]
        table.compute_slot_mapping(num_reqs, self.query_start_loc.gpu[: num_reqs + 1], positions)
        self.seq_lens[:num_reqs] -= evicted.to(self.seq_lens.dtype)
        # vLLM's host copy of the lengths (max_seq_len, sampling masks), shifted alike.
        host = self.optimistic_seq_lens_cpu
        host[:num_reqs] -= torch.from_numpy(evicted_host).to(host.dtype)
