"""The torch planner and compactor against the pure-Python spec and naive references."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from randkv import RandKVConfig, num_rounds, slot_positions, spec
from randkv.kernels.compactor import KVLayout, PagedCompactor
from randkv.kernels.planner import RoundPlanner, plan_round, to_key_tensor
from randkv.kernels.reference import reference_compact
from randkv.kernels.slotmap import SlotPositionMap
from randkv.spec.rounds import RoundPlan


@st.composite
def batches(draw):
    config = RandKVConfig(
        budget=draw(st.integers(1, 80)),
        buffer_size=draw(st.integers(1, 16)),
        seed=draw(st.integers(0, 2**64 - 1)),
    )
    size = draw(st.integers(1, 5))
    prompts = draw(st.lists(st.integers(0, config.budget), min_size=size, max_size=size))
    keys = draw(st.lists(st.integers(0, 2**64 - 1), min_size=size, max_size=size))
    rounds = draw(st.lists(st.integers(0, 2**40), min_size=size, max_size=size))
    layers = draw(st.lists(st.integers(0, 200), min_size=1, max_size=4, unique=True))
    heads = draw(st.lists(st.integers(0, 64), min_size=1, max_size=4, unique=True))
    return config, prompts, keys, rounds, layers, heads


@given(batches())
@settings(max_examples=150, deadline=None)
def test_planner_is_bit_identical_to_the_spec(batch):
    config, prompts, keys, rounds, layers, heads = batch
    plan = plan_round(
        config,
        prompt_lengths=prompts,
        request_keys=keys,
        round_indices=rounds,
        layers=layers,
        kv_heads=heads,
    )
    assert plan.evicted.shape == (len(prompts), len(layers), len(heads), config.buffer_size)
    for b, (prompt, key, round_index) in enumerate(zip(prompts, keys, rounds, strict=True)):
        for li, layer in enumerate(layers):
            for hi, head in enumerate(heads):
                expected = spec.evicted_slots(
                    config,
                    prompt_length=prompt,
                    request_key=key,
                    round_index=round_index,
                    layer=layer,
                    kv_head=head,
                )
                assert tuple(plan.evicted[b, li, hi].tolist()) == expected
    assert plan.sources.tolist() == list(spec.source_slots(config))
    # Keys as an int64 tensor take the all-tensor hashing path: same plan.
    tensor_path = RoundPlanner(config, layers, heads).plan(prompts, to_key_tensor(keys), rounds)
    assert torch.equal(tensor_path.evicted, plan.evicted)


def test_planner_handles_streams_that_need_many_draws():
    # n == r: every candidate goes, which takes a coupon collector's worth of draws.
    config = RandKVConfig(budget=100, buffer_size=40)
    plan = plan_round(
        config,
        prompt_lengths=[100, 99],
        request_keys=[3, 4],
        round_indices=[0, 1],
        layers=[0],
        kv_heads=[0, 1],
    )
    assert sorted(plan.evicted[0, 0, 0].tolist()) == list(range(100, 140))
    assert tuple(plan.evicted[1, 0, 1].tolist()) == spec.evicted_slots(
        config, prompt_length=99, request_key=4, round_index=1, layer=0, kv_head=1
    )


def test_tensor_parallel_split_gives_the_same_plan():
    config = RandKVConfig(budget=64, buffer_size=8, seed=1)
    args = {"prompt_lengths": [5, 20], "request_keys": [9, 2**64 - 1], "round_indices": [0, 3]}
    whole = RoundPlanner(config, range(4), range(8)).plan(**args).evicted
    rank0 = RoundPlanner(config, range(4), range(0, 4)).plan(**args).evicted
    rank1 = RoundPlanner(config, range(4), range(4, 8)).plan(**args).evicted
    stage1 = RoundPlanner(config, range(2, 4), range(8)).plan(**args).evicted
    assert torch.equal(torch.cat([rank0, rank1], dim=2), whole)
    assert torch.equal(stage1, whole[:, 2:4])


def test_planner_rejects_prompts_over_budget():
    config = RandKVConfig(budget=16, buffer_size=4)
    with pytest.raises(ValueError, match="prompt of 17 tokens exceeds the RandKV budget K=16"):
        plan_round(
            config,
            prompt_lengths=[3, 17],
            request_keys=[1, 2],
            round_indices=[0, 0],
            layers=[0],
            kv_heads=[0],
        )


def _make_cache(layout, num_blocks, heads, block_size, head_dim, generator, stride_order=None):
    if layout is KVLayout.BLOCK_HEAD_SLOT:
        shape = (num_blocks, heads, block_size, 2 * head_dim)
        if stride_order == "NHD":
            base = torch.randn(num_blocks, block_size, heads, 2 * head_dim, generator=generator)
            return base.permute(0, 2, 1, 3)
        return torch.randn(shape, generator=generator)
    return torch.randn(2, num_blocks, block_size, heads, head_dim, generator=generator)


@given(
    layout=st.sampled_from([KVLayout.BLOCK_HEAD_SLOT, KVLayout.KV_BLOCK_SLOT_HEAD]),
    stride_order=st.sampled_from(["HND", "NHD"]),
    block_size=st.sampled_from([1, 3, 16]),
    budget=st.integers(1, 40),
    buffer_size=st.integers(1, 9),
    batch=st.integers(1, 3),
    heads=st.integers(1, 3),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=60, deadline=None)
def test_compactor_equals_elementwise_reference(
    layout, stride_order, block_size, budget, buffer_size, batch, heads, seed
):
    config = RandKVConfig(budget=budget, buffer_size=buffer_size, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    blocks_per_request = -(-config.max_physical_length // block_size)
    num_blocks = batch * blocks_per_request + 5
    # Non-contiguous, shuffled block ids; unused blocks stay poisoned with their values.
    block_ids = torch.randperm(num_blocks, generator=generator)[: batch * blocks_per_request]
    block_tables = block_ids.view(batch, blocks_per_request)
    prompts = torch.randint(0, budget + 1, (batch,), generator=generator).tolist()
    plan = plan_round(
        config,
        prompt_lengths=prompts,
        request_keys=list(range(batch)),
        round_indices=[seed % 7] * batch,
        layers=[0, 1],
        kv_heads=list(range(heads)),
    )
    caches = [
        _make_cache(layout, num_blocks, heads, block_size, 4, generator, stride_order)
        for _ in range(2)
    ]
    expected = [c.clone() for c in caches]
    reference_compact(layout, plan, expected, block_tables)
    PagedCompactor(layout, block_size).apply(plan, caches, block_tables)
    for got, want in zip(caches, expected, strict=True):
        assert torch.equal(got, want)  # untouched slots kept their random values too


def test_compaction_rounds_reproduce_the_spec_slot_layout():
    """Run several rounds on a paged cache whose values are positions; compare to spec."""
    config = RandKVConfig(budget=21, buffer_size=5, seed=4)
    prompt, key, heads, layers, block_size = 6, 77, 2, 2, 4
    blocks = -(-config.max_physical_length // block_size)
    block_table = torch.tensor([list(range(2 * blocks, 3 * blocks))[::-1]])
    caches = [torch.full((3 * blocks, heads, block_size, 2), -1.0) for _ in range(layers)]
    planner = RoundPlanner(config, range(layers), range(heads))
    compactor = PagedCompactor(KVLayout.BLOCK_HEAD_SLOT, block_size)
    tracker = SlotPositionMap(config, layers, heads)
    length = 0
    for position in range(200):
        block, offset = int(block_table[0, length // block_size]), length % block_size
        for cache in caches:
            cache[block, :, offset] = float(position)
        tracker.append(1)
        length += 1
        if length == config.max_physical_length:
            round_index = num_rounds(config, prompt_length=prompt, tokens_seen=position + 1) - 1
            plan = planner.plan([prompt], [key], [round_index])
            compactor.apply(plan, caches, block_table)
            tracker.apply_round(plan.evicted[0], plan.sources)
            length = config.compacted_length
        for layer in range(layers):
            for head in range(heads):
                want = slot_positions(
                    config,
                    prompt_length=prompt,
                    tokens_seen=position + 1,
                    request_key=key,
                    layer=layer,
                    kv_head=head,
                )
                slots = torch.arange(length)
                got = caches[layer][
                    block_table[0, slots // block_size], head, slots % block_size, 0
                ]
                assert tuple(int(v) for v in got.tolist()) == want
                assert tracker.slot_positions(layer, head) == want


def test_cpu_vec_layout_compaction_matches_per_token_reference():
    """vLLM CPU `vec` layout: K column-major then V row-major inside each (block, head)."""
    from randkv.kernels.compactor import cpu_vec_token_elements

    config = RandKVConfig(budget=20, buffer_size=3, seed=8)
    block_size, head_dim, heads = 4, 5, 2
    blocks = -(-config.max_physical_length // block_size)
    generator = torch.Generator().manual_seed(3)
    block_table = torch.randperm(blocks + 4, generator=generator)[:blocks][None, :]
    caches = [torch.randn(blocks + 4, heads, block_size, 2 * head_dim, generator=generator)]
    plan = plan_round(
        config, prompt_lengths=[5], request_keys=[1], round_indices=[2], layers=[0], kv_heads=[0, 1]
    )

    def token(cache, slot, head):  # the token's K and V, read straight from the layout rules
        chunk = cache[int(block_table[0, slot // block_size]), head].reshape(-1)
        t = slot % block_size
        keys = chunk[: block_size * head_dim].view(head_dim, block_size)[:, t]
        values = chunk[block_size * head_dim :].view(block_size, head_dim)[t]
        return torch.cat((keys, values))

    before = caches[0].clone()
    PagedCompactor(KVLayout.VLLM_CPU_VEC, block_size).apply(plan, caches, block_table)
    moved = set()
    for head in range(heads):
        for i, hole in enumerate(plan.evicted[0, 0, head].tolist()):
            source = int(plan.sources[i])
            assert torch.equal(token(caches[0], hole, head), token(before, source, head))
            moved.add((hole, head))
    for head in range(heads):
        for slot in range(blocks * block_size):
            if (slot, head) not in moved:
                assert torch.equal(token(caches[0], slot, head), token(before, slot, head))
    assert (
        cpu_vec_token_elements(block_size, head_dim).unique().numel() == 2 * block_size * head_dim
    )


# --------------------------------------------------------------------------- host syncs


def test_plan_and_apply_make_no_host_sync():
    """Python-int inputs and a host block table: nothing is read back from tensors."""
    from randkv.kernels.hostsync import count_host_syncs

    config = RandKVConfig(budget=40, buffer_size=6, seed=5)
    block_size, heads, layers = 4, 2, 3
    blocks = -(-config.max_physical_length // block_size)
    block_tables = torch.arange(2 * blocks).view(2, blocks)
    planner = RoundPlanner(config, range(layers), range(heads))
    layouts = {
        KVLayout.BLOCK_HEAD_SLOT: lambda: torch.randn(2 * blocks, heads, block_size, 8),
        KVLayout.KV_BLOCK_SLOT_HEAD: lambda: torch.randn(2, 2 * blocks, block_size, heads, 4),
        KVLayout.VLLM_CPU_VEC: lambda: torch.randn(2 * blocks, heads, block_size, 8),
    }
    with count_host_syncs() as syncs:
        # Prompt lengths that need different draw counts take the reordering path too.
        plan = planner.plan([config.budget, 3], [2**64 - 1, 0], [0, 2**40])
        keyed = planner.plan([3, 9], to_key_tensor([7, 2**63]), [1, 2])
        for layout, make in layouts.items():
            PagedCompactor(layout, block_size).apply(
                plan, [make() for _ in range(layers)], block_tables
            )
    assert syncs.total == 0, dict(syncs.counts)
    assert tuple(keyed.evicted[1, 2, 1].tolist()) == spec.evicted_slots(
        config, prompt_length=9, request_key=2**63, round_index=2, layer=2, kv_head=1
    )


def test_planner_matches_spec_with_tiny_chunks_and_mixed_prompts():
    """One row per chunk, prompts of exactly K (n == r) mixed with short ones: same plan."""
    config = RandKVConfig(budget=24, buffer_size=6, seed=2**64 - 1)
    prompts, keys, rounds = [24, 0, 24, 17, 1], [0, 2**63, 2**64 - 1, 5, 6], [0, 2**31 + 3, 7, 1, 0]
    plan = RoundPlanner(config, [0, 3], [1, 2], scratch_bytes=1).plan(prompts, keys, rounds)
    whole = RoundPlanner(config, [0, 3], [1, 2]).plan(prompts, keys, rounds)
    assert torch.equal(plan.evicted, whole.evicted)
    for b, (prompt, key, index) in enumerate(zip(prompts, keys, rounds, strict=True)):
        for li, layer in enumerate([0, 3]):
            for hi, head in enumerate([1, 2]):
                assert tuple(plan.evicted[b, li, hi].tolist()) == spec.evicted_slots(
                    config,
                    prompt_length=prompt,
                    request_key=key,
                    round_index=index,
                    layer=layer,
                    kv_head=head,
                )


def test_safe_draw_counts_cover_the_spec():
    """Draw counts are even, >= r, shrink as collisions get rarer, exceed what streams need."""
    from randkv.kernels.planner import _draw_bucket, _safe_draws

    def draws(n, r):
        return _safe_draws(*_draw_bucket(n, r), r)

    for r in (1, 2, 7, 64):
        counts = [draws(n, r) for n in (r, r + 1, 2 * r, 300, 5000, 2**31 - 1)]
        assert all(c % 2 == 0 and c >= r for c in counts)
        if r > 2:  # collisions dominate rejections here
            assert counts[:4] == sorted(counts[:4], reverse=True)
    # n == r is the coupon collector, the worst case: count the spec's draws directly.
    n = r = 6
    needed = 0
    for stream in range(3000):
        picks, counter = set(), 0
        while len(picks) < r:
            value = spec.bounded(spec.draw32(stream, counter), n)
            counter += 1
            if value is not None:
                picks.add(value)
        needed = max(needed, counter)
    assert needed < draws(n, r) // 2


@pytest.mark.parametrize(
    "layout", [KVLayout.BLOCK_HEAD_SLOT, KVLayout.KV_BLOCK_SLOT_HEAD, KVLayout.VLLM_CPU_VEC]
)
def test_compactor_refuses_kernel_blocks_smaller_than_allocation_blocks(layout):
    """vLLM split each allocation block of 16 into kernel blocks of 8: refuse, say why."""
    config = RandKVConfig(budget=16, buffer_size=4)
    plan = plan_round(
        config, prompt_lengths=[2], request_keys=[1], round_indices=[0], layers=[0], kv_heads=[0]
    )
    if layout is KVLayout.KV_BLOCK_SLOT_HEAD:
        cache = torch.zeros(2, 8, 8, 1, 4)
    else:
        cache = torch.zeros(8, 1, 8, 8)
    with pytest.raises(ValueError, match=r"holds 8 slots per block .* block size is 16"):
        PagedCompactor(layout, 16).apply(plan, [cache], torch.zeros(1, 2, dtype=torch.int64))


def test_compactor_refuses_caches_with_other_heads_or_dtypes():
    config = RandKVConfig(budget=16, buffer_size=4)
    plan = plan_round(
        config, prompt_lengths=[2], request_keys=[1], round_indices=[0], layers=[0, 1], kv_heads=[0]
    )
    compactor = PagedCompactor(KVLayout.BLOCK_HEAD_SLOT, 8)
    tables = torch.zeros(1, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="plan covers 1 KV heads, the KV caches hold 2"):
        compactor.apply(plan, [torch.zeros(4, 2, 8, 8)] * 2, tables)
    with pytest.raises(ValueError, match="dtype"):
        compactor.apply(plan, [torch.zeros(4, 1, 8, 8), torch.zeros(4, 1, 8, 8).half()], tables)


@given(
    st.integers(1, 40),
    st.integers(1, 8),
    st.integers(1, 16),
    st.lists(st.integers(0, 90), min_size=1, max_size=5),
    st.lists(st.integers(0, 2**64 - 1), min_size=5, max_size=5),
)
@settings(max_examples=80, deadline=None)
def test_requests_with_their_own_budgets_plan_as_the_spec_says(budget, r, g, prompts, keys):
    """Long prompts under min_generated, in one batch with short ones: each row is planned
    with its own K, and its moves take the tokens from its own slots [K + r, K + 2r)."""
    config = RandKVConfig(budget=budget, buffer_size=r, min_generated=g)
    keys = keys[: len(prompts)]
    layers, heads = [0, 7], [2]
    plan = RoundPlanner(config, layers, heads).plan(prompts, keys, [3] * len(prompts))
    for b, (prompt, key) in enumerate(zip(prompts, keys, strict=True)):
        own = config.for_request(prompt)
        assert plan.row_sources(b).tolist() == list(spec.source_slots(own))
        for li, layer in enumerate(layers):
            expected = spec.evicted_slots(
                config, prompt_length=prompt, request_key=key, round_index=3, layer=layer,
                kv_head=2,
            )  # fmt: skip
            assert tuple(plan.evicted[b, li, 0].tolist()) == expected


def test_per_request_sources_compact_each_request_in_its_own_slots():
    """Two requests with different K in one compactor call, against per-token moves."""
    r, block = 2, 4
    budgets = [6, 10]  # K + 2r = 10 and 14 slots
    evicted = torch.tensor([[[[2, 5]]], [[[3, 9]]]])  # (B, L=1, H=1, r)
    plan = RoundPlan.of(RandKVConfig(budget=6, buffer_size=r), evicted, budgets)
    assert plan.sources.tolist() == [[8, 9], [12, 13]]
    cache = torch.arange(6 * 1 * block * 3, dtype=torch.float32).reshape(6, 1, block, 3)
    tables = torch.tensor([[0, 1, 2, 5], [3, 4, 5, 2]])
    expected = cache.clone()
    for b in range(2):
        for hole, source in zip(evicted[b, 0, 0].tolist(), plan.sources[b].tolist(), strict=True):
            src = cache[tables[b, source // block], 0, source % block].clone()
            expected[tables[b, hole // block], 0, hole % block] = src
    PagedCompactor(KVLayout.BLOCK_HEAD_SLOT, block).apply(plan, [cache], tables)
    assert torch.equal(cache, expected)


def test_a_slot_map_rolls_back_rejected_drafts_but_never_across_a_round():
    """Speculative decoding: the newest tokens of a step may be rejected and rolled back;
    a start before the last round is a replay after preemption, which starts a new map."""
    import torch

    from randkv.kernels.slotmap import SlotPositionMap

    config = RandKVConfig(budget=8, buffer_size=2)  # a round at 12 tokens
    slot_map = SlotPositionMap(config, 1, 1)
    slot_map.append(10)
    assert slot_map.roll_back(8) and slot_map.slot_positions(0, 0) == tuple(range(8))
    slot_map.append(4)
    evicted = torch.tensor([[[3, 5]]])
    slot_map.apply_round(evicted, torch.tensor([10, 11]))
    kept = slot_map.slot_positions(0, 0)
    slot_map.append(1)
    assert not slot_map.roll_back(11)  # before the round: refused, nothing changed
    assert slot_map.slot_positions(0, 0) == (*kept, 12)
    assert slot_map.roll_back(12) and slot_map.slot_positions(0, 0) == kept
