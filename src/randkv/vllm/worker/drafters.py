"""Speculative drafters' own KV writes at physical slots, on both of vLLM's model runners.

A drafter whose attention layers sit in the KV cache group RandKV bounds (EAGLE, EAGLE3, a
separate draft model) reads and writes the target's blocks. Its first pass (EAGLE, MTP)
reuses the target's attention inputs, which RandKV already made physical. On the V1 runner
two places compute slots themselves, from absolute positions:

- each later draft step (`_update_positions_dependent_metadata`): vLLM's kernel adds one to
  every row's position and length and maps the position through the block table. The row's
  new length is physical (it started from the target's physical lengths), so the new
  token's physical slot is the length minus one.
- a draft model's first pass (`set_inputs_first_pass`, `needs_extra_input_slots`): the
  expanded queries' slots come from absolute positions; RandKV subtracts each row's evicted
  slots (r per round fired), which the runner kept for this step.

On the V2 runner the speculator computes every slot mapping through the runner's
`BlockTables` and reads the batch's lengths: during its `propose`, RandKV gives it the
physical lengths and a view of the block tables that shifts positions (`PhysicalSlotTables`).

Positions themselves (RoPE) stay absolute, as for the target. Until a request's first round
physical and absolute agree, so a step without any round changes nothing.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch

from randkv.vllm.class_swap import swap_class

if TYPE_CHECKING:
    from randkv.vllm.worker.state import RandKVWorkerState


def _physical_slots(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> Any:
    """The slot of each row's physical position through its block table row."""
    rows = torch.arange(positions.shape[0], device=positions.device)
    blocks = block_table[rows, positions // block_size].to(torch.int64)
    return blocks * block_size + positions % block_size


class V1DrafterMixin:
    """Added to vLLM's V1 drafter (`SpecDecodeBaseProposer` subclasses) at start-up."""

    randkv_state: RandKVWorkerState
    # vLLM's drafter state RandKV reads (declared for the type checker).
    _slot_mapping_buffer: torch.Tensor
    positions: torch.Tensor
    is_rejected_token_mask: torch.Tensor
    needs_extra_input_slots: bool
    net_num_new_slots_per_request: int
    block_size: int
    max_model_len: int

    def _update_positions_dependent_metadata(
        self,
        positions: torch.Tensor,
        common_attn_metadata: Any,
        batch_size: int,
        input_batch_size: int,
        block_size: int,
    ) -> torch.Tensor:
        out = super()._update_positions_dependent_metadata(  # type: ignore[misc]
            positions, common_attn_metadata, batch_size, input_batch_size, block_size
        )
        if self.randkv_state.step_evicted is None:
            return out
        from vllm.v1.spec_decode.utils import PADDING_SLOT_ID

        slots = self._slot_mapping_buffer[:batch_size]
        physical = common_attn_metadata.seq_lens[:batch_size].to(torch.int64) - 1
        table = common_attn_metadata.block_table_tensor[:batch_size]
        fixed = _physical_slots(table, physical.clamp(min=0), block_size)
        slots.copy_(torch.where(slots == PADDING_SLOT_ID, slots, fixed.to(slots.dtype)))
        return out

    def set_inputs_first_pass(
        self,
        target_token_ids: torch.Tensor,
        next_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor,
        token_indices_to_sample: torch.Tensor | None,
        cad: Any,
        num_rejected_tokens_gpu: torch.Tensor | None,
    ) -> Any:
        num_tokens, to_sample, new_cad = super().set_inputs_first_pass(  # type: ignore[misc]
            target_token_ids=target_token_ids,
            next_token_ids=next_token_ids,
            target_positions=target_positions,
            target_hidden_states=target_hidden_states,
            token_indices_to_sample=token_indices_to_sample,
            cad=cad,
            num_rejected_tokens_gpu=num_rejected_tokens_gpu,
        )
        evicted = self.randkv_state.step_evicted
        if not self.needs_extra_input_slots or evicted is None:
            return num_tokens, to_sample, new_cad
        from vllm.v1.spec_decode.utils import PADDING_SLOT_ID, compute_new_slot_mapping

        target = cad  # the target's metadata, before vLLM extended every query
        extra = self.net_num_new_slots_per_request
        absolute = self.positions[:num_tokens].to(torch.int64)
        rows = torch.repeat_interleave(
            torch.arange(target.batch_size(), device=absolute.device),
            target.naive_query_lens() + extra,
            output_size=num_tokens,
        )
        physical = absolute - evicted[rows]
        slots = compute_new_slot_mapping(
            cad=target,
            new_positions=physical,
            is_rejected_token_mask=self.is_rejected_token_mask[:num_tokens],
            block_size=self.block_size,
            num_new_tokens=extra,
            max_model_len=self.max_model_len,
        )
        slots.masked_fill_(absolute >= self.max_model_len, PADDING_SLOT_ID)
        new_cad.slot_mapping = slots
        return num_tokens, to_sample, new_cad


_DRAFTER_CLASSES: dict[type, type] = {}


def _drafter_class(vllm_class: type) -> type:
    subclass = _DRAFTER_CLASSES.get(vllm_class)
    if subclass is None:
        namespace = {"__module__": __name__}
        subclass = type(f"RandKV{vllm_class.__name__}", (V1DrafterMixin, vllm_class), namespace)
        _DRAFTER_CLASSES[vllm_class] = subclass
    return subclass


def adopt_v1_drafter(drafter: Any, state: RandKVWorkerState, group: int) -> bool:
    """Give a V1 drafter that writes KV in group `group` (RandKV's) physical slots; False
    for a proposer without KV (ngram, suffix, ...) or one in another group."""
    if drafter is None or not hasattr(drafter, "_update_positions_dependent_metadata"):
        return False
    if getattr(drafter, "kv_cache_gid", group) != group:
        return False
    vllm_class: type = type(drafter)
    if not issubclass(vllm_class, V1DrafterMixin):
        swap_class(drafter, vllm_class, _drafter_class(vllm_class))
    drafter.randkv_state = state
    return True


# --------------------------------------------------------------------------- V2 runner


class PhysicalSlotTables:
    """vLLM's V2 `BlockTables` as a drafter sees them during one `propose` call: slot
    mappings of RandKV's group from physical positions (each batch row's absolute positions
    minus the slots its rounds emptied), window groups' from absolute ones; everything else
    is vLLM's object."""

    def __init__(
        self, tables: Any, evicted: torch.Tensor, randkv_group: int, windows: tuple[int, ...],
        scratch: torch.Tensor | None,
    ) -> None:  # fmt: skip
        self._tables = tables
        self._evicted = evicted
        self._windows = windows
        self._scratch = scratch
        self._group = randkv_group

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tables, name)

    def compute_slot_mappings(
        self,
        idx_mapping: torch.Tensor,
        query_start_loc: torch.Tensor,
        positions: torch.Tensor,
        num_tokens_padded: int,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        rows = query_start_loc.shape[0] - 1
        counts = (query_start_loc[1:] - query_start_loc[:-1]).to(torch.int64)
        row_of_token = torch.repeat_interleave(
            torch.arange(rows, device=positions.device), counts, output_size=positions.shape[0]
        )
        physical = positions - self._evicted[row_of_token].to(positions.dtype)
        absolute = None
        if self._windows and self._scratch is not None:
            absolute = self._tables.compute_slot_mappings(
                idx_mapping, query_start_loc, positions, num_tokens_padded, out=self._scratch
            )
        result = self._tables.compute_slot_mappings(
            idx_mapping, query_start_loc, physical, num_tokens_padded, out=out
        )
        if absolute is not None:
            for group in self._windows:
                result[group].copy_(absolute[group, : result.shape[1]])
        return result


def _physical_propose(vllm_propose: Any) -> Any:
    """vLLM's V2 `propose` for a drafter that writes KV (a draft model, EAGLE): during the
    call its lengths are the batch's physical ones and its slot mappings come from physical
    positions (`PhysicalSlotTables`); RoPE keeps the absolute positions."""

    @functools.wraps(vllm_propose)
    def propose(self: Any, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        runner = self.randkv_runner
        lengths = runner.randkv_step_lengths(input_batch)
        state = runner.randkv
        if lengths is None or state.step_evicted is None:
            return vllm_propose(self, input_batch, *args, **kwargs)
        tables = self.block_tables
        self.block_tables = PhysicalSlotTables(
            tables,
            state.step_evicted,
            state.groups.randkv,
            state.groups.windows,
            runner.randkv_buffers.window_slots,
        )
        input_batch.seq_lens, input_batch.seq_lens_cpu_upper_bound = lengths.physical()
        try:
            return vllm_propose(self, input_batch, *args, **kwargs)
        finally:
            self.block_tables = tables
            input_batch.seq_lens, input_batch.seq_lens_cpu_upper_bound = lengths.absolute()

    return propose


_SPECULATOR_CLASSES: dict[type, type] = {}


def _speculator_class(vllm_class: type) -> type:
    """A subclass of vLLM's speculator class with `_physical_propose` (vLLM's class is the
    only base: its instances' layout must not change for the class swap)."""
    subclass = _SPECULATOR_CLASSES.get(vllm_class)
    if subclass is None:
        namespace = {
            "__module__": __name__,
            "propose": _physical_propose(getattr(vllm_class, "propose")),  # noqa: B009
            "randkv_speculator": True,
        }
        subclass = type(f"RandKV{vllm_class.__name__}", (vllm_class,), namespace)
        _SPECULATOR_CLASSES[vllm_class] = subclass
    return subclass


def adopt_v2_speculator(speculator: Any, runner: Any) -> bool:
    """Give a V2 speculator whose drafter writes KV physical lengths and slots (False for
    one without a KV cache: ngram and the like)."""
    if speculator is None or getattr(speculator, "block_tables", None) is None:
        return False
    vllm_class: type = type(speculator)
    if not getattr(vllm_class, "randkv_speculator", False):
        swap_class(speculator, vllm_class, _speculator_class(vllm_class))
    speculator.randkv_runner = runner
    return True
