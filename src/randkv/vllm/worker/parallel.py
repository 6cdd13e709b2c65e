"""Which global layers and KV heads a vLLM worker holds.

RandKV keys every draw by (seed, request key, round, global layer, global KV head), so a
rank's decisions must be computed with global indices: a tensor-parallel rank's plan is
then a slice of the single-device plan, and a pipeline stage's plan another slice. This
module turns what a worker sees (its KV cache layer names, its TP rank, its cache shape)
into those global indices, following vLLM 0.28.0's own rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from randkv.vllm.refusals import UnsupportedModeError

#: The name vLLM gives a separate draft model's layers (`draft_model.model.layers.3...`, for
#: speculative decoding with `method="draft_model"`); they restart at layer 0.
DRAFT_MODEL_PREFIX = "draft_model."


def global_layer_index(layer_name: str, num_target_layers: int) -> int:
    """The spec's layer index of a KV cache layer: vLLM's index of it in the whole model
    (`model.layers.17.self_attn.attn`, also on a later pipeline stage; EAGLE and MTP drafter
    layers already follow the target's), and for a separate draft model's layers the
    target's layer count plus theirs, so a drafter's draws never repeat a target layer's."""
    from vllm.model_executor.models.utils import extract_layer_index

    index = extract_layer_index(layer_name)
    return index + num_target_layers if layer_name.startswith(DRAFT_MODEL_PREFIX) else index


def kv_cache_layer_indices(layer_names: Iterable[str], num_target_layers: int = 0) -> list[int]:
    """The sorted global layer indices (`global_layer_index`) of these KV cache layers."""
    names = list(layer_names)
    indices = sorted(global_layer_index(name, num_target_layers) for name in names)
    if len(set(indices)) != len(indices):
        raise UnsupportedModeError(
            f"RandKV needs one attention layer per layer index; KV cache layers {names} share "
            "indices (cross attention or several attention modules per layer)"
        )
    return indices


@dataclass(frozen=True)
class KVHeadShard:
    """The global KV heads one tensor-parallel rank holds.

    `counts_evictions` is True on exactly one rank per global head: when a model has fewer
    KV heads than ranks, vLLM replicates each head on tp_size / num_kv_heads ranks, and
    engine-wide counters must count the evictions of a replicated head once.
    """

    first_head: int
    num_heads: int
    replicas: int
    counts_evictions: bool

    @property
    def heads(self) -> range:
        return range(self.first_head, self.first_head + self.num_heads)


def kv_head_shard(tp_rank: int, tp_size: int, total_kv_heads: int, local_heads: int) -> KVHeadShard:
    """vLLM's split of KV heads over tensor-parallel ranks (`QKVParallelLinear`).

    With tp_size <= total_kv_heads, rank i holds heads [i * local, (i + 1) * local).
    With tp_size > total_kv_heads, every rank holds one head, and rank i holds head
    i // (tp_size / total_kv_heads).
    """
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tensor-parallel rank {tp_rank} is not in [0, {tp_size})")
    if tp_size >= total_kv_heads:
        replicas, expected = tp_size // total_kv_heads, 1
        divisible = tp_size % total_kv_heads == 0
    else:
        replicas, expected = 1, total_kv_heads // tp_size
        divisible = total_kv_heads % tp_size == 0
    if not divisible or local_heads != expected:
        raise UnsupportedModeError(
            f"RandKV cannot map KV heads to tensor-parallel ranks: {total_kv_heads} KV heads "
            f"over {tp_size} ranks, but this rank's KV cache holds {local_heads}"
        )
    return KVHeadShard(
        first_head=(tp_rank // replicas) * local_heads,
        num_heads=local_heads,
        replicas=replicas,
        counts_evictions=tp_rank % replicas == 0,
    )
