"""Absolute sequence lengths for a mixed model's sliding-window layers (V1 model runner).

vLLM's V1 runner builds every KV cache group's attention inputs from one `seq_lens` buffer.
RandKV rewrites that buffer to physical lengths (the full-attention layers read compacted
KV), but a sliding-window layer's KV is where vLLM put it: its window is counted from the
absolute position. So the window groups' metadata builders get the absolute lengths back,
kept just before RandKV's shift; with no round fired yet, nothing is kept and nothing
changes.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from randkv.vllm.class_swap import swap_class

#: Fields of vLLM's CommonAttentionMetadata that hold host lengths (0.28 has the private one).
_HOST_LENGTH_FIELDS = ("seq_lens_cpu_upper_bound", "_seq_lens_cpu")


class WindowLengths:
    """This step's absolute lengths, while vLLM's buffers hold physical ones."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.seq_lens: torch.Tensor | None = None
        self.host: torch.Tensor | None = None
        self.max_seq_len = 0

    def keep(self, seq_lens: torch.Tensor, host: torch.Tensor, num_reqs: int) -> None:
        self.seq_lens = seq_lens.clone()
        self.host = host.clone()
        self.max_seq_len = int(host[:num_reqs].max())

    def restore(self, metadata: Any) -> Any:
        """`metadata` (shared by every group) with absolute lengths, as a shallow copy."""
        if self.seq_lens is None or self.host is None:
            return metadata
        rows = metadata.seq_lens.shape[0]
        restored = copy.copy(metadata)
        restored.seq_lens = self.seq_lens[:rows]
        restored.max_seq_len = self.max_seq_len
        for name in _HOST_LENGTH_FIELDS:
            if getattr(metadata, name, None) is not None:
                setattr(restored, name, self.host[:rows])
        return restored


_BUILDER_CLASSES: dict[type, type] = {}


def _absolute_lengths_class(vllm_class: Any) -> type:
    """A subclass of vLLM's builder class whose `build` restores the absolute lengths.
    (vLLM's class comes first among the bases: Python refuses the class swap otherwise.)"""

    def build(self: Any, common_prefix_len: int, common_attn_metadata: Any, *args, **kwargs):
        restored = self.randkv_window_lengths.restore(common_attn_metadata)
        return vllm_class.build(self, common_prefix_len, restored, *args, **kwargs)

    namespace = {"build": build, "__module__": __name__, "randkv_window_builder": True}
    return type(f"RandKVWindow{vllm_class.__name__}", (vllm_class,), namespace)


def give_absolute_lengths(builder: Any, lengths: WindowLengths) -> None:
    """Make `builder` (a window group's, built by vLLM) read `lengths` when they are kept."""
    vllm_class = type(builder)
    if not getattr(vllm_class, "randkv_window_builder", False):
        subclass = _BUILDER_CLASSES.get(vllm_class)
        if subclass is None:
            subclass = _BUILDER_CLASSES[vllm_class] = _absolute_lengths_class(vllm_class)
        swap_class(builder, vllm_class, subclass)
    builder.randkv_window_lengths = lengths
