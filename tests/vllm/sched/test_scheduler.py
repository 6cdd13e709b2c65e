"""RandKV's scheduler on vLLM's real scheduler, KV cache manager and block pool, without an
engine (tests/support/scheduler_harness.py): rounds where `randkv.spec` puts them, tail
blocks back in the pool, preemption replayed, window groups as vLLM's own scheduler keeps
them, refusals. Milliseconds per step: these fail long before an engine test would."""

from __future__ import annotations

import dataclasses

import pytest
from scheduler_harness import TOKEN, make_harness

from randkv.spec import round_fires_at
from randkv.spec.config import RandKVConfig
from randkv.vllm.sched.allocation import blocks_for

pytestmark = [pytest.mark.vllm]  # vLLM's own scheduler classes: every CPU release

CONFIG = RandKVConfig(budget=64, buffer_size=32, seed=1)  # rounds at 128, 160, 192, ...
BLOCK = 16


@pytest.fixture(scope="module")
def model(tiny_model_path):
    return tiny_model_path


def _directives(harness, request_id):
    """(step, tokens seen before it, directive) for every round of one request."""
    fired = []
    for index, step in enumerate(harness.steps):
        directive = step.randkv.directives.get(request_id)
        if directive is not None:
            fired.append((index, directive))
    return fired


def test_rounds_fire_at_the_spec_s_positions_with_the_blocks_held(model):
    harness = make_harness(model, CONFIG, num_blocks=40, block_size=BLOCK)
    request = harness.add(20, 200)
    held_before = []
    for _ in range(300):
        if not harness.scheduler.has_requests():
            break
        held_before.append(list(harness.manager.full_manager.req_to_blocks[request.request_id]))
        harness.step()
    fired = _directives(harness, request.request_id)
    # 20 prompt tokens + 200 sampled, the last never computed: rounds at 128, 160, 192.
    assert [d.round_index for _, d in fired] == [0, 1, 2]
    for (index, directive), round_index in zip(fired, range(3), strict=True):
        step = harness.steps[index]
        start = step.scheduled_cached_reqs.num_computed_tokens[0]
        assert start == round_fires_at(CONFIG, round_index)  # the step starts at the boundary
        held = held_before[index]
        assert directive.block_ids == tuple(block.block_id for block in held)
        assert directive.keep_blocks == blocks_for(CONFIG.compacted_length + 1, BLOCK) == 7
        assert (directive.prompt_length, directive.budget) == (20, 64)
    assert harness.scheduler.counters["blocks_freed"] == 3  # 8 blocks -> 7, each round


def test_a_request_never_holds_more_than_k_plus_2r_while_plain_vllm_grows(model):
    randkv = make_harness(model, CONFIG, num_blocks=60, block_size=BLOCK)
    plain = make_harness(model, None, num_blocks=60, block_size=BLOCK)
    ours, theirs = randkv.add(20, 400), plain.add(20, 400)
    peak_ours = peak_theirs = 0
    for _ in range(400):
        randkv.step()
        plain.step()
        peak_ours = max(peak_ours, len(randkv.manager.full_manager.req_to_blocks[ours.request_id]))
        blocks = plain.scheduler.kv_cache_manager.coordinator.single_type_managers[0]
        peak_theirs = max(peak_theirs, len(blocks.req_to_blocks[theirs.request_id]))
    assert peak_ours == blocks_for(CONFIG.max_physical_length, BLOCK) == 8
    assert peak_theirs == blocks_for(20 + 399, BLOCK) == 27  # vLLM: every token's slot
    randkv.run()
    assert randkv.free_blocks() == 60 - 1  # every block back (vLLM keeps one null block)


def test_preemption_replays_the_rounds_from_the_prompt(model):
    """Preempted after two rounds, a request replays its prompt and answer in chunks that end
    at round boundaries, and the same rounds fire again at the same positions."""
    harness = make_harness(model, CONFIG, num_blocks=40, block_size=BLOCK)
    request = harness.add(20, 240)
    while len(_directives(harness, request.request_id)) < 2:
        harness.step()
    harness.step()
    scheduler = harness.scheduler
    scheduler.running.remove(request)
    scheduler._preempt_request(request, 0.0)  # vLLM's own preemption path
    assert scheduler.counters["preemptions"] == 1
    assert scheduler.request_rounds[request.request_id].rounds_applied == 0
    assert harness.free_blocks() == 40 - 1
    resumed_at = len(harness.steps)
    harness.run()
    replay = harness.steps[resumed_at:]
    first = replay[0].scheduled_new_reqs or replay[0].scheduled_cached_reqs
    chunks = [step.num_scheduled_tokens[request.request_id] for step in replay[:3]]
    assert chunks[0] == CONFIG.max_physical_length  # 128 tokens, up to the first boundary
    assert chunks[1] == CONFIG.buffer_size  # then one round's worth
    assert first is not None
    rounds = [d.round_index for _, d in _directives(harness, request.request_id)]
    assert rounds == [0, 1, 0, 1, 2, 3, 4]  # 2 before, then replayed and continued to 256
    assert harness.free_blocks() == 40 - 1


