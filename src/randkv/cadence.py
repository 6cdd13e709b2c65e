"""The spec's cadence for many requests at once: rounds completed and physical lengths.

`randkv.spec.num_rounds` and `randkv.spec.physical_length` are the reference, one request at
a time. These take a Python int, a numpy array or a torch tensor of tokens-seen counts (on any
device) and use only integer arithmetic that all three share, so the vLLM worker can compute
them on the device without a host sync and the Transformers cache on plain ints.

They depend on the prompt only through a request's own budget (a prompt never reaches
K + 2r on its own): `budget` is K (default: the config's), or one K per request in the same
form as `tokens_seen` (`RandKVConfig.request_budget`: long prompts, per-request budgets).
"""

from __future__ import annotations

from typing import TypeVar

from randkv.config import RandKVConfig

Counts = TypeVar("Counts")  # int, numpy.ndarray or torch.Tensor (integer dtype)


def rounds_completed(
    config: RandKVConfig, tokens_seen: Counts, budget: Counts | int | None = None
) -> Counts:
    """`spec.num_rounds` elementwise: rounds fired once `tokens_seen` tokens are cached."""
    k = config.budget if budget is None else budget
    rounds = (tokens_seen - k - 2 * config.buffer_size) // config.buffer_size + 1
    return rounds * (rounds > 0)  # floor division: negative before the first round


def physical_lengths(
    config: RandKVConfig, tokens_seen: Counts, budget: Counts | int | None = None
) -> Counts:
    """`spec.physical_length` elementwise: slots held per head after `tokens_seen` tokens.

    Each round removes exactly r slots, so the physical length is T - r * rounds.
    """
    return tokens_seen - config.buffer_size * rounds_completed(config, tokens_seen, budget)


def latest_round_index(
    config: RandKVConfig, tokens_seen: Counts, budget: Counts | int | None = None
) -> Counts:
    """0-based index of the latest round fired (-1 before the first)."""
    return rounds_completed(config, tokens_seen, budget) - 1
