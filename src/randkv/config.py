"""The RandKV configuration: one frozen value object, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Candidate counts must stay below 2**31 so a 32-bit draw times the count fits in int64.
MAX_PHYSICAL_LENGTH = 2**31 - 1
MAX_SEED = 2**64 - 1


class PromptTooLongError(ValueError):
    """A request's prompt does not fit in the RandKV budget."""

    def __init__(self, prompt_length: int, budget: int) -> None:
        super().__init__(
            f"prompt of {prompt_length} tokens exceeds the RandKV budget K={budget}; "
            "raise the budget"
        )
        self.prompt_length = prompt_length
        self.budget = budget


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"RandKVConfig.{name} must be an integer in [{low}, {high}], got {value!r}"
        )
    if not low <= value <= high:
        raise ValueError(f"RandKVConfig.{name} must be in [{low}, {high}], got {value}")


@dataclass(frozen=True)
class RandKVConfig:
    """Random Attention eviction settings.

    budget (K): tokens kept per KV head after a round, prompt included.
    buffer_size (r): newest tokens always kept; also the number evicted per round.
    seed: global seed of the counter-based hash that draws evictions.
    """

    budget: int = 2048
    buffer_size: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        _check_int("budget", self.budget, 1, MAX_PHYSICAL_LENGTH)
        _check_int("buffer_size", self.buffer_size, 1, MAX_PHYSICAL_LENGTH)
        _check_int("seed", self.seed, 0, MAX_SEED)
        if self.max_physical_length > MAX_PHYSICAL_LENGTH:
            raise ValueError(
                f"RandKVConfig: budget + 2 * buffer_size must be at most {MAX_PHYSICAL_LENGTH}, "
                f"got {self.max_physical_length}"
            )

    @property
    def max_physical_length(self) -> int:
        """K + 2r: the physical length at which a round fires."""
        return self.budget + 2 * self.buffer_size

    @property
    def compacted_length(self) -> int:
        """K + r: the physical length right after a round."""
        return self.budget + self.buffer_size

    def check_prompt(self, prompt_length: int) -> None:
        """Raise PromptTooLongError if a prompt of this length cannot be served."""
        if prompt_length > self.budget:
            raise PromptTooLongError(prompt_length, self.budget)

    @classmethod
    def coerce(cls, value: RandKVConfig | bool | dict[str, Any] | None) -> RandKVConfig | None:
        """Accept the call-site forms: a config, True (defaults), a dict, or None/False (off)."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {"budget", "buffer_size", "seed"}
            if unknown:
                raise ValueError(
                    f"unknown RandKV option(s) {sorted(unknown)}; "
                    "allowed: budget, buffer_size, seed"
                )
            return cls(**value)
        raise TypeError(
            "randkv= takes a RandKVConfig, True for defaults, a dict of "
            f"budget/buffer_size/seed, or None; got {type(value).__name__}"
        )
