"""The RandKV configuration: one frozen value object, validated on construction."""

from __future__ import annotations

import dataclasses
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
            "serve such prompts with min_generated (the prompt is kept whole, eviction runs "
            "among the generated tokens) or raise the budget"
        )
        self.prompt_length = prompt_length
        self.budget = budget


class RequestBudgetError(ValueError):
    """A request asked for a budget outside the range the server allows."""


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"RandKVConfig.{name} must be an integer in [{low}, {high}], got {value!r}"
        )
    if not low <= value <= high:
        raise ValueError(f"RandKVConfig.{name} must be in [{low}, {high}], got {value}")


#: How a server admits requests (`RandKVConfig.admission`).
ADMISSION_MODES = ("footprint", "vllm")


@dataclass(frozen=True)
class RandKVConfig:
    """Random Attention eviction settings.

    budget (K): tokens kept per KV head after a round, prompt included.
    buffer_size (r): newest tokens always kept; also the number evicted per round.
    seed: global seed of the counter-based hash that draws evictions.
    min_generated (G, off by default): serve prompts longer than K - G. Such a request keeps
        its whole prompt and at least G sampled generated tokens besides the r newest: its
        own budget is max(K, P + G). Requests whose prompt fits in K - G are unaffected.
    max_request_budget (off by default): the largest budget a request may ask for with
        `randkv_budget` (vLLM: `extra_args` / `vllm_xargs`); off means K, so a request may
        ask for less room than the server's K but not more.
    admission (serving only; no decision depends on it): "footprint" (the default) admits a
        request only when the pool holds every admitted request at its largest footprint
        (the blocks of K + 2r, or of its whole length if shorter, plus a drafter's
        lookahead), so RandKV never preempts for growth it can foresee; "vllm" admits as
        vLLM does (on what a request needs now) and preempts when the pool runs out, which
        packs more requests that stop early at the price of replays.

    A request's own budget is `for_request(prompt_length, requested)`: the config every spec
    function applies to that request.
    """

    budget: int = 2048
    buffer_size: int = 64
    seed: int = 0
    min_generated: int | None = None
    max_request_budget: int | None = None
    admission: str = "footprint"

    def __post_init__(self) -> None:
        if self.admission not in ADMISSION_MODES:
            raise ValueError(
                f"RandKVConfig: admission must be one of {', '.join(ADMISSION_MODES)}, got "
                f"{self.admission!r}"
            )
        _check_int("budget", self.budget, 1, MAX_PHYSICAL_LENGTH)
        _check_int("buffer_size", self.buffer_size, 1, MAX_PHYSICAL_LENGTH)
        _check_int("seed", self.seed, 0, MAX_SEED)
        if self.min_generated is not None:
            _check_int("min_generated", self.min_generated, 1, MAX_PHYSICAL_LENGTH)
        if self.max_request_budget is not None:
            _check_int("max_request_budget", self.max_request_budget, self.budget,
                       MAX_PHYSICAL_LENGTH)  # fmt: skip
        if self.largest_budget + 2 * self.buffer_size > MAX_PHYSICAL_LENGTH:
            raise ValueError(
                f"RandKVConfig: budget + 2 * buffer_size must be at most {MAX_PHYSICAL_LENGTH}, "
                f"got {self.largest_budget + 2 * self.buffer_size}"
            )

    @property
    def max_physical_length(self) -> int:
        """K + 2r: the physical length at which a round fires."""
        return self.budget + 2 * self.buffer_size

    @property
    def compacted_length(self) -> int:
        """K + r: the physical length right after a round."""
        return self.budget + self.buffer_size

    @property
    def largest_budget(self) -> int:
        """The largest budget a request may ask for (`max_request_budget`, else K)."""
        return self.budget if self.max_request_budget is None else self.max_request_budget

    def check_prompt(self, prompt_length: int) -> None:
        """Raise PromptTooLongError if a prompt of this length cannot be served."""
        if prompt_length > self.budget and self.min_generated is None:
            raise PromptTooLongError(prompt_length, self.budget)

    def request_budget(self, prompt_length: int, requested: int | None = None) -> int:
        """K of one request: `requested` (the request's own `randkv_budget`, within
        [1, largest_budget]) or the server's K, raised to P + min_generated when the prompt
        needs it. Raises RequestBudgetError or PromptTooLongError."""
        budget = self.budget
        if requested is not None:
            if isinstance(requested, bool) or not isinstance(requested, int):
                raise RequestBudgetError(
                    f"randkv_budget must be an integer in [1, {self.largest_budget}], got "
                    f"{type(requested).__name__} {requested!r}"
                )
            if not 1 <= requested <= self.largest_budget:
                raise RequestBudgetError(
                    f"randkv_budget must be in [1, {self.largest_budget}] (this server's "
                    f"max_request_budget), got {requested}"
                )
            budget = requested
        if self.min_generated is not None:
            budget = max(budget, prompt_length + self.min_generated)
        if prompt_length > budget:
            raise PromptTooLongError(prompt_length, budget)
        if budget + 2 * self.buffer_size > MAX_PHYSICAL_LENGTH:
            raise PromptTooLongError(prompt_length, budget)
        return budget

    def for_request(self, prompt_length: int, requested: int | None = None) -> RandKVConfig:
        """The config one request runs with: budget = `request_budget(...)`, the
        server-wide settings cleared. Every spec function gives that request's decisions
        from it (the seed, r and the draws are the server's)."""
        return self.with_budget(self.request_budget(prompt_length, requested))

    def with_budget(self, budget: int) -> RandKVConfig:
        """A request's config with its own K (already checked): this one when it is already
        such a config with that K."""
        if budget == self.budget and self.min_generated is None and self.max_request_budget is None:
            return self
        return dataclasses.replace(self, budget=budget, min_generated=None, max_request_budget=None)

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
            allowed = [f.name for f in dataclasses.fields(cls)]
            unknown = set(value) - set(allowed)
            if unknown:
                raise ValueError(
                    f"unknown RandKV option(s) {sorted(unknown)}; allowed: {', '.join(allowed)}"
                )
            return cls(**value)
        raise TypeError(
            "randkv= takes a RandKVConfig, True for defaults, a dict of "
            f"{'/'.join(f.name for f in dataclasses.fields(cls))}, or None; got "
            f"{type(value).__name__}"
        )
