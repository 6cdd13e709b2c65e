"""The draws: which r slots each round empties, per (request, round, layer, KV head).

Every draw stream is keyed by a 64-bit hash of (seed, request key, round, global layer,
global KV head), built from SplitMix64's mixer, so a decision depends on nothing but those
five numbers: not the batch, the device or the parallel layout. Draws within a stream are
32-bit words mapped to [0, n) by Lemire's multiply-shift with exact rejection.
"""

from __future__ import annotations

from randkv.spec.config import RandKVConfig

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
MIX_MULTIPLIER_1 = 0xBF58476D1CE4E5B9
MIX_MULTIPLIER_2 = 0x94D049BB133111EB


def mix64(z: int) -> int:
    """SplitMix64's output function: a bijective 64-bit mixer."""
    z = ((z ^ (z >> 30)) * MIX_MULTIPLIER_1) & MASK64
    z = ((z ^ (z >> 27)) * MIX_MULTIPLIER_2) & MASK64
    return z ^ (z >> 31)


def fold_key(state: int, field: int) -> int:
    """Absorb one 64-bit field into a 64-bit hash state."""
    return mix64(((state ^ field) + GOLDEN_GAMMA) & MASK64)


def seed_state(seed: int) -> int:
    return mix64((seed + GOLDEN_GAMMA) & MASK64)


def request_state(seed: int, request_key: int, round_index: int) -> int:
    """The hash state of one round of one request."""
    return fold_key(fold_key(seed_state(seed), request_key & MASK64), round_index & MASK64)


def site_state(layer: int, kv_head: int) -> int:
    """The hash state of one global (layer, KV head); independent of seed and request."""
    return fold_key(fold_key(0, layer & MASK64), kv_head & MASK64)


def stream_key(seed: int, request_key: int, round_index: int, layer: int, kv_head: int) -> int:
    """The 64-bit key of one (request, round, global layer, global KV head) draw stream."""
    return fold_key(request_state(seed, request_key, round_index), site_state(layer, kv_head))


def word(stream: int, index: int) -> int:
    """The index-th 64-bit word of a stream (the SplitMix64 sequence, index from 0)."""
    return mix64((stream + (index + 1) * GOLDEN_GAMMA) & MASK64)


def draw32(stream: int, counter: int) -> int:
    """The counter-th 32-bit draw: the high half of word counter // 2, then its low half."""
    w = word(stream, counter // 2)
    return w >> 32 if counter % 2 == 0 else w & 0xFFFFFFFF


def bounded(draw: int, n: int) -> int | None:
    """Map a 32-bit draw to a uniform integer in [0, n), or None if rejected.

    Lemire's multiply-shift with exact rejection, so every value has probability 1/n.
    """
    m = draw * n
    if (m & 0xFFFFFFFF) < (1 << 32) % n:
        return None
    return m >> 32


def sample_without_replacement(stream: int, n: int, r: int) -> tuple[int, ...]:
    """The first r distinct accepted values of the stream in [0, n), in draw order."""
    if not 0 <= r <= n:
        raise ValueError(f"cannot draw {r} distinct values from {n}")
    picks: dict[int, None] = {}
    counter = 0
    while len(picks) < r:
        value = bounded(draw32(stream, counter), n)
        counter += 1
        if value is not None:
            picks.setdefault(value)
    return tuple(picks)


def evicted_slots(
    config: RandKVConfig,
    *,
    prompt_length: int,
    request_key: int,
    round_index: int,
    layer: int,
    kv_head: int,
) -> tuple[int, ...]:
    """Slots emptied by one round for one (layer, head), in draw order.

    Candidates are the slots [P, K + r): every non-prompt token but the r newest,
    which sit in slots [K + r, K + 2r) when the round fires. The i-th hole receives
    the token in slot K + r + i.
    """
    config = config.for_request(prompt_length)
    n = config.compacted_length - prompt_length
    stream = stream_key(config.seed, request_key, round_index, layer, kv_head)
    picks = sample_without_replacement(stream, n, config.buffer_size)
    return tuple(prompt_length + p for p in picks)
