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


def kv_cache_layer_indices(layer_names: Iterable[str]) -> list[int]:
    """Global layer index of each KV cache, in `model_runner.kv_caches` order.

    vLLM names attention layers by their place in the whole model
    (`model.layers.17.self_attn.attn`, also on a later pipeline stage) and binds the
    runner's `kv_caches` list sorted by that index (`vllm.v1.worker.utils.bind_kv_cache`),
    so the sorted indices line up with the list.
    """
    from vllm.model_executor.models.utils import extract_layer_index

    names = list(layer_names)
    indices = sorted(extract_layer_index(name) for name in names)
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
