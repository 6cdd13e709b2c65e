"""Which absolute positions each (layer, KV head) holds, slot by slot: the spec replayed.

Every backend's slot map (the vLLM workers', the Transformers cache's) must equal
`slot_positions` after any number of tokens; tests compare them.
"""

from __future__ import annotations

from randkv.spec.cadence import num_rounds, round_fires_at
from randkv.spec.config import RandKVConfig
from randkv.spec.draws import evicted_slots
from randkv.spec.rounds import move_slots, source_slots


def slot_positions(
    config: RandKVConfig,
    *,
    prompt_length: int,
    tokens_seen: int,
    request_key: int,
    layer: int,
    kv_head: int,
) -> tuple[int, ...]:
    """Absolute position held by each physical slot of one (layer, head), in slot order."""
    config = config.for_request(prompt_length)
    rounds = num_rounds(config, prompt_length=prompt_length, tokens_seen=tokens_seen)
    if rounds == 0:
        return tuple(range(tokens_seen))
    k_plus_r = config.compacted_length
    slots = list(range(config.max_physical_length))
    for round_index in range(rounds):
        fired_at = round_fires_at(config, round_index)
        # The r newest tokens occupy the tail slots in arrival order.
        for i in range(config.buffer_size):
            slots[k_plus_r + i] = fired_at - config.buffer_size + i
        holes = evicted_slots(
            config,
            prompt_length=prompt_length,
            request_key=request_key,
            round_index=round_index,
            layer=layer,
            kv_head=kv_head,
        )
        move_slots(slots, holes, source_slots(config))
    last_fired = round_fires_at(config, rounds - 1)
    tail = range(last_fired, tokens_seen)
    return tuple(slots[:k_plus_r]) + tuple(tail)


def retained_positions(
    config: RandKVConfig,
    *,
    prompt_length: int,
    tokens_seen: int,
    request_key: int,
    layer: int,
    kv_head: int,
) -> tuple[int, ...]:
    """Sorted absolute positions that one (layer, head) holds after `tokens_seen` tokens."""
    return tuple(
        sorted(
            slot_positions(
                config,
                prompt_length=prompt_length,
                tokens_seen=tokens_seen,
                request_key=request_key,
                layer=layer,
                kv_head=kv_head,
            )
        )
    )