def test_a_mixed_model_s_window_group_is_kept_as_vllm_keeps_it(model):
    """A full-attention group (RandKV's) beside a 32-token sliding-window group (vLLM's):
    the window group holds, step by step, exactly what vLLM's own scheduler holds there."""
    randkv = make_harness(model, CONFIG, num_blocks=80, block_size=BLOCK, window=32)
    plain = make_harness(model, None, num_blocks=80, block_size=BLOCK, window=32)
    ours, theirs = randkv.add(20, 250), plain.add(20, 250)
    null = randkv.pool.null_block
    plain_null = plain.pool.null_block
    for _ in range(250):
        randkv.step()
        plain.step()
        window = randkv.manager.coordinator.single_type_managers[1]
        plain_window = plain.scheduler.kv_cache_manager.coordinator.single_type_managers[1]
        held = [b is not null for b in window.req_to_blocks.get(ours.request_id, [])]
        plain_held = [
            b is not plain_null for b in plain_window.req_to_blocks.get(theirs.request_id, [])
        ]
        assert held == plain_held
        full = randkv.manager.full_manager.req_to_blocks.get(ours.request_id, [])
        assert len(full) <= blocks_for(CONFIG.max_physical_length, BLOCK)
    assert len(_directives(randkv, ours.request_id)) == 5  # at 128, 160, 192, 224, 256
    randkv.run()
    assert randkv.free_blocks() == 80 - 1


def test_a_hybrid_model_s_state_group_is_kept_as_vllm_keeps_it(model):
    """A full-attention group (RandKV's) beside a Mamba state group (vLLM's): the state
    group holds, step by step, exactly what vLLM's own scheduler holds there (one block per
    request), counted as state blocks (the gauge's count), and everything comes back."""
    randkv = make_harness(model, CONFIG, num_blocks=80, block_size=BLOCK, state=True)
    plain = make_harness(model, None, num_blocks=80, block_size=BLOCK, state=True)
    ours, theirs = randkv.add(20, 250), plain.add(20, 250)
    for _ in range(250):
        randkv.step()
        plain.step()
        states = randkv.manager.coordinator.single_type_managers[1].req_to_blocks
        plain_states = plain.scheduler.kv_cache_manager.coordinator.single_type_managers[1]
        held = len(states.get(ours.request_id, []))
        assert held == len(plain_states.req_to_blocks.get(theirs.request_id, [])) <= 1
        assert randkv.manager.randkv_blocks_held([ours.request_id]).states == held
        full = randkv.manager.full_manager.req_to_blocks.get(ours.request_id, [])
        assert len(full) <= blocks_for(CONFIG.max_physical_length, BLOCK)
    assert len(_directives(randkv, ours.request_id)) == 5
    randkv.run()
    assert randkv.free_blocks() == 80 - 1


