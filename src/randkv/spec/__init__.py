"""The RandKV eviction spec, executable: pure Python, standard library only.

This package is the bottom layer and the reference every backend (the torch and Triton
kernels, the vLLM engine, the Transformers adapter) must reproduce bit for bit; docs/spec.md
explains it in prose with a worked example. It imports nothing outside the standard library
and nothing above it in `randkv` (a test reads the imports).

- `config`: `RandKVConfig`, one frozen, validated value; a request's own budget.
- `cadence`: when rounds fire and how many slots a request holds (ints, arrays, tensors).
- `draws`: the hash streams and which r slots one round empties per (layer, KV head).
- `rounds`: one round's moves (`RoundPlan`, `move_slots`), applied to any per-slot state.
- `positions`: the absolute position each slot holds after any number of tokens.
- `request_keys`: the 64-bit identity a request's draws are keyed by.

Terms
- T, tokens seen: tokens whose keys/values have been written to the cache.
- P, prompt length; K, budget; r, buffer size.
- Slot: an index into a request's physical cache (the same for every head).

Every function takes the server's config and applies a request's own budget itself
(`RandKVConfig.for_request`: with `min_generated`, a prompt longer than K - G raises that
request's K to P + G). A request that asked for its own budget passes
`config.for_request(P, requested)`; that config passes through unchanged.
"""

from randkv.spec.cadence import (
    latest_round_index,
    num_rounds,
    physical_length,
    physical_lengths,
    round_fires_at,
    rounds_completed,
)
from randkv.spec.config import (
    MAX_PHYSICAL_LENGTH,
    MAX_SEED,
    PromptTooLongError,
    RandKVConfig,
    RequestBudgetError,
)
from randkv.spec.draws import (
    GOLDEN_GAMMA,
    MASK64,
    MIX_MULTIPLIER_1,
    MIX_MULTIPLIER_2,
    bounded,
    draw32,
    evicted_slots,
    fold_key,
    mix64,
    request_state,
    sample_without_replacement,
    seed_state,
    site_state,
    stream_key,
    word,
)
from randkv.spec.positions import retained_positions, slot_positions
from randkv.spec.request_keys import (
    RequestKey,
    coerce_request_key,
    request_key_from_content,
    request_key_from_text,
)
from randkv.spec.rounds import RoundPlan, move_slots, source_slots

__all__ = [
    "GOLDEN_GAMMA",
    "MASK64",
    "MAX_PHYSICAL_LENGTH",
    "MAX_SEED",
    "MIX_MULTIPLIER_1",
    "MIX_MULTIPLIER_2",
    "PromptTooLongError",
    "RandKVConfig",
    "RequestBudgetError",
    "RequestKey",
    "RoundPlan",
    "bounded",
    "coerce_request_key",
    "draw32",
    "evicted_slots",
    "fold_key",
    "latest_round_index",
    "mix64",
    "move_slots",
    "num_rounds",
    "physical_length",
    "physical_lengths",
    "request_key_from_content",
    "request_key_from_text",
    "request_state",
    "retained_positions",
    "round_fires_at",
    "rounds_completed",
    "sample_without_replacement",
    "seed_state",
    "site_state",
    "slot_positions",
    "source_slots",
    "stream_key",
    "word",
]
