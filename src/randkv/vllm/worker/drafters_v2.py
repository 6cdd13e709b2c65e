"""Speculative drafters' own KV writes at physical slots on vLLM's V2 model runner.

The speculator (draft model, EAGLE) computes every slot mapping through the runner's
`BlockTables` and reads the batch's lengths. During its `propose`, RandKV gives it the
batch's physical lengths and a view of the block tables that shifts positions
(`PhysicalSlotTables`); RoPE keeps the absolute positions. The V1 runner's counterpart is
`randkv.vllm.worker.drafters_v1`.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from randkv.vllm.class_swap import swap_class


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
            state.groups.absolute,
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