def test_footprint_admission_reserves_the_state_groups_too(model):
    """32 requests, K=64, r=16, 32-token blocks: a request's footprint is 3 full-attention
    blocks and 1 state block, so 16 of them fit in 64 usable blocks, none preempted."""
    config = RandKVConfig(budget=64, buffer_size=16)
    harness = make_harness(
        model, config, num_blocks=65, block_size=32, max_num_seqs=64,
        max_num_batched_tokens=2048, state=True,
    )  # fmt: skip
    for index in range(32):
        harness.add(32, 200, prompt_start=1000 + 50 * index)
    assert _run_counting(harness) == (64 // 4, 0)
    assert harness.free_blocks() == 64 and len(harness.finished) == 32


def test_footprint_admission_reserves_a_window_at_its_decode_size(model):
    """A mixed model under footprint admission: each request reserves 3 full-attention
    blocks and, in the 32-token window group, the 3 blocks a decoding request holds at most
    (the window and a step; not vLLM's bound for a 2048-token prefill chunk), so 10 run at
    once in 64 usable blocks and none is preempted."""
    config = RandKVConfig(budget=64, buffer_size=16)
    harness = make_harness(
        model, config, num_blocks=65, block_size=32, max_num_seqs=64,
        max_num_batched_tokens=2048, window=32,
    )  # fmt: skip
    for index in range(32):
        harness.add(32, 200, prompt_start=1000 + 50 * index)
    assert _run_counting(harness) == (64 // 6, 0)
    assert harness.free_blocks() == 64 and len(harness.finished) == 32


def test_a_prompt_over_the_budget_finishes_alone_with_an_error(model):
    harness = make_harness(model, CONFIG, num_blocks=40, block_size=BLOCK)
    too_long = harness.add(CONFIG.budget + 1, 10)
    fine = harness.add(10, 10, prompt_start=5000)
    harness.run()
    refused = harness.finished[too_long.request_id]
    assert str(refused.finish_reason) in ("FinishReason.ERROR", "error")
    assert "exceeds the RandKV budget K=64" in str(refused.stop_reason)
    assert harness.scheduler.counters["rejected_prompts"] == 1
    assert harness.finished[fine.request_id].finish_reason is not None
    assert too_long.request_id not in harness.scheduler.request_rounds
    assert harness.free_blocks() == 40 - 1


def test_a_request_s_own_budget_sets_its_rounds(model):
    harness = make_harness(
        model, RandKVConfig(budget=64, buffer_size=32, max_request_budget=128), num_blocks=60
    )
    own = harness.add(20, 250, extra_args={"randkv_budget": 128})
    server = harness.add(20, 250, prompt_start=5000)
    harness.run()
    assert [d.budget for _, d in _directives(harness, own.request_id)] == [128, 128, 128]
    own_starts = [
        harness.steps[i].scheduled_cached_reqs.num_computed_tokens[
            harness.steps[i].scheduled_cached_reqs.req_ids.index(own.request_id)
        ]
        for i, _ in _directives(harness, own.request_id)
    ]
    assert own_starts == [192, 224, 256]  # K=128: K + 2r = 192
    assert len(_directives(harness, server.request_id)) == 5  # 128, 160, 192, 224, 256


def test_prefix_caching_shares_whole_prompt_blocks_only(model):
    """A follow-up turn (the prompt, then the answer's first tokens) hits the prompt's whole
    blocks only: compaction rewrites slots past the prompt. Plain vLLM also shares the
    block holding prompt and answer tokens."""
    prompt = list(range(300, 340))  # 40 tokens: two whole blocks and a partial one
    follow_up = prompt + [TOKEN] * 24  # what the first request generated: 64 tokens
    hits = {}
    for name, config in (("randkv", CONFIG), ("plain", None)):
        harness = make_harness(
            model, config, num_blocks=60, block_size=BLOCK, enable_prefix_caching=True
        )
        harness.add(prompt, 150)
        cold = harness.step().scheduled_new_reqs[0]
        harness.run()  # 189 tokens seen: two rounds compacted the slots past the prompt
        harness.add(follow_up, 20)
        hits[name] = harness.step().scheduled_new_reqs[0].num_computed_tokens
        harness.run()
        assert cold.num_computed_tokens == 0
        assert harness.free_blocks() == 60 - 1
    assert hits == {"randkv": 32, "plain": 48}


def _run_counting(harness) -> tuple[int, int]:
    """Run to the end; (the most requests running at once, preemptions)."""
    most = 0
    while harness.scheduler.has_requests():
        harness.step()
        most = max(most, len(harness.scheduler.running))
    return most, harness.scheduler.counters["preemptions"]


def test_admission_at_the_footprint_never_preempts_for_foreseeable_growth(model):
    """The issue's workload, shortened: 32 requests into 64 usable blocks of 32 tokens, K=64,
    r=16: each request's footprint is the 3 blocks of K + 2r = 96 tokens, so 21 run at once
    and none is preempted; vLLM's admission runs them all, then preempts."""
    config = RandKVConfig(budget=64, buffer_size=16)
    runs = {}
    for admission in ("footprint", "vllm"):
        harness = make_harness(
            model,
            dataclasses.replace(config, admission=admission),
            num_blocks=65,
            block_size=32,
            max_num_seqs=64,
            max_num_batched_tokens=2048,
        )
        for index in range(32):
            harness.add(32, 200, prompt_start=1000 + 50 * index)
        runs[admission] = _run_counting(harness)
        assert harness.free_blocks() == 64 and len(harness.finished) == 32
    assert runs["footprint"] == (64 // 3, 0)
    most, preemptions = runs["vllm"]
    assert most == 32 and preemptions > 0


def test_a_request_that_ends_before_k_plus_2r_reserves_only_its_length(model):
    """max_tokens 20 on 32-token prompts: 52 tokens, 2 blocks of 32 each, so 32 fit."""
    harness = make_harness(
        model, RandKVConfig(budget=64, buffer_size=16), num_blocks=65, block_size=32,
        max_num_seqs=64, max_num_batched_tokens=2048,
    )  # fmt: skip
    for index in range(40):
        harness.add(32, 20, prompt_start=1000 + 50 * index)
    assert _run_counting(harness) == (32, 0)
