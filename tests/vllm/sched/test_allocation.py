"""The scheduler's block arithmetic (`randkv.vllm.sched.allocation`) as pure functions, against
`randkv.spec` and hand-computed cases: no vLLM object, no engine."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from randkv.spec import round_fires_at
from randkv.spec.config import RandKVConfig
from randkv.vllm.sched.allocation import (
    RoundStraddleError,
    blocks_for,
    full_group_step,
    peak_blocks,
    tokens_to_next_round,
)


def test_a_round_frees_the_tail_past_the_compacted_length():
    """K=64, r=32, 16-token blocks: K + 2r = 128 tokens fill 8 blocks; the round leaves
    K + r = 96 slots, and with this step's token 97 need 7: one block goes back."""
    config = RandKVConfig(budget=64, buffer_size=32)
    step = full_group_step(
        config,
        prompt_length=10,
        tokens_seen=128,
        num_new_tokens=1,
        rounds_applied=0,
        blocks_held=8,
        block_size=16,
    )
    assert step.round_due and step.rounds == 1
    assert (step.physical_end, step.keep_blocks, step.freed_blocks, step.new_blocks) == (
        97,
        7,
        1,
        0,
    )


def test_no_round_no_block_freed_and_new_blocks_only_past_the_last():
    config = RandKVConfig(budget=64, buffer_size=32)
    inside = full_group_step(
        config, prompt_length=10, tokens_seen=40, num_new_tokens=1, rounds_applied=0,
        blocks_held=3, block_size=16,
    )  # fmt: skip
    assert not inside.round_due and (inside.keep_blocks, inside.freed_blocks) == (3, 0)
    assert inside.new_blocks == 0  # token 41 fits in block 3
    crossing = full_group_step(
        config, prompt_length=10, tokens_seen=48, num_new_tokens=1, rounds_applied=0,
        blocks_held=3, block_size=16,
    )  # fmt: skip
    assert crossing.new_blocks == 1  # token 49 opens block 4


def test_a_round_already_applied_is_not_applied_again():
    """The scheduler applies a round once; the next steps until the next round only grow."""
    config = RandKVConfig(budget=64, buffer_size=32)
    after = full_group_step(
        config, prompt_length=10, tokens_seen=129, num_new_tokens=1, rounds_applied=1,
        blocks_held=7, block_size=16,
    )  # fmt: skip
    assert not after.round_due and after.rounds == 1 and after.physical_end == 98


def test_a_step_past_the_round_boundary_is_refused():
    config = RandKVConfig(budget=64, buffer_size=16)
    # A replay after preemption prefills from 0: K + 2r tokens end exactly at the boundary.
    whole = full_group_step(
        config, prompt_length=20, tokens_seen=0, num_new_tokens=96, rounds_applied=0,
        blocks_held=0, block_size=32,
    )  # fmt: skip
    assert whole.physical_end == 96 and whole.new_blocks == 3 and not whole.round_due
    with pytest.raises(RoundStraddleError, match="97"):
        full_group_step(
            config, prompt_length=20, tokens_seen=0, num_new_tokens=97, rounds_applied=0,
            blocks_held=0, block_size=32,
        )  # fmt: skip


def test_room_to_the_next_round_and_peak_blocks_by_hand():
    config = RandKVConfig(budget=64, buffer_size=16)  # rounds at 96, 112, 128, ...
    assert tokens_to_next_round(config, prompt_length=20, tokens_seen=0) == 96
    assert tokens_to_next_round(config, prompt_length=20, tokens_seen=90) == 6
    assert tokens_to_next_round(config, prompt_length=20, tokens_seen=96) == 16  # 80 left
    assert tokens_to_next_round(config, prompt_length=20, tokens_seen=100) == 12
    # Before the first round a request needs all of its tokens; after, its physical length,
    # but a preempted request replays its prompt and answer from the start: up to K + 2r.
    assert peak_blocks(config, prompt_length=20, num_tokens=50, block_size=32) == 2
    assert peak_blocks(config, prompt_length=20, num_tokens=500, block_size=32) == 3


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(1, 200),
    buffer=st.integers(1, 64),
    block=st.sampled_from([1, 16, 32]),
    prompt_share=st.floats(0, 1),
    chunks=st.lists(st.integers(1, 300), min_size=1, max_size=60),
)
def test_a_request_s_life_matches_the_spec(budget, buffer, block, prompt_share, chunks):
    """Step a request through chunks of any size, each cut at the next round boundary (as the
    scheduler does): the blocks it holds are always those of its spec physical length
    (never more than K + 2r tokens' worth), rounds fire exactly where the spec says, and
    every freed block was held."""
    config = RandKVConfig(budget=budget, buffer_size=buffer)
    prompt = int(prompt_share * budget)
    seen, held, applied, fired = 0, 0, 0, []
    for chunk in chunks:
        room = tokens_to_next_round(config, prompt_length=prompt, tokens_seen=seen)
        size = min(chunk, room)
        assert size >= 1
        step = full_group_step(
            config,
            prompt_length=prompt,
            tokens_seen=seen,
            num_new_tokens=size,
            rounds_applied=applied,
            blocks_held=held,
            block_size=block,
        )
        if step.round_due:
            fired.append(seen)
            applied = step.rounds
        assert step.freed_blocks <= held
        held = held - step.freed_blocks + step.new_blocks
        seen += size
        assert held == blocks_for(step.physical_end, block)
        assert held <= blocks_for(config.max_physical_length, block)
    # A round fires with the step that starts at its boundary (steps end there).
    expected, index = [], 0
    while round_fires_at(config, index) < seen:
        expected.append(round_fires_at(config, index))
        index += 1
    assert fired == expected
