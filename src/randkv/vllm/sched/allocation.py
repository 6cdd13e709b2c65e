"""The block arithmetic of RandKV's KV cache manager, as pure functions of ints.

vLLM sizes a request's blocks by its token count; RandKV sizes the full-attention group by
the request's physical length (`randkv.spec.physical_length`: the slots its rounds leave),
so a request never holds more than the blocks of K + 2r tokens. `RandKVCacheManager` asks
these functions what to do and then makes vLLM's calls; tests check them against the spec
without an engine (tests/vllm/sched).
"""

from __future__ import annotations

from dataclasses import dataclass

from randkv.spec import num_rounds, physical_length
from randkv.spec.config import RandKVConfig


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks holding `tokens` slots."""
    return -(-tokens // block_size)


@dataclass(frozen=True)
class FullGroupStep:
    """What one scheduling step does to a request's full-attention blocks.

    physical_end: the request's physical length once this step's tokens are written.
    lookahead_end: what its blocks must hold for this step: `physical_end` plus the slots a
        drafter writes past it (speculative decoding's lookahead, outside the budget).
    rounds: rounds fired once the tokens before this step are cached (the spec's count).
    round_due: whether this step fires a round (its index is `rounds - 1`): the worker
        compacts before the forward pass.
    keep_blocks: blocks the request keeps (all it holds, or, when a round fires, what the
        compacted length and this step's tokens need).
    freed_blocks: blocks past `keep_blocks` (the tail a round empties), returned to the pool.
    new_blocks: blocks to allocate for this step's tokens.
    """

    physical_end: int
    lookahead_end: int
    rounds: int
    round_due: bool
    keep_blocks: int
    freed_blocks: int
    new_blocks: int


class RoundStraddleError(RuntimeError):
    """A step would write past K + 2r: it should have ended at the round boundary."""


def full_group_step(
    config: RandKVConfig,
    *,
    prompt_length: int,
    tokens_seen: int,
    num_new_tokens: int,
    rounds_applied: int,
    blocks_held: int,
    block_size: int,
    lookahead: int = 0,
) -> FullGroupStep:
    """The full-attention group's blocks for a step that writes `num_new_tokens` tokens
    after `tokens_seen` (prefix-cache hits included), for a request whose own config is
    `config` (`RandKVConfig.for_request`: its K) and whose scheduler has applied
    `rounds_applied` rounds while it holds `blocks_held` blocks; `lookahead` slots past the
    step's tokens are reserved for a drafter's KV (speculative decoding), outside the budget.

    Only a round frees blocks: the tail past the compacted length plus this step's tokens and
    its lookahead.
    Raises RoundStraddleError when the step would pass K + 2r (the scheduler ends every
    step at the next round boundary)."""
    physical = physical_length(config, prompt_length=prompt_length, tokens_seen=tokens_seen)
    rounds = num_rounds(config, prompt_length=prompt_length, tokens_seen=tokens_seen)
    end = physical + num_new_tokens
    if end > config.max_physical_length:
        raise RoundStraddleError(
            f"RandKV: a step would reach physical length {end} (K + 2r = "
            f"{config.max_physical_length}); steps end at rounds"
        )
    needed = blocks_for(end + lookahead, block_size)
    round_due = rounds > rounds_applied
    keep = min(blocks_held, needed) if round_due else blocks_held
    return FullGroupStep(
        physical_end=end,
        lookahead_end=end + lookahead,
        rounds=rounds,
        round_due=round_due,
        keep_blocks=keep,
        freed_blocks=blocks_held - keep,
        new_blocks=max(0, needed - keep),
    )


def tokens_to_next_round(config: RandKVConfig, *, prompt_length: int, tokens_seen: int) -> int:
    """Tokens a step may write after `tokens_seen` before it would pass the next round
    boundary (a step ends there; the round fires at the start of the next one). `config`:
    the request's own."""
    physical = physical_length(config, prompt_length=prompt_length, tokens_seen=tokens_seen)
    return config.max_physical_length - physical


def peak_blocks(
    config: RandKVConfig,
    *,
    prompt_length: int,
    num_tokens: int,
    block_size: int,
    lookahead: int = 0,
) -> int:
    """The most full-attention blocks a request of `num_tokens` tokens so far can need
    before its next step: its physical length, or all of its tokens while they still fit
    under K + 2r (a prompt not yet computed, a replay after preemption), plus `lookahead`.
    `config`: the request's own."""
    final = physical_length(config, prompt_length=prompt_length, tokens_seen=num_tokens)
    tokens = max(final, min(num_tokens, config.max_physical_length))
    return blocks_for(tokens + lookahead, block_size)


def footprint_blocks(
    config: RandKVConfig,
    *,
    prompt_length: int,
    max_tokens: int,
    block_size: int,
    lookahead: int = 0,
) -> int:
    """The most full-attention blocks a request can ever hold: those of K + 2r tokens (its
    own K), or of its whole length when it ends before reaching K + 2r, plus its lookahead.
    `max_tokens`: the most tokens it may generate."""
    longest = min(prompt_length + max_tokens, config.max_physical_length)
    return blocks_for(longest + lookahead, block_size)
