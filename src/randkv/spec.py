"""The RandKV eviction spec, executable: pure Python, standard library only.

This module is the reference every backend (the torch planner, the vLLM engine,
the Transformers adapter) must reproduce bit for bit; docs/spec.md explains it
in prose with a worked example.

Terms
- T, tokens seen: tokens whose keys/values have been written to the cache.
- P, prompt length; K, budget; r, buffer size.
- Slot: an index into a request's physical cache (the same for every head).

Every function takes the server's config and applies a request's own budget itself
(`RandKVConfig.for_request`: with `min_generated`, a prompt longer than K - G raises that
request's K to P + G). A request that asked for its own budget passes
`config.for_request(P, requested)`; that config passes through unchanged.
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Iterable
from functools import lru_cache

from randkv.config import RandKVConfig
from randkv.rounds import move_slots, source_slots

MASK64 = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15
MIX_MULTIPLIER_1 = 0xBF58476D1CE4E5B9
MIX_MULTIPLIER_2 = 0x94D049BB133111EB


# --------------------------------------------------------------------------- cadence


def num_rounds(config: RandKVConfig, *, prompt_length: int, tokens_seen: int) -> int:
    """Eviction rounds completed once `tokens_seen` tokens are in the cache."""
    config = _request_config(config, prompt_length, tokens_seen)
    if tokens_seen < config.max_physical_length:
        return 0
    return 1 + (tokens_seen - config.max_physical_length) // config.buffer_size


def physical_length(config: RandKVConfig, *, prompt_length: int, tokens_seen: int) -> int:
    """Slots a request occupies (per head; every head has the same) after `tokens_seen`."""
    config = _request_config(config, prompt_length, tokens_seen)
    if tokens_seen < config.max_physical_length:
        return tokens_seen
    return config.compacted_length + (tokens_seen - config.max_physical_length) % config.buffer_size


def round_fires_at(config: RandKVConfig, round_index: int) -> int:
    """The tokens-seen count at which round `round_index` (0-based) fires (`config`: the
    request's own, `config.for_request(P)`)."""
    return config.max_physical_length + round_index * config.buffer_size


def _request_config(config: RandKVConfig, prompt_length: int, tokens_seen: int) -> RandKVConfig:
    if prompt_length < 0 or tokens_seen < 0:
        raise ValueError(
            f"prompt_length and tokens_seen must be >= 0, got {prompt_length} and {tokens_seen}"
        )
    # tokens_seen < prompt_length is a partially computed (chunked) prompt: no round can
    # fire then, because prompt_length <= K < K + 2r (the request's own K).
    return config.for_request(prompt_length)


# --------------------------------------------------------------------------- hashing


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


# --------------------------------------------------------------------------- rounds


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


# --------------------------------------------------------------------------- request keys


@lru_cache(maxsize=1024)
def _digest64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def request_key_from_text(text: str) -> int:
    """A 64-bit request key from a caller-chosen string (blake2b-64 of its UTF-8 bytes)."""
    return _digest64(b"randkv-key:" + text.encode("utf-8"))


#: What callers may pass as a request key: an unsigned 64-bit int, or a str (hashed).
RequestKey = int | str


def coerce_request_key(value: object) -> int:
    """The 64-bit request key for what a caller passed.

    An int in [0, 2**64 - 1] is the key itself; a str is `request_key_from_text(value)`.
    Anything else (float, bool, bytes, a sequence, an out-of-range int) is refused with an
    error that names the accepted types.
    """
    if isinstance(value, str):
        return request_key_from_text(value)
    # numbers.Integral admits numpy integers; bool is an int subclass but never a key.
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        key = int(value)
        if not 0 <= key <= MASK64:
            raise ValueError(
                f"request key {key} is out of range: a request key must be an int in "
                "[0, 2**64 - 1] (unsigned 64-bit) or a str (hashed by request_key_from_text)"
            )
        return key
    raise TypeError(
        "a request key must be an int in [0, 2**64 - 1] or a str (hashed by "
        f"request_key_from_text); got {type(value).__name__} {value!r}"
    )


def request_key_from_content(
    prompt_token_ids: Iterable[int], sampling_fingerprint: str = "", user_key: str | None = None
) -> int:
    """A 64-bit request key from what a request is, not when or where it ran.

    The prompt token ids, a canonical string of the sampling parameters, and an optional
    caller-supplied key. Identical requests therefore make identical decisions.
    """
    hasher = hashlib.blake2b(digest_size=8)
    hasher.update(b"randkv-content:")
    for token in prompt_token_ids:
        hasher.update(int(token).to_bytes(8, "little", signed=True))
    hasher.update(b"|sampling:" + sampling_fingerprint.encode("utf-8"))
    if user_key is not None:
        hasher.update(b"|user:" + user_key.encode("utf-8"))
    return int.from_bytes(hasher.digest(), "little")
