"""The ISA of vLLM's CPU attention kernels, which decides how they pack KV blocks.

vLLM 0.28 keeps it on the kernel object (`layer.impl.isa`); 0.32 sets it on the attention
layer itself (`layer.isa`, from the metadata builder). Reading only the old place silently
accepts any kernel on 0.32, so this reads both and reports a layer that has neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The kernels whose KV layout `randkv.kernels.compactor.KVLayout.VLLM_CPU_VEC` describes.
VEC_ISAS = frozenset({"vec", "vec16"})


def attention_isa(layer: Any) -> str | None:
    """The ISA string of one attention layer, wherever the running release keeps it."""
    isa = getattr(layer, "isa", None)
    if isa is None:
        isa = getattr(getattr(layer, "impl", None), "isa", None)
    return isa


def attention_isas(static_forward_context: Mapping[str, Any]) -> dict[str, str | None]:
    """Layer name -> ISA of every CPU attention layer (None where the ISA was not found)."""
    return {
        name: attention_isa(layer)
        for name, layer in static_forward_context.items()
        if hasattr(layer, "impl")  # attention layers; other context entries have no kernel
    }


def cpu_block_size() -> int:
    """The smallest KV block size vLLM's CPU attention accepts (16 up to 0.28, 32 from 0.32,
    which refuses others: "No common block size for 16")."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    sizes = CPUAttentionBackend.get_supported_kernel_block_sizes()
    return min(int(size) if isinstance(size, int) else int(size.base) for size in sizes)
