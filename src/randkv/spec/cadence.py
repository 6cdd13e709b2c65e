"""The cadence: when rounds fire, and how many slots a request holds.

`num_rounds`, `physical_length` and `round_fires_at` are the reference, one request at a
time, on plain ints. `rounds_completed`, `physical_lengths` and `latest_round_index` are the
same arithmetic for many requests at once: they take a Python int, a numpy array or a torch
tensor of tokens-seen counts (on any device) and use only integer arithmetic that all three
share, so the vLLM worker can compute them on the device without a host sync and the
Transformers cache on plain ints.

The batched forms depend on the prompt only through a request's own budget (a prompt never
reaches K + 2r on its own): `budget` is K (default: the config's), or one K per request in
the same form as `tokens_seen` (`RandKVConfig.request_budget`: long prompts, per-request
budgets).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from randkv.spec.config import RandKVConfig

if TYPE_CHECKING:  # read by type checkers only: the spec imports no numpy or torch
    import numpy
    import torch


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


#: Tokens-seen counts: an int, or a numpy array or torch tensor of an integer dtype.
Counts = TypeVar("Counts", int, "numpy.ndarray", "torch.Tensor")


def rounds_completed(
    config: RandKVConfig, tokens_seen: Counts, budget: Counts | int | None = None
) -> Counts:
    """`num_rounds` elementwise: rounds fired once `tokens_seen` tokens are cached."""
    k = config.budget if budget is None else budget
    rounds = (tokens_seen - k - 2 * config.buffer_size) // config.buffer_size + 1
    return rounds * (rounds > 0)  # floor division: negative before the first round


def physical_lengths(
    config: RandKVConfig, tokens_seen: Counts, budget: Counts | int | None = None
) -> Counts:
    """`physical_length` elementwise: slots held per head after `tokens_seen` tokens.

    Each round removes exactly r slots, so the physical length is T - r * rounds.
    """
    return tokens_seen - config.buffer_size * rounds_completed(config, tokens_seen, budget)


def latest_round_index(
    config: RandKVConfig, tokens_seen: Counts, budget: Counts | int | None = None
) -> Counts:
    """0-based index of the latest round fired (-1 before the first)."""
    return rounds_completed(config, tokens_seen, budget) - 1
