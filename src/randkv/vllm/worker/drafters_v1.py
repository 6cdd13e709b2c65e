"""Speculative drafters' own KV writes at physical slots on vLLM's V1 model runner.

A drafter whose attention layers sit in the KV cache group RandKV bounds (EAGLE, EAGLE3, a
separate draft model) reads and writes the target's blocks. Its first pass (EAGLE, MTP)
reuses the target's attention inputs, which RandKV already made physical; two places compute
slots themselves, from absolute positions:

- each later draft step (`_update_positions_dependent_metadata`): vLLM's kernel adds one to
  every row's position and length and maps the position through the block table. The row's
  new length is physical (it started from the target's physical lengths), so the new
  token's physical slot is the length minus one.
- a draft model's first pass (`set_inputs_first_pass`, `needs_extra_input_slots`): the
  expanded queries' slots come from absolute positions; RandKV subtracts each row's evicted
  slots (r per round fired), which the runner kept for this step.

Positions themselves (RoPE) stay absolute, as for the target. Until a request's first round
physical and absolute agree, so a step without any round changes nothing. The V2 runner's
counterpart is `randkv.vllm.worker.drafters_v2`. Imports vLLM's V1 speculative decoding
code inside its methods only (vLLM 0.34 has none).
"""

from __future__ import annotations

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
